"""Which waiting job starts next: priorities with aging, then fair share across API keys.

The policy, over the jobs waiting for one lane of workers (a model's Celery workers, or the
embedded worker thread):

1. Effective priority: a job's priority, one level higher once it has waited
   `aging_seconds` (so `low` is never starved). Only the highest effective level present
   is considered.
2. A job given back by a worker that died (or by an outage) goes first in its level, oldest
   first: it was at the head when it started, and keeps that place.
3. Otherwise the key that has started the fewest jobs recently, weighted by its `share`,
   starts its oldest job (deficit round robin over keys; ties go to the oldest job).

Fair share counts started jobs, not seconds: the count is known the moment a job is
claimed, so it is charged in the same atomic step (the Redis claim script), and a worker
killed mid-job cannot leave it uncharged; seconds would be charged only when a job ends.
Jobs on one lane run one model, so a job is a fair unit of its time.

"Recently": each key's count is held no lower than the lane's `clock`, the count of the key
chosen last. A key that was idle for an hour does not come back owed an hour of starts:
it rejoins level with the keys that are waiting, and its next job goes within one round.
Without keys every job is one key's, and the order is oldest first.

`workers/redis_claim.py` runs this same policy in Lua; tests/test_scheduling.py checks that
both pick the same jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vidserve.jobs import Job
from vidserve.priorities import HIGHEST, level


@dataclass(frozen=True)
class Entry:
    """A waiting job as the scheduler sees it."""

    id: str
    key: str  # its owner's key name ("" on a server without keys)
    level: int  # its priority's level
    queued_at: float  # its creation: the age that orders and ages it
    share: float = 1.0
    retry: bool = False  # given back by its worker: goes first in its level

    @classmethod
    def of(cls, job: Job) -> "Entry":
        return cls(id=job.id, key=job.owner or "", level=level(job.params.priority), queued_at=job.created_at,
                   share=job.share, retry=job.attempts > 0)


@dataclass
class Fairness:
    """Starts per key (each divided by the key's share), and the lane's clock (see above)."""

    served: dict[str, float] = field(default_factory=dict)
    clock: float = 0.0

    def standing(self, key: str) -> float:
        return max(self.served.get(key, 0.0), self.clock)

    def charge(self, entry: Entry) -> None:
        self.clock = self.standing(entry.key)
        self.served[entry.key] = self.clock + 1.0 / entry.share

    def copy(self) -> "Fairness":
        return Fairness(dict(self.served), self.clock)


def effective_level(entry: Entry, now: float, aging_seconds: float) -> int:
    # Written as the Lua script's ZRANGEBYSCORE bound is, so both round alike.
    aged = entry.queued_at <= now - aging_seconds
    return min(entry.level + 1, HIGHEST) if aged else entry.level


def next_entry(entries: list[Entry], fairness: Fairness, now: float, aging_seconds: float) -> Entry | None:
    """The entry to start next, or None when nothing waits. Charges nothing."""
    if not entries:
        return None
    levels = {entry.id: effective_level(entry, now, aging_seconds) for entry in entries}
    top = max(levels.values())
    candidates = [entry for entry in entries if levels[entry.id] == top]
    retries = [entry for entry in candidates if entry.retry]
    if retries:
        return min(retries, key=lambda e: (e.queued_at, e.id))
    # The least served key's oldest job: the minimum over every candidate of (its key's standing, its age).
    return min(candidates, key=lambda e: (fairness.standing(e.key), e.queued_at, e.id))


def start_order(entries: list[Entry], fairness: Fairness, now: float, aging_seconds: float) -> list[Entry]:
    """Every entry in the order they will start if nothing else arrives (the queue positions)."""
    waiting, fairness, order = list(entries), fairness.copy(), []
    while (chosen := next_entry(waiting, fairness, now, aging_seconds)) is not None:
        fairness.charge(chosen)
        waiting.remove(chosen)
        order.append(chosen)
    return order
