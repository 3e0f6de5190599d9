"""Runs one video job end to end: claim it, generate with per-step progress and
cancellation, encode (the default MP4, thumbnail and spritesheet, then each rendition the job
asks for, as stage `encoding`), store the outputs, record the outcome, announce it.

The same runner serves the embedded queue and Celery workers. It claims a job through
an atomic JobStore transition, so a job delivered twice still runs once, and it keeps a
lease alive while it works (`workers/lease.py`), so a job whose worker dies is noticed and run again.

What the job makes is stored as it is made by its `VideoPublisher` (`workers/publishing.py`); a
job run again after its worker was lost goes on from its last finished chunk (`workers/resume.py`).

Between steps and chunks the job is steered (`workers/steering.py`): a cancel, a stop, a prompt
update. A runner told to stop (`interrupt`, a server shutting down) gives its job back there
(`jobs.release`, with its attempt counted), so it runs again, from its last finished chunk, on
the next start.

An outage never counts against a job: every job store write and storage call is retried
for up to a lease (`workers/job_io.py`). Past that, a storage outage gives the job back
(`jobs.release`) to run again, and a job store outage leaves it, untouched, to the lease
reaper, which requeues it once its lease lapses.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Callable

import numpy as np

from vidserve import jobs
from vidserve.config import Settings
from vidserve.errors import JobCancelled, VidserveError
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, JobStore, LeaseLost
from vidserve.jobs.files import JobFiles
from vidserve.jobs.outages import STORE_UNAVAILABLE
from vidserve.loras import LoraRegistry
from vidserve.media import last_frame, load_image, read_video_bytes
from vidserve.media.quality import output_warnings
from vidserve.storage import Storage, StorageUnavailable
from vidserve.telemetry import ANONYMOUS_LABEL, Metrics
from vidserve.video_request import GenerationRequest
from vidserve.webhooks import WebhookSender, announce

from .job_io import JobIO
from .lease import keep_lease
from .prompt_writer import PromptWriter
from .publishing import VideoPublisher
from .resume import resume_point
from .steering import Interrupted, Steering

log = logging.getLogger("vidserve.runner")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class JobRunner:
    def __init__(self, settings: Settings, store: JobStore, storage: Storage, metrics: Metrics | None = None,
                 webhooks: WebhookSender | None = None, worker_id: str | None = None,
                 writer: PromptWriter | None = None):
        self.settings = settings
        self.store = store
        self.storage = storage
        self.metrics = metrics or Metrics()
        self.webhooks = webhooks
        self.worker_id = worker_id or default_worker_id()
        self.writer = writer  # the LLM path, for prompt_extend and caption_chain
        self.adapters = LoraRegistry.from_settings(settings.lora_dirs, settings.loras, settings.lora_cache)
        self.io = JobIO(store, storage, settings.lease_seconds)
        self._interrupted = threading.Event()
        self.steering = Steering(self.io, self.worker_id, settings.lease_seconds, self.metrics, self._interrupted)

    def interrupt(self) -> None:
        """Stop the running job at its next denoising step or chunk and give it back (it runs again,
        from its last finished chunk); the runner takes no job after this."""
        self._interrupted.set()

    @property
    def interrupted(self) -> bool:
        return self._interrupted.is_set()

    def give_back(self, job_id: str) -> Job | None:
        """Give the job back from outside its run (a run that does not reach a step boundary in time):
        its lease lapses, so the next start runs it again; the run's later writes find it no longer its."""
        return self._update_quietly(job_id, _released_by_shutdown(self.worker_id))

    def run(self, job_id: str) -> Job | None:
        """Run the job if it is still queued; return its record as this run left it (None if
        not ours to run, or the job store stayed out of reach)."""
        if self._interrupted.is_set():
            return None  # stopping: the job stays queued for the next start
        try:
            job = self.io.write(job_id, jobs.start(self.worker_id, self.settings.lease_seconds))
        except (JobNotFound, InvalidTransition):
            return None  # deleted, cancelled, or already taken by another delivery
        self.metrics.queue_wait.labels(job.model, job.params.priority, job.owner or ANONYMOUS_LABEL).observe(
            job.started_at - job.created_at)
        stop_heartbeat = keep_lease(self.store, job_id, self.worker_id, self.settings.lease_seconds)
        try:
            job = self._generate(job)
        finally:
            stop_heartbeat.set()
        if job is not None:
            self.metrics.run_time.labels(job.model, job.status.value).observe(time.time() - job.started_at)
            announce(self.webhooks, self.settings, job)
        return job

    def _generate(self, job: Job) -> Job | None:
        """Run the job and record how it ended. None when the job store stayed out of reach:
        the job is left as it is, for the lease reaper to run again."""
        try:
            return self._attempt(job)
        except STORE_UNAVAILABLE as exc:
            log.warning("job %s: the job store is unreachable (%s); leaving the job to run again once its lease "
                        "lapses", job.id, exc)
            return None

    def _attempt(self, job: Job) -> Job | None:
        try:
            source = read_video_bytes(self.io.read(job.source_video_key))[0] if job.source_video_key else None
            request = self.request_for(job, source)
            # The video's segments as they are made (a rerun's, from those it keeps): its stream, then its MP4.
            resume, timeline = resume_point(job, len(request.chunk_frames), self.io.read)
            # A video of one chunk (and no source) is that chunk: it is stored once, as the video.
            publisher = VideoPublisher(job, request.fps, timeline, source is None and len(request.chunk_frames) == 1,
                                       self.io, self.worker_id, self.metrics, self.settings, self.webhooks)
            if source is not None and resume is None:  # the stream opens on the video it continues
                publisher.publish_source(source)
            if request.prompt_extend:
                request = request.model_copy(update={"prompt": self._extend_prompt(job, request)})
            from vidserve.pipelines.chain import generate_video  # torch stays out of processes that never run jobs

            caption = self._require_writer("caption_chain").caption if request.caption_chain else None
            result = generate_video(request, self.settings.device, self.settings.dtype,
                                    on_step=self.steering.on_step(job), on_chunk=publisher.publish_chunk,
                                    on_chunk_start=self.steering.on_chunk_start(job), caption=caption,
                                    load=self.settings.load, adapters=self.adapters, resume=resume)
            self._count_loras(job, result.loras)
            # An extension's video is the source followed by the new frames.
            frames = result.frames if source is None else np.concatenate([source, result.frames])
            self.steering.report(job.id, stage="encoding")
            start = time.perf_counter()
            outputs = publisher.store_outputs(frames)
            timings = {**result.timings, "encode": time.perf_counter() - start}
            renditions, sizes = publisher.store_renditions(request, frames, timings, self.steering.on_rendition(job))
            warnings = output_warnings(frames)
            timings = {name: round(seconds, 4) for name, seconds in timings.items()}  # to 0.1 ms
            done = self.io.write(job.id, jobs.complete(self.worker_id, {**outputs, **renditions}, timings, warnings,
                                                     output_ttl=self.settings.output_ttl, attention=result.attention,
                                                     output_bytes=sizes))
            publisher.forget_chain_states()
            self._report_warnings(done)
            return done
        except (JobCancelled, JobNotFound, LeaseLost) as exc:  # cancelled, deleted, or now another worker's
            return self._end_quietly(job, exc)
        except Interrupted:  # the server is stopping: the job runs again on the next start
            return self._update_quietly(job.id, _released_by_shutdown(self.worker_id))
        except StorageUnavailable as exc:  # not the job's fault: it runs again (or, attempts used up, fails)
            log.warning("job %s: %s; giving the job back", job.id, exc)
            return self._update_quietly(job.id, jobs.release(self.worker_id, exc.code, str(exc)))
        except STORE_UNAVAILABLE:
            raise  # not the job's fault either; _generate leaves it to the lease reaper
        except Exception as exc:  # a bad job must fail alone, never take the worker down
            log.exception("job %s failed", job.id)
            failure = jobs.fail(self.worker_id, _failure_code(exc), f"{type(exc).__name__}: {exc}")
            return self._update_quietly(job.id, failure)

    def request_for(self, job: Job, source: np.ndarray | None) -> GenerationRequest:
        """The request the API validated, from the job's parameters and stored first frame
        (or the last frame of the video it extends)."""
        image = None
        if job.input_image_key:
            image = load_image(self.io.read(job.input_image_key), self.settings.max_image_pixels)
        elif source is not None:
            image = last_frame(source)
        return job.params.to_request(job.model, job.prompt, image)

    def _require_writer(self, option: str) -> PromptWriter:
        if self.writer is None:
            raise RuntimeError(f"{option} needs the LLM path: this worker has no chat model "
                               "(run it with --chat-url / VIDSERVE_CHAT_URL)")
        return self.writer

    def _extend_prompt(self, job: Job, request: GenerationRequest) -> str:
        """The LLM's rewrite (seeing the first frame, if any), recorded beside the original."""
        extended = self._require_writer("prompt_extend").extend(job.prompt, request.image, request.seed)
        self.io.write(job.id, jobs.prompt_extended(self.worker_id, extended))
        return extended

    def _count_loras(self, job: Job, events) -> None:
        for event in events:
            if event.cached:
                self.metrics.lora_cache_hits.labels(job.model, event.name).inc()
            else:
                self.metrics.lora_loads.labels(job.model, event.name).inc()
                self.metrics.lora_load_time.labels(job.model).observe(event.seconds)

    def _report_warnings(self, job: Job) -> None:
        """A blank, flat or frozen video still completes, but is logged and counted as such."""
        for warning in job.warnings:
            log.warning("job %s (%s) completed with %s: %s", job.id, job.model, warning.code, warning.message)
            self.metrics.output_warnings.labels(job.model, warning.code).inc()

    def _end_quietly(self, job: Job, reason: Exception) -> Job | None:
        current = self._update_quietly(job.id, jobs.cancelled(self.worker_id))
        if current is None or current.status is not JobStatus.cancelled:
            log.info("job %s stopped: %s", job.id, type(reason).__name__)
        if self.io.get(job.id) is None:
            self.io.delete_prefix(JobFiles(job.id).prefix)  # deleted while running: leave nothing behind
        return current

    def _update_quietly(self, job_id: str, change) -> Job | None:
        try:
            return self.io.write(job_id, change)
        except (JobNotFound, InvalidTransition):
            return self.io.get(job_id)


def _released_by_shutdown(worker_id: str) -> Callable[[Job], None]:
    return jobs.release(worker_id, "server_stopped", "the server stopped while running this job")


def _failure_code(exc: Exception) -> str:
    if isinstance(exc, VidserveError):
        return exc.code
    torch = sys.modules.get("torch")  # loaded by the pipeline; this module never imports it
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()  # give the memory back before the next job
        return "out_of_memory"
    return "generation_failed"
