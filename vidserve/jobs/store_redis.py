"""JobStore on Redis: the distributed store, for workers on several machines.

Keys, under `prefix`:
    {prefix}:job:{id}          the job's JSON
    {prefix}:jobs              sorted set of ids scored by creation sequence (for list)
    {prefix}:seq               counter that hands out those sequence numbers
    {prefix}:status:{status}   set of the ids in each status (for with_status)
    {prefix}:idem:{key}        idempotency key -> job id
    {prefix}:owner:{name}      sorted set of one API key's job ids, scored like `jobs`
    {prefix}:deliveries        hash of pending webhook deliveries, id -> JSON
    {prefix}:delivery_seq      counter that hands out delivery ids, in recording order
    {prefix}:lock:{name}       a lock's holder token, expiring with the lock (try_lock)
Every write of a job keeps its keys in step atomically: create (its limits checked in the same
step) and delete in one script or MULTI, update through WATCH/MULTI/EXEC so a concurrent change forces a retry.
The same step PUBLISHes on the job's channel, `{prefix}:changed:{id}` (`line` when the write moved
the queue's line: a create, a delete, a new status; `job` otherwise), which each process hears on
one pattern subscription (`subscribe`).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

import redis

from vidserve.jobs import (AdmissionLimits, Job, JobNotFound, JobStatus, JobStore, QuotaExceeded, WebhookDelivery,
                           check_page)
from vidserve.jobs.store import ChangeListener, JobChange

log = logging.getLogger("vidserve.jobs")

LINE_CHANGED, JOB_CHANGED = "line", "job"  # what a change message says

# Runs atomically on the server: no other create can come between the idempotency check and
# the insert (the key's GET, then SET, is a SET NX), nor between the counts the limits are
# checked on and the insert, and a job gets its sequence number in the same step that makes it
# visible, so listing never skips a job committed late. The owner's active jobs are counted over
# the queued and running ones (bounded by the queue's limit and the workers), not its history.
# KEYS: job, jobs, seq, status set, owner set ('' for none), queued set, in_progress set,
# idem ('' for none). ARGV: id, json, job-key prefix, max_queued (0: none), max_active (0: none),
# the job's change channel.
# Returns {1} stored, {0, existing json}, {2} id taken, {3, queued} or {4, the owner's active}: refused.
_CREATE = """
if KEYS[8] ~= '' then
    local existing = redis.call('GET', KEYS[8])
    if existing then return {0, redis.call('GET', ARGV[3] .. existing)} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {2} end
local max_queued, max_active = tonumber(ARGV[4]), tonumber(ARGV[5])
if max_queued > 0 then
    local queued = redis.call('SCARD', KEYS[6])
    if queued >= max_queued then return {3, queued} end
end
if max_active > 0 and KEYS[5] ~= '' then
    local active = 0
    for _, status in ipairs({KEYS[6], KEYS[7]}) do
        for _, id in ipairs(redis.call('SMEMBERS', status)) do
            if redis.call('ZSCORE', KEYS[5], id) then active = active + 1 end
        end
    end
    if active >= max_active then return {4, active} end
