"""The embedded queue: one worker thread in the server process, jobs in the JobStore.

`vidserve serve` needs no service at all with it. Jobs run one at a time, in the order the
fair-share policy gives (`workers/fair_share.py`: the least served key's next job by priority
with aging), over every queued job: all models share the one worker, so they share one
line. The line is read from the store at each pick, so a restart loses nothing but the keys'
recent starts. On start it recovers jobs that were running when a previous process died (run
again or, with their attempts used up, failed), then its thread warms up on the default model
(`workers/warm_up.py`; `warming` until done) before it takes the first job. After each job it
recovers a job the runner gave up during an outage, which Celery's lease reaper would recover there.

A server shutting down `drain`s it first: no job starts after that, and the running one (`running_job_id`)
finishes, or, given back by its runner (`JobRunner.interrupt`), runs again on the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from vidserve import jobs
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, JobStore
from vidserve.jobs.outages import OUTAGES
from vidserve.jobs.place_in_line import (RECENT_JOBS, InLine, PlaceInLine, Running, mean_durations,
                                         places_in_line)
from vidserve.webhooks import announce

from .fair_share import Entry, Fairness, next_entry, start_order
from .runner import JobRunner
from .warm_up import warm_up

log = logging.getLogger("vidserve.embedded")

OUTAGE_PAUSE = 1.0  # seconds between looks at a job store that is out of reach


class EmbeddedQueue:
    def __init__(self, store: JobStore, runner: JobRunner):
        self.store = store
        self.runner = runner
        self.aging_seconds = runner.settings.priority_aging_seconds
        self._fairness = Fairness()
        self._recent: dict[str, deque[float]] = {}  # model -> its last completed jobs' run seconds
        self._running: tuple[str, Running] | None = None  # (job id, what it runs) from its pick to its end
        self._wake = threading.Condition()  # held while picking: a submission then waits for the pick's wait
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._warming = False

    def start(self) -> None:
        self._recover("was running when the server stopped")
        self._warming = self.runner.settings.warmup
        self._thread = threading.Thread(target=self._work, name="vidserve-embedded-worker", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """The job is in the store already: wake the worker if it waits for one."""
        with self._wake:
            self._wake.notify()

    def places_in_line(self, model: str) -> dict[str, PlaceInLine]:
        """Every queued job's place in the one line, whatever `model`, and its estimated start."""
        queued = self._queued()
        with self._wake:
            fairness, running, durations = self._fairness.copy(), self._running, mean_durations(self._recent)
        now = time.time()
        lines = {job.id: InLine(job.id, job.model, job.owner or "") for job in queued}
        # Picked but not yet started, a job still shows queued: it is first in line, and nothing runs before it.
        starting = [running[0]] if running is not None and running[0] in lines else []
        waiting = [Entry.of(job) for job in queued if job.id not in starting]
        order = [*starting, *(entry.id for entry in start_order(waiting, fairness, now, self.aging_seconds))]
        runs = [running[1]] if running is not None and not starting else []
        return places_in_line([lines[job_id] for job_id in order], runs, durations, 1, now)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def warming(self) -> bool:
        """Warming up: jobs wait until it is done (a queued one then starts at full speed)."""
        return self._warming

    @property
    def running_job_id(self) -> str | None:
        """The job the worker runs (or has just picked), if any."""
        running = self._running
        return running[0] if running is not None else None

    def drain(self) -> None:
        """Start no job from now on; the running one goes on. Safe in a signal handler: the flag is
        set before the lock (re-entrant) is taken to wake the worker."""
        self._stopping = True
        with self._wake:
            self._wake.notify()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking jobs. A job still running when the process exits is recovered on the next start."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            # A runner told to stop has given its job back: a step too long to wait for is not waited for.
            self._thread.join(0 if self.runner.interrupted else timeout)

    def _queued(self) -> list[Job]:
        return self.store.with_status([JobStatus.queued])

    def _next(self) -> Job | None:
        """The next job by the policy, charged to its key; waits while none is queued. None: stopping."""
        with self._wake:
            while not self._stopping:
                try:
                    queued = self._queued()
                except OUTAGES as exc:  # the store is away: look again shortly
                    log.warning("could not read the queue: %s", exc)
                    self._wake.wait(OUTAGE_PAUSE)
                    continue
                chosen = next_entry([Entry.of(job) for job in queued], self._fairness, time.time(),
                                    self.aging_seconds)
                if self._stopping:  # drained while the line was read
                    return None
                if chosen is not None:
                    self._fairness.charge(chosen)
                    job = next(job for job in queued if job.id == chosen.id)
                    self._running = (job.id, Running(job.model, time.time()))
                    return job
                self._wake.wait()
            return None

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
        if self._warming:
            try:
                warm_up(self.runner.settings, self.runner.settings.default_model)
            finally:
                self._warming = False
        while (job := self._next()) is not None:
            done = None
            try:
                if not self._stopping:  # drained since the pick: the job stays queued for the next start
                    done = self.runner.run(job.id)
            except Exception:  # the runner already records failures; this guards the thread itself
                log.exception("runner crashed on %s", job.id)
            with self._wake:
                self._running = None
                if done is not None and done.status is JobStatus.completed:
                    recent = self._recent.setdefault(job.model, deque(maxlen=RECENT_JOBS))
                    recent.append(done.completed_at - done.started_at)
            if self._stopping:  # a job given back on the way out is recovered by the next start
                break
            try:
                self._recover("was given up during an outage")  # queued again: the next pick sees it
            except OUTAGES as exc:  # the store is still away: the next job, or a restart, recovers it
                log.warning("could not recover jobs given up during an outage: %s", exc)
