"""A running job's lease: renewed while its worker works, and, lapsed, the sign of a lost worker.

The runner renews it with every step's progress and, between steps, from a heartbeat thread
(`keep_lease`), so one slow step never looks like a dead worker. The lease reaper (`LeaseReaper`
in `celery_app.py`) recovers the jobs whose lease lapsed (`recover_lost_jobs`).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from vidserve import jobs
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, JobStore, LeaseLost

log = logging.getLogger("vidserve.runner")


def keep_lease(store: JobStore, job_id: str, worker_id: str, lease_seconds: float) -> threading.Event:
    """Renew the lease every third of it until the returned event is set (or the job is gone or
    no longer this worker's)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(lease_seconds / 3):
            try:
                store.update(job_id, jobs.heartbeat(worker_id, lease_seconds))
            except (JobNotFound, LeaseLost):
                return
            except Exception:  # a store hiccup: the next beat tries again
                log.warning("heartbeat for %s failed", job_id, exc_info=True)

    threading.Thread(target=beat, name=f"lease-{job_id}", daemon=True).start()
    return stop


def recover_lost_jobs(store: JobStore, now: float | None = None) -> list[Job]:
    """Running jobs whose lease lapsed lost their worker: queue them again (or fail them)."""
    now = time.time() if now is None else now
    recovered = []
    for job in store.with_status([JobStatus.in_progress]):
        if job.lease_expires_at is not None and job.lease_expires_at < now:
            try:
                recovered.append(store.update(job.id, _recover_if_expired(now)))
            except (JobNotFound, InvalidTransition):
                continue  # it finished, or its worker renewed the lease, meanwhile
    return recovered


def _recover_if_expired(now: float) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        if job.status is not JobStatus.in_progress or (job.lease_expires_at or now) >= now:
            raise InvalidTransition(f"job {job.id} is not a lost job")
        jobs.recover(job)

    return apply
