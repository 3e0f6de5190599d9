"""Celery + Redis: the distributed queue. The API schedules, one worker per GPU runs.

Settings for long GPU jobs: acks_late + reject_on_worker_lost (a message is only done
when the job is), prefetch 1 and the solo pool (one job at a time, in the process that
holds the model), and a visibility timeout longer than any job. Each model has its own
queue, so a worker only takes jobs for the model it holds.

The order is not Celery's: jobs wait in the schedule in Redis (`workers/redis_schedule.py`),
and a message only wakes a worker of the model, which claims whatever job the fair-share
policy says is next (one Lua script: every API process and worker agrees on it). One message
is sent per job scheduled; a message that finds nothing left is done.

Redelivery alone can't recover a job whose worker was killed (its message stays unacked for
the whole visibility timeout), so a lease reaper — in the API and in every worker — schedules
again running jobs whose worker went silent (first in line), and queued jobs missing
from the schedule; the API wakes the workers for every queued job again when it starts and
after Redis restarts; the runner's atomic start keeps a job from running twice.
Each worker also keeps a heartbeat in Redis, so the API refuses a job for a model no worker
holds instead of queueing it where nobody listens.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import Celery

from vidserve.config import Settings
from vidserve.jobs import Job, JobStatus, JobStore
from vidserve.jobs.redis_persistence import require_durable
from vidserve.jobs.place_in_line import PlaceInLine, Running
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.registry import resolve_local
from vidserve.storage import open_storage
from vidserve.telemetry import Metrics
from vidserve.webhooks import WebhookSender, announce, build_sender

from .prompt_writer import HTTPWriter
from .redis_schedule import RedisSchedule
from .lease import recover_lost_jobs
from .runner import JobRunner
from .warm_up import warm_up

log = logging.getLogger("vidserve.celery")

TASK = "vidserve.run_next_job"  # its one argument: the model whose next job to run


def queue_name(model: str) -> str:
    return f"vidserve.{model}"


def presence_key(model: str) -> str:
    """A sorted set: the ids of the model's workers, each scored with when its heartbeat lapses."""
    return f"vidserve:workers:{model}"


# How long a heartbeat lasts; a worker renews it three times as often. A killed worker counts
# this long after its death: its model's jobs queue meanwhile, for a replacement.
PRESENCE_SECONDS = 15.0
# How long the API trusts what it last read, so a submission seldom pays the round trips.
PRESENCE_CACHE_SECONDS = 2.0


class Heartbeat:
    """A worker's presence in its model's set, scored on Redis's clock, so machines whose clocks
    disagree still agree on who is live. A clean stop removes it at once."""

    def __init__(self, redis_url: str, model: str, worker_id: str):
        self.redis, self.key, self.worker_id = redis.Redis.from_url(redis_url), presence_key(model), worker_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vidserve-heartbeat", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)  # no beat after the withdrawal
        try:
            self.redis.zrem(self.key, self.worker_id)
        except redis.RedisError:  # it lapses by itself
            log.warning("could not withdraw the heartbeat", exc_info=True)

    def _loop(self) -> None:
        while not self._stop.wait(PRESENCE_SECONDS / 3):
            self._beat()

    def _beat(self) -> None:
        try:
            now, _ = self.redis.time()
            with self.redis.pipeline(transaction=False) as pipe:
                pipe.zremrangebyscore(self.key, "-inf", now)  # the lapsed ones of killed workers
                pipe.zadd(self.key, {self.worker_id: now + PRESENCE_SECONDS})
                pipe.execute()
        except redis.RedisError:  # Redis away for a moment: the next beat is in time
            log.warning("heartbeat failed", exc_info=True)


def wake(app: Celery, model: str) -> None:
    app.send_task(TASK, args=[model], queue=queue_name(model))


def make_celery(settings: Settings) -> Celery:
    app = Celery("vidserve", broker=settings.redis_url)
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=1,
        task_ignore_result=True,  # job state lives in the JobStore
        broker_transport_options={"visibility_timeout": settings.visibility_timeout},
        broker_connection_retry_on_startup=True,
        # A Redis restart (a crash, a failover) must not end the worker: it reconnects, however long Redis is away.
        broker_connection_retry=True,
        broker_connection_max_retries=None,
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
    )
    return app


