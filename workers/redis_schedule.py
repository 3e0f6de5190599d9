"""The Celery lanes' schedule, kept in Redis beside the jobs, so that every API process and
worker sees one order. A Celery message only wakes a worker of the model; the worker then
claims whichever job the policy (`workers/fair_share.py`) says is next (`workers/redis_claim.py`).

Keys, per model (a lane: that model's workers), under the job store's prefix:
    {prefix}:sched:{model}:{priority}   sorted set of its waiting job ids, scored by creation
    {prefix}:sched:{model}:entries      hash: id -> {"key", "share", "retry"} (the rest of a fair_share.Entry)
    {prefix}:sched:{model}:served       hash: key name -> its starts, each divided by its share
    {prefix}:sched:{model}:clock        the starts of the key chosen last (fair_share.Fairness)
    {prefix}:sched:{model}:durations    list of its last completed jobs' run seconds, newest first
They live in the Redis of the jobs, with its append-only file: a restart keeps the schedule.
An entry is added after its job is stored, so a process killed in between leaves a queued
job the lease reaper puts back (`add` says whether it was missing).
"""

from __future__ import annotations

import json
import time

import redis

from vidserve.jobs import Job, JobStatus
from vidserve.jobs.place_in_line import (RECENT_JOBS, InLine, PlaceInLine, Running, mean_durations,
                                         places_in_line)
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.priorities import PRIORITIES

from .fair_share import Entry, Fairness, start_order
from .redis_claim import CLAIM_NEXT


class RedisSchedule:
    def __init__(self, store: RedisJobStore, aging_seconds: float):
        self.store = store
        self.redis = redis.Redis.from_url(store.url, decode_responses=True)
        self.prefix, self.aging_seconds = store.prefix, aging_seconds
        self.queued_key = store.status_key(JobStatus.queued)
        self._claim = self.redis.register_script(CLAIM_NEXT)

    def _key(self, model: str, part: str) -> str:
        return f"{self.prefix}:sched:{model}:{part}"

    def _levels(self, model: str) -> list[str]:
        return [self._key(model, priority) for priority in PRIORITIES]

    def add(self, job: Job) -> bool:
        """Schedule a queued job (again: its entry is refreshed, its place kept); whether it was missing."""
        entry = Entry.of(job)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.zadd(self._levels(job.model)[entry.level], {job.id: entry.queued_at}, nx=True)
            pipe.hset(self._key(job.model, "entries"), job.id,
                      json.dumps({"key": entry.key, "share": entry.share, "retry": entry.retry}))
            added, _ = pipe.execute()
        return bool(added)

    def claim(self, model: str) -> str | None:
        """The next job of `model` to run, taken off the schedule and charged to its key."""
        keys = [*self._levels(model), *(self._key(model, part) for part in ("entries", "served", "clock")),
                self.queued_key]
        return self._claim(keys=keys, args=[repr(time.time()), repr(self.aging_seconds)])

    def record_duration(self, model: str, seconds: float) -> None:
        key = self._key(model, "durations")
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, repr(seconds))
            pipe.ltrim(key, 0, RECENT_JOBS - 1)
            pipe.execute()

    def places_in_line(self, model: str, queued: list[str], running: list[Running],
                       workers: int) -> dict[str, PlaceInLine]:
        """The place in line and estimated start of each of `model`'s `queued` jobs (ids, oldest first).
        One not in the schedule was claimed a moment ago and is starting: it stands first."""
        with self.redis.pipeline(transaction=True) as pipe:
            for level in self._levels(model):
                pipe.zrange(level, 0, -1, withscores=True)
            for part in ("entries", "served"):
                pipe.hgetall(self._key(model, part))
            pipe.get(self._key(model, "clock"))
            pipe.lrange(self._key(model, "durations"), 0, -1)
            *levels, entries, served, clock, durations = pipe.execute()
        waiting = [Entry(id=job_id, level=level, queued_at=score, **json.loads(entries[job_id]))
                   for level, members in enumerate(levels) for job_id, score in members
                   if job_id in queued]
        # Claimed a moment ago, not started yet: first in line. Its key is in the job, no longer in the schedule.
        starting = [job for job_id in queued if job_id not in entries and (job := self.store.get(job_id)) is not None]
        fairness = Fairness({key: float(value) for key, value in served.items()}, float(clock or 0))
        now = time.time()
        order = [*(InLine(job.id, model, job.owner or "") for job in starting),
                 *(InLine(entry.id, model, entry.key) for entry in start_order(waiting, fairness, now,
                                                                               self.aging_seconds))]
        means = mean_durations({model: [float(seconds) for seconds in durations]})
        return places_in_line(order, running, means, workers, now)
