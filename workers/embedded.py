"""The embedded queue: one worker thread in the server process, jobs in the JobStore.

`vidserve serve` needs no service at all with it. Jobs run one at a time, oldest
first. On start it picks up what a previous process left behind: queued jobs wait
their turn again, jobs that were running when it died are recovered (run again or,
with their attempts used up, failed).
"""

from __future__ import annotations

import logging
import queue
import threading

from vidserve import jobs
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, JobStore
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
        for job in self.store.with_status([JobStatus.in_progress]):
            # This process is the only worker, so a running job here is one a crash left behind.
            try:
                recovered = self.store.update(job.id, jobs.recover)
            except (JobNotFound, InvalidTransition):
                continue
            log.warning("job %s was running when the server stopped: %s", job.id, recovered.status.value)
            announce(self.runner.webhooks, self.runner.settings, recovered)
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

    def _work(self) -> None:
        while True:
            job_id = self._ids.get()
            if job_id is None:
                return
            try:
                self.runner.run(job_id)
            except Exception:  # the runner already records failures; this guards the thread itself
                log.exception("runner crashed on %s", job_id)
