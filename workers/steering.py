"""What a running job hears between two denoising steps or chunks: a cancel, a stop, a realtime
session's prompt update, the server shutting down. Each step reports its progress (renewing the
lease) and reads the job back; each chunk reads its prompt as it begins."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from vidserve import jobs
from vidserve.errors import JobCancelled
from vidserve.jobs import Job
from vidserve.media.drift import StopChain
from vidserve.telemetry import Metrics

from .job_io import JobIO

# Denoising is nearly all of a job; decoding and encoding take the last few percent.
DENOISE_SHARE = 95
ENCODED = 99  # progress once every rendition is stored; 100 is the completed job


class Interrupted(Exception):
    """The runner was told to stop (the server is shutting down): its job is given back to run again."""


@dataclass(frozen=True)
class Steering:
    """A worker's runs, reported and steered: `interrupted` is the runner's shutdown flag."""

    io: JobIO
    worker_id: str
    lease_seconds: float
    metrics: Metrics
    interrupted: threading.Event

    def report(self, job_id: str, progress: int | None = None, stage: str | None = None,
               steps_done: int | None = None) -> None:
        """Record progress (and renew the lease); JobCancelled if a cancel was asked for meanwhile.
        JobNotFound (deleted) and LeaseLost end the run like a cancel; Interrupted gives the job back."""
        if self.interrupted.is_set():
            raise Interrupted()
        current = self.io.write(job_id, jobs.heartbeat(self.worker_id, self.lease_seconds, progress, stage,
                                                       steps_done))
        if current.cancel_requested:
            raise JobCancelled()

    def on_step(self, job: Job) -> Callable[[int, int], None]:
        """`generate_video`'s `on_step`: each denoising step timed and reported."""
        last = [time.perf_counter()]

        def on_step(done: int, total: int) -> None:
            now = time.perf_counter()
            self.metrics.step_time.labels(job.model).observe(now - last[0])
            last[0] = now
            self.report(job.id, DENOISE_SHARE * done // total, steps_done=done)

        return on_step

    def on_rendition(self, job: Job) -> Callable[[int, int], None]:
        """`VideoPublisher.store_renditions`'s `on_stored`: progress from DENOISE_SHARE to ENCODED."""
        return lambda done, total: self.report(job.id, DENOISE_SHARE + (ENCODED - DENOISE_SHARE) * done // total)

    def on_chunk_start(self, job: Job) -> Callable[[int], str | None]:
        """`generate_video`'s `on_chunk_start`: the chunk's prompt (a realtime update's, or None), or a stop."""
        def on_chunk_start(index: int) -> str | None:
            if self.interrupted.is_set():
                raise Interrupted()
            current = self.io.write(job.id, jobs.chunk_started(self.worker_id, index))
            if current.cancel_requested:
                raise JobCancelled()
            if current.stop_after_chunks is not None and index >= current.stop_after_chunks:
                raise StopChain()
            return jobs.steered_prompt(current, index)

        return on_chunk_start
