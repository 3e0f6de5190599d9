"""Which waiting job starts next: fair share across API keys, then priorities with aging within a key.

The policy, over the jobs waiting for one lane of workers (a model's Celery workers, or the
embedded worker thread):

1. A job given back by a worker that died (or by an outage) goes first, oldest first: it
   was at the head when it started, and keeps that place. Its key was charged then, not again.
2. Otherwise the key that has started the fewest jobs recently, each start counted `1 / share`
   (deficit round robin over keys), starts its own next job: its highest effective priority
   (a job's priority, one level higher once it has waited `aging_seconds`, so within a key
   `low` is never starved by `normal`), oldest first.
3. Between keys level on starts, the one whose next job has the higher effective priority
   goes first, then the older job. This is all `high` (or aging) does across keys: a tie
   between keys equally owed. A key idle until now stands level with the least served, so
   its `high` job starts next; a key's backlog of `high` jobs gets its share, no more.

Fair share counts started jobs, not seconds: the count is known the moment a job is
claimed, so it is charged in the same atomic step (the Redis claim script), and a worker
killed mid-job cannot leave it uncharged; seconds would be charged only when a job ends.
Jobs on one lane run one model, so a job is a fair unit of its time.

"Recently": each key's count is held no lower than the lane's `clock`, the count of the key
chosen last. A key that was idle for an hour does not come back owed an hour of starts:
it rejoins level with the keys that are waiting, and its next job goes within one round.
Without keys every job is one key's, and the order is priority with aging, then oldest first.

The guarantee, whatever the other keys queue and at whatever priority: a job of key B that
is the n-th of B's own jobs to start from the moment it was queued waits for at most
`floor(n * share_k / share_B) + 1` starts of each other key k (with equal shares, `n + 1`
each), plus jobs given back by lost workers. Why: a key is chosen only while its count is
at most B's; the clock never passes B's count while B waits, so B's count moves only by
its own starts, `1 / share_B` each, and is at most `clock + n / share_B` when its n-th job
starts; every other key's count starts at the clock or above and grows `1 / share_k` a
start. Priorities and aging only choose among keys level on counts, so they cannot lift a
backlog past the bound. `tests/test_scheduling.py` checks the bound on random lanes, for
this policy and the Lua claim.

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
    retry: bool = False  # given back by its worker: goes first

    @classmethod
    def of(cls, job: Job) -> "Entry":
        return cls(id=job.id, key=job.owner or "", level=level(job.params.priority), queued_at=job.created_at,
                   share=job.share, retry=job.attempts > 0)


@dataclass
class Fairness:
    """Starts per key (each divided by the key's share), and the lane's clock (see above)."""

    served: dict[str, float] = field(default_factory=dict)
    clock: float = 0.0

    def count(self, key: str) -> float:
        """The key's starts, each `1 / share`, held no lower than the clock: the lower, the sooner its turn."""
        return max(self.served.get(key, 0.0), self.clock)

    def charge(self, entry: Entry) -> None:
        if entry.retry:  # charged when it first started; charging again could move the clock past a waiting key
            return
        self.clock = self.count(entry.key)
        self.served[entry.key] = self.clock + 1.0 / entry.share

    def copy(self) -> "Fairness":
        return Fairness(dict(self.served), self.clock)


def effective_level(entry: Entry, now: float, aging_seconds: float) -> int:
    # Written as the Lua script compares, so both round alike.
    aged = entry.queued_at <= now - aging_seconds
    return min(entry.level + 1, HIGHEST) if aged else entry.level


def next_entry(entries: list[Entry], fairness: Fairness, now: float, aging_seconds: float) -> Entry | None:
    """The entry to start next, or None when nothing waits. Charges nothing."""
    retries = [entry for entry in entries if entry.retry]
    if retries:
        return min(retries, key=lambda e: (e.queued_at, e.id))
    # One minimum over every entry: the least served keys, then the highest effective priority, then the oldest.
    # Among one key's entries the count is the same, so this is also the key's own order.
    return min(entries, default=None,
               key=lambda e: (fairness.count(e.key), -effective_level(e, now, aging_seconds), e.queued_at, e.id))


def start_order(entries: list[Entry], fairness: Fairness, now: float, aging_seconds: float) -> list[Entry]:
    """Every entry in the order they will start if nothing else arrives (the queue positions)."""
    waiting, fairness, order = list(entries), fairness.copy(), []
    while (chosen := next_entry(waiting, fairness, now, aging_seconds)) is not None:
        fairness.charge(chosen)
        waiting.remove(chosen)
        order.append(chosen)
    return order