class LeaseReaper:
    """Every third of a lease, schedule again running jobs whose worker stopped renewing, and
    queued jobs missing from the schedule (a process killed between storing a job and
    scheduling it, or between claiming it and starting it), waking a worker for each. With
    `republish`, also wake the workers for every queued job at start and after each restart of
    the store: a Redis crash may lose a message but keep the record. A job scheduled twice
    still runs once (the claim drops an id no longer queued; the runner's atomic start)."""

    def __init__(self, store: JobStore, schedule: RedisSchedule, wake, announce, lease_seconds: float,
                 republish: bool = False):
        self.store, self.schedule, self.wake = store, schedule, wake
        self.announce, self.interval, self.republish = announce, lease_seconds / 3, republish
        self._incarnation: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vidserve-lease-reaper", daemon=True)

    def start(self) -> None:
        if self.republish:
            self._publish_queued()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.republish and self.store.incarnation() != self._incarnation:
                    log.warning("the job store restarted: publishing every queued job again")
                    self._publish_queued()
                self._schedule_missing()
                for job in recover_lost_jobs(self.store):
                    log.warning("job %s lost its worker (attempt %d): %s", job.id, job.attempts, job.status.value)
                    if job.status is JobStatus.queued:
                        self.submit(job)
                    else:
                        self.announce(job)
            except Exception:  # Redis away for a moment: try again next round
                log.warning("lease check failed", exc_info=True)

    def submit(self, job: Job) -> None:
        if self.schedule.add(job):
            # The store told the line's followers of the job when it stored it, before it was in the
            # schedule: a place read in between counted it as starting. Now it is in the line.
            self.store.line_moved(job.id)
        self.wake(job.model)

    def _schedule_missing(self) -> None:
        for job in self.store.with_status([JobStatus.queued]):
            if self.schedule.add(job):
                # Mostly a job claimed a moment ago and not yet started: the claim drops it again.
                log.info("job %s was queued but not in the schedule: scheduled", job.id)
                self.wake(job.model)

    def _publish_queued(self) -> None:
        incarnation = self.store.incarnation()  # read first: a restart during the loop is seen next round
        for job in self.store.with_status([JobStatus.queued]):
            self.submit(job)
        self._incarnation = incarnation


class CeleryQueue:
    """The API side: schedule jobs and wake their model's workers; watch for lost ones."""

    def __init__(self, settings: Settings, store: RedisJobStore, webhooks: WebhookSender):
        self.app, self.store = make_celery(settings), store
        self.schedule = RedisSchedule(store, settings.priority_aging_seconds)
        self.reaper = LeaseReaper(store, self.schedule, lambda model: wake(self.app, model),
                                  lambda job: announce(webhooks, settings, job), settings.lease_seconds, republish=True)
        self.redis = redis.Redis.from_url(settings.redis_url)
        self._workers: dict[str, tuple[float, int]] = {}  # model -> (when read, its live workers)

    def start(self) -> None:
        self.reaper.start()

    def submit(self, job: Job) -> None:
        self.reaper.submit(job)

    def serves(self, model: str) -> bool:
        """Whether a live worker holds `model`: one whose heartbeat has not lapsed."""
        return self._live_workers(model) > 0

    def places_in_line(self, model: str) -> dict[str, PlaceInLine]:
        active = [job for job in self.store.with_status([JobStatus.queued, JobStatus.in_progress])
                  if job.model == model]
        queued = [job.id for job in active if job.status is JobStatus.queued]
        running = [Running(job.model, job.started_at) for job in active if job.status is JobStatus.in_progress]
        return self.schedule.places_in_line(model, queued, running, max(self._live_workers(model), len(running)))

    def _live_workers(self, model: str) -> int:
        cached = self._workers.get(model)
        if cached is not None and time.monotonic() - cached[0] < PRESENCE_CACHE_SECONDS:
            return cached[1]
        now, _ = self.redis.time()
        live = self.redis.zcount(presence_key(model), now, "+inf")
        self._workers[model] = (time.monotonic(), live)
        return live

    @property
    def alive(self) -> bool:
        return self.reaper.alive

    warming = False  # the workers warm up before they take jobs, in their own processes

    def stop(self) -> None:
        self.reaper.stop()


def run_worker(settings: Settings, model: str, metrics_port: int | None = None) -> int:
    """One worker process: load the model, then take its jobs one at a time."""
    from vidserve.pipelines.video import get_pipeline

    volatile = require_durable(settings.redis_url, settings.allow_volatile_redis)  # before any model loads
    spec = resolve_local(model)
    store = RedisJobStore(settings.redis_url)
    metrics = Metrics()
    metrics.redis_volatile(volatile)
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr="127.0.0.1", registry=metrics.registry)
    writer = HTTPWriter(settings.chat_url, next(iter(settings.keys), None)) if settings.chat_url else None
    runner = JobRunner(settings, store, open_storage(settings), metrics,
                       build_sender(settings, store), writer=writer)
    get_pipeline(spec, settings.device, settings.dtype, settings.load)  # resident before the first job arrives
    if settings.warmup:
        warm_up(settings, model)  # and its first calls made

    app = make_celery(settings)
    schedule = RedisSchedule(store, settings.priority_aging_seconds)

    @app.task(name=TASK)
    def run_next_job(_model: str) -> None:
        # One job per message. A claimed job that does not run (cancelled or started meanwhile)
        # hands its turn to the next: the message stands for a job still waiting.
        while (job_id := schedule.claim(spec.name)) is not None:
            done = runner.run(job_id)
            if done is not None:
                if done.status is JobStatus.completed:
                    schedule.record_duration(spec.name, done.completed_at - done.started_at)
                return

    reaper = LeaseReaper(store, schedule, lambda model: wake(app, model),
                         lambda job: announce(runner.webhooks, settings, job), settings.lease_seconds)
    reaper.start()
    heartbeat = Heartbeat(settings.redis_url, spec.name, runner.worker_id)
    heartbeat.start()  # only once the model is resident: a worker that fails to load it never counted
    try:
        app.worker_main(["worker", "--pool=solo", "--concurrency=1", f"--queues={queue_name(spec.name)}",
                         f"--hostname=vidserve-{runner.worker_id}", "--loglevel=INFO", "--without-gossip",
                         "--without-mingle"])
    finally:
        heartbeat.stop()
        reaper.stop()
        runner.webhooks.close(timeout=5)
    return 0