end
if KEYS[8] ~= '' then redis.call('SET', KEYS[8], ARGV[1]) end
redis.call('SET', KEYS[1], ARGV[2])
local seq = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], seq, ARGV[1])
if KEYS[5] ~= '' then redis.call('ZADD', KEYS[5], seq, ARGV[1]) end
redis.call('SADD', KEYS[4], ARGV[1])
redis.call('PUBLISH', ARGV[6], 'line')
return {1}
"""

# Deletes the lock only if the caller's token still holds it: after a lapse it may be another's.
_UNLOCK = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisJobStore(JobStore):
    def __init__(self, url: str, prefix: str = "vidserve"):
        self.url, self.prefix = url, prefix
        self._redis = redis.Redis.from_url(url, decode_responses=True)
        self._create = self._redis.register_script(_CREATE)
        self._unlock = self._redis.register_script(_UNLOCK)

    def _key(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    def _jobs_key(self, owner: str | None) -> str:
        return self._key("owner", owner) if owner is not None else self._key("jobs")

    def status_key(self, status: JobStatus) -> str:
        return self._key("status", JobStatus(status).value)

    def create(self, job: Job, limits: AdmissionLimits | None = None) -> tuple[Job, bool]:
        limits = limits or AdmissionLimits()
        keys = [self._key("job", job.id), self._key("jobs"), self._key("seq"), self.status_key(job.status),
                self._jobs_key(job.owner) if job.owner is not None else "",
                self.status_key(JobStatus.queued), self.status_key(JobStatus.in_progress),
                self._key("idem", job.idempotency_key) if job.idempotency_key is not None else ""]
        args = [job.id, job.model_dump_json(), self._key("job", ""), limits.max_queued or 0, limits.max_active or 0,
                self._channel(job.id)]
        outcome = self._create(keys=keys, args=args)
        if outcome[0] == 1:
            return job, True
        if outcome[0] == 0:
            return Job.model_validate_json(outcome[1]), False
        if outcome[0] == 3:
            raise QuotaExceeded("max_queued", outcome[1], limits.max_queued)
        if outcome[0] == 4:
            raise QuotaExceeded("max_active_jobs", outcome[1], limits.max_active)
        raise ValueError(f"job {job.id} already exists")

    def get(self, job_id: str) -> Job | None:
        raw = self._redis.get(self._key("job", job_id))
        return Job.model_validate_json(raw) if raw else None

    def update(self, job_id: str, change: Callable[[Job], None]) -> Job:
        key = self._key("job", job_id)

        def attempt(pipe: redis.client.Pipeline) -> Job:
            # Runs under WATCH: if the job changes before EXEC, redis-py runs this again on
            # the fresh record. If `change` raises, nothing has been queued, so nothing is written.
            raw = pipe.get(key)
            if raw is None:
                raise JobNotFound(job_id)
            job = Job.model_validate_json(raw)
            before = job.status
            change(job)
            pipe.multi()
            pipe.set(key, job.model_dump_json())
            if job.status != before:
                pipe.smove(self.status_key(before), self.status_key(job.status), job_id)
            pipe.publish(self._channel(job_id), LINE_CHANGED if job.status != before else JOB_CHANGED)
            return job

        return self._redis.transaction(attempt, key, value_from_callable=True)

    def delete(self, job_id: str) -> bool:
        key = self._key("job", job_id)

        def attempt(pipe: redis.client.Pipeline) -> bool:
            raw = pipe.get(key)
            if raw is None:
                return False
            job = Job.model_validate_json(raw)
            pipe.multi()
            pipe.delete(key)
            pipe.zrem(self._key("jobs"), job_id)
            if job.owner is not None:
                pipe.zrem(self._jobs_key(job.owner), job_id)
            pipe.srem(self.status_key(job.status), job_id)
            if job.idempotency_key is not None:
                # A stored job always owns its key (create refuses a taken one), so free it.
                pipe.delete(self._key("idem", job.idempotency_key))
            pipe.publish(self._channel(job_id), LINE_CHANGED)
            return True

        return self._redis.transaction(attempt, key, value_from_callable=True)

    def _channel(self, job_id: str) -> str:
        return self._key("changed", job_id)

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        subscriber = _ChangeSubscriber(self.url, self._channel(""), listener)
        return subscriber.close

    def line_moved(self, job_id: str) -> None:
        self._redis.publish(self._channel(job_id), LINE_CHANGED)

    def list(self, after: str | None = None, limit: int = 20, order: str = "desc",
             owner: str | None = None) -> tuple[list[Job], bool]:
        check_page(order, limit)
        desc = order == "desc"
        start = "+inf" if desc else "-inf"
        jobs = self._jobs_key(owner)
        if after is not None:
            seq = self._redis.zscore(jobs, after)
            if seq is None:
                raise JobNotFound(after)
            start = f"({int(seq)}"  # "(" excludes the `after` job itself
        ids = self._redis.zrange(jobs, start, "-inf" if desc else "+inf",
                                 desc=desc, byscore=True, offset=0, num=limit + 1)
        return self._load(ids[:limit]), len(ids) > limit

    def with_status(self, statuses: Iterable[JobStatus]) -> list[Job]:
        keys = [self.status_key(s) for s in statuses]
        ids = list(self._redis.sunion(keys)) if keys else []
        if not ids:
            return []
        seqs = self._redis.zmscore(self._key("jobs"), ids)
        live = sorted((seq, i) for seq, i in zip(seqs, ids) if seq is not None)  # None: deleted meanwhile
        return self._load([i for _, i in live])

    def count_by_status(self) -> dict[JobStatus, int]:  # without loading every job, as the default would
        with self._redis.pipeline(transaction=True) as pipe:
            for status in JobStatus:
                pipe.scard(self.status_key(status))
            return dict(zip(JobStatus, pipe.execute()))

    def _load(self, ids: list[str]) -> list[Job]:
        """The jobs with these ids, in this order; one deleted since the ids were read is left out."""
        if not ids:
            return []
        raws = self._redis.mget([self._key("job", i) for i in ids])
        return [Job.model_validate_json(raw) for raw in raws if raw]

    def add_delivery(self, delivery: WebhookDelivery) -> str:
        delivery_id = str(self._redis.incr(self._key("delivery_seq")))
        self._redis.hset(self._key("deliveries"), delivery_id, delivery.model_dump_json())
        return delivery_id

    def pending_deliveries(self) -> list[tuple[str, WebhookDelivery]]:
        pending = self._redis.hgetall(self._key("deliveries"))
        return [(i, WebhookDelivery.model_validate_json(pending[i])) for i in sorted(pending, key=int)]

    def delivery_done(self, delivery_id: str) -> None:
        self._redis.hdel(self._key("deliveries"), delivery_id)

    def try_lock(self, name: str, seconds: float, token: str) -> bool:
        return bool(self._redis.set(self._key("lock", name), token, nx=True, px=max(1, int(seconds * 1000))))

    def unlock(self, name: str, token: str) -> None:
        self._unlock(keys=[self._key("lock", name)], args=[token])

    def incarnation(self) -> str:
        # A new run id each time the server starts: after a crash, the AOF may lack the last
        # second of writes (`appendfsync everysec`), Celery's messages included.
        return self._redis.info("server")["run_id"]

    def close(self) -> None:
        self._redis.close()


class _ChangeSubscriber:
    """A process's one connection hearing every job change on the store, from any process: a
    pattern subscription on a thread of its own, handing each message to `listener`. Messages
    published while it is not connected are lost, so each time it (re)subscribes, a restarted
    Redis included, it tells `listener` that anything may have changed."""

    RETRY_SECONDS = (0.1, 2.0)  # the first wait before connecting again, and the longest

    def __init__(self, url: str, channel_prefix: str, listener: ChangeListener):
        self._url, self._prefix, self._listener = url, channel_prefix, listener
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vidserve-job-changes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        wait = self.RETRY_SECONDS[0]
        while not self._stop.is_set():
            client = redis.Redis.from_url(self._url, decode_responses=True)
            pubsub = client.pubsub()
            try:
                pubsub.psubscribe(self._prefix + "*")
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)  # the timeout only lets close() end the loop
                    if message is not None and self._hand_on(message):
                        wait = self.RETRY_SECONDS[0]
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.warning("job change notifications from Redis interrupted (%s); reconnecting", exc)
            finally:
                pubsub.close()
                client.close()
            self._stop.wait(wait)
            wait = min(wait * 2, self.RETRY_SECONDS[1])

    def _hand_on(self, message: dict) -> bool:
        """Pass a message on; whether it was the subscription's confirmation (a fresh connection)."""
        if message["type"] == "psubscribe":
            self._listener(JobChange(None, line=True))  # whatever was published while it was not listening
            return True
        if message["type"] == "pmessage":
            self._listener(JobChange(message["channel"][len(self._prefix):], line=message["data"] == LINE_CHANGED))
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
