"""Deleting completed videos' files once they expire (`Settings.output_ttl`).

The record stays: `GET /v1/videos/{id}` still shows the video with its `expires_at`, and
its content answers 410. Each API process runs a sweeper thread; a lock in the JobStore
lets one of them sweep at a time.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

from vidserve import jobs
from vidserve.jobs import InvalidTransition, JobNotFound, JobStatus, JobStore
from vidserve.jobs.files import JobFiles
from vidserve.storage import Storage

log = logging.getLogger("vidserve.jobs.expiry")

LOCK_NAME = "expiry-sweep"
# Longer than any sweep; a holder that dies mid-sweep frees the lock by then. A sweep that
# outlives it only risks a second sweeper doing the same deletions, which are idempotent.
LOCK_SECONDS = 300.0


class ExpirySweeper:
    def __init__(self, store: JobStore, storage: Storage, interval: float):
        self.store, self.storage, self.interval = store, storage, interval
        self.token = secrets.token_hex(8)  # this sweeper's name on the lock
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self, now: float | None = None) -> list[str]:
        """Delete the files of every completed video expired by `now`; the ids swept. Nothing
        (an empty list) while another sweeper holds the lock."""
        now = time.time() if now is None else now
        if not self.store.try_lock(LOCK_NAME, LOCK_SECONDS, self.token):
            return []
        try:
            due = [job for job in self.store.with_status([JobStatus.completed])
                   if not job.expired and job.is_expired(now)]
            swept = []
            for job in due:
                # Files first, then the record: a crash between leaves it due, and the next sweep
                # deletes nothing more and marks it.
                self.storage.delete_prefix(JobFiles(job.id).prefix)
                try:
                    self.store.update(job.id, jobs.expire(now))
                except (JobNotFound, InvalidTransition):  # deleted, or swept by another sweeper, meanwhile
                    continue
                swept.append(job.id)
            if swept:
                log.info("expired the outputs of %d videos", len(swept))
            return swept
        finally:
            self.store.unlock(LOCK_NAME, self.token)

    def start(self) -> None:
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="vidserve-expiry-sweeper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self) -> None:
        # The first sweep waits an interval too: nothing expires in the moment a server starts.
        while not self._stopping.wait(self.interval):
            try:
                self.sweep()
            except Exception:  # a store or storage outage: try again next interval
                log.exception("expiry sweep failed")
