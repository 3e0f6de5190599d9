"""The embedded queue: one worker thread in the server process, jobs in the JobStore.

`vidserve serve` needs no service at all with it. Jobs run one at a time, oldest
first. On start it picks up what a previous process left behind: queued jobs wait
their turn again, jobs that were running when it died are recovered (run again or,
with their attempts used up, failed). After each job it does the same for a job the
runner gave up during an outage, which Celery's lease reaper would recover there.
"""

from __future__ import annotations

import logging
import queue
import threading

from vidserve import jobs
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, JobStore
from vidserve.jobs.outages import OUTAGES
from vidserve.webhooks import announce

from .runner import JobRunner

log = logging.getLogger("vidserve.embedded")


class EmbeddedQueue:
    def __init__(self, store: JobStore, runner: JobRunner):
        self.store = store
        self.runner = runner
        self._ids: queue.Queue[str | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._recover("was running when the server stopped")
        for job in self.store.with_status([JobStatus.queued]):
            self._ids.put(job.id)
        self._thread = threading.Thread(target=self._work, name="vidserve-embedded-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._ids.put(job.id)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs. A job still running when the process exits is recovered on the next start."""
        self._ids.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    def _recover(self, how: str) -> list[Job]:
        """Run again (or fail) every running job: this process is the only worker, so when it
        is between jobs, a running one is one a crash left behind or the runner gave up."""
        recovered = []
        for job in self.store.with_status([JobStatus.in_progress]):
            try:
                recovered.append(self.store.update(job.id, jobs.recover))
            except (JobNotFound, InvalidTransition):
                continue
            log.warning("job %s %s: %s", job.id, how, recovered[-1].status.value)
            announce(self.runner.webhooks, self.runner.settings, recovered[-1])
        return recovered

    def _work(self) -> None:
        while True:
            job_id = self._ids.get()
            if job_id is None:
                return
            try:
                self.runner.run(job_id)
            except Exception:  # the runner already records failures; this guards the thread itself
                log.exception("runner crashed on %s", job_id)
            try:
                for job in self._recover("was given up during an outage"):
                    if job.status is JobStatus.queued:
                        self.submit(job)
            except OUTAGES as exc:  # the store is still away: the next job, or a restart, recovers it
                log.warning("could not recover jobs given up during an outage: %s", exc)
