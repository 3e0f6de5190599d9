"""Where a waiting job stands: its place in line and when it should start.

The estimate plays the line forward on the lane's workers: each is free once its running job
has run the model's mean recent duration (at once, for one past it), and each job ahead takes
its model's mean in turn on whichever worker is free first. Without a recent duration for a
model on the way, there is no estimate.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

RECENT_JOBS = 10  # a model's completed jobs whose durations make its estimates


@dataclass(frozen=True)
class Standing:
    position: int  # 1: the next job to start on its workers
    estimated_start_at: float | None  # unix time; None without recent durations to go by


@dataclass(frozen=True)
class Running:
    model: str
    started_at: float


def mean_durations(recent: dict[str, Sequence[float]]) -> dict[str, float]:
    """Each model's mean job duration, from its recent ones."""
    return {model: fmean(seconds) for model, seconds in recent.items() if seconds}


def standings(order: list[tuple[str, str]], running: list[Running], durations: dict[str, float], workers: int,
              now: float) -> dict[str, Standing]:
    """job id -> Standing, for the (job id, model) pairs of `order`, in the order they will start,
    on `workers` workers running `running` now."""
    ends = [None if run.model not in durations else max(0.0, run.started_at + durations[run.model] - now)
            for run in running]
    ends += [0.0] * (workers - len(ends))
    free = None if None in ends or not ends else sorted(ends)  # a heap: when each worker is next free
    result = {}
    for position, (job_id, model) in enumerate(order, 1):
        if free is None or model not in durations:
            free = None  # one job whose length is unknown hides every start behind it
            result[job_id] = Standing(position, None)
            continue
        start = heapq.heappop(free)
        heapq.heappush(free, start + durations[model])
        result[job_id] = Standing(position, now + start)
    return result
