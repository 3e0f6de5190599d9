"""A waiting job's place in line, and when it should start.

The estimate plays the line forward on the lane's workers: each is free once its running job
has run the model's mean recent duration (at once, for one past it), and each job ahead takes
its model's mean in turn on whichever worker is free first. Without a recent duration for a
model on the way, there is no estimate.

A job of an API key (a server with keys) is shown only what its key's own jobs say: its
place among its key's waiting jobs, and no estimate. The whole line, or how long the running
jobs have left, would tell one key how much another has queued and running; the fair-share
bound (`workers/fair_share.py`) is what bounds its wait instead.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

RECENT_JOBS = 10  # a model's completed jobs whose durations make its estimates


@dataclass(frozen=True)
class PlaceInLine:
    position: int  # 1: the next job to start on its workers (a key's job: the next of its key's jobs)
    estimated_start_at: float | None  # unix time; None without recent durations to go by


@dataclass(frozen=True)
class InLine:
    """A waiting job, in the order the line will start them."""

    id: str
    model: str
    key: str  # its owner's key name; "" on a server without keys


@dataclass(frozen=True)
class Running:
    model: str
    started_at: float


def mean_durations(recent: dict[str, Sequence[float]]) -> dict[str, float]:
    """Each model's mean job duration, from its recent ones."""
    return {model: fmean(seconds) for model, seconds in recent.items() if seconds}


def places_in_line(order: list[InLine], running: list[Running], durations: dict[str, float], workers: int,
              now: float) -> dict[str, PlaceInLine]:
    """job id -> PlaceInLine, for the jobs of `order`, in the order they will start, on `workers`
    workers running `running` now. A key's job stands among its key's jobs only (see above)."""
    ends = [None if run.model not in durations else max(0.0, run.started_at + durations[run.model] - now)
            for run in running]
    ends += [0.0] * (workers - len(ends))
    free = None if None in ends or not ends else sorted(ends)  # a heap: when each worker is next free
    result, ahead_of_key = {}, Counter()
    for position, job in enumerate(order, 1):
        if free is None or job.model not in durations:
            free = None  # one job whose length is unknown hides every start behind it
            estimate = None
        else:
            start = heapq.heappop(free)
            heapq.heappush(free, start + durations[job.model])
            estimate = now + start
        ahead_of_key[job.key] += 1
        result[job.id] = PlaceInLine(ahead_of_key[job.key], None) if job.key else PlaceInLine(position, estimate)
    return result
