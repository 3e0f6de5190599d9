"""Runs one video job end to end: claim it, generate with per-step progress and
cancellation, encode (the default MP4, thumbnail and spritesheet, then each rendition the job
asks for, as stage `encoding`), store the outputs, record the outcome, announce it.

The same runner serves the embedded queue and Celery workers. It claims a job through
an atomic JobStore transition, so a job delivered twice still runs once, and it keeps a
lease alive while it works, so a job whose worker dies is noticed and run again.

A job run again after its worker was lost goes on from its last finished chunk
(`workers/resume.py`).

A runner told to stop (`interrupt`, a server shutting down) gives its job back at the next
denoising step or chunk (`jobs.release`, with its attempt counted), so it runs again, from its
last finished chunk, on the next start.

An outage never counts against a job: every job store write and storage call is retried
for up to a lease (vidserve/jobs/outages.py). Past that, a storage outage gives the job back
(`jobs.release`) to run again, and a job store outage leaves it, untouched, to the lease
reaper, which requeues it once its lease lapses.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
from PIL import Image

from vidserve import jobs
from vidserve.config import Settings
from vidserve.media.drift import ChainState, DriftMetrics, StopChain
from vidserve.media.hls import INIT_NAME, Segment, Timeline, encode_segment, join_segments
from vidserve.media.renderer import Provenance, Renderer
from vidserve.errors import JobCancelled, VidserveError
from vidserve.jobs import InvalidTransition, Job, JobNotFound, JobStatus, JobStore, LeaseLost
from vidserve.loras import LoraRegistry
from vidserve.media import last_frame, load_image, read_video_bytes, save_thumbnail
from vidserve.jobs.outages import STORE_UNAVAILABLE, through_outages
from vidserve.media.quality import chunk_warnings, output_warnings
from vidserve.options import GenerationOptions
from vidserve.registry import resolve_local, weights_here
from vidserve.requests import GenerationRequest, build_request
from vidserve.media.spritesheet import save_spritesheet
from vidserve.storage import Storage, StorageUnavailable
from vidserve.telemetry import ANONYMOUS_LABEL, Metrics
from vidserve.webhooks import WebhookSender, announce, announce_chunk

from .prompt_writer import PromptWriter
from .resume import CHAIN_STATES, chain_state_key, resume_point

log = logging.getLogger("vidserve.runner")

# Denoising is nearly all of a job; decoding and encoding take the last few percent.
DENOISE_SHARE = 95
ENCODED = 99  # progress once every rendition is stored; 100 is the completed job
WARM_UP_STEPS = 2  # a warm-up generation's: enough for every call a job makes, at a tenth of its steps

T = TypeVar("T")


class Interrupted(Exception):
    """The runner was told to stop (the server is shutting down): its job is given back to run again."""


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
        self._interrupted = threading.Event()

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
            job = self._write(job_id, jobs.start(self.worker_id, self.settings.lease_seconds))
        except (JobNotFound, InvalidTransition):
            return None  # deleted, cancelled, or already taken by another delivery
        self.metrics.queue_wait.labels(job.model, job.params.priority, job.owner or ANONYMOUS_LABEL).observe(
            job.started_at - job.created_at)
        stop_heartbeat = self._keep_lease(job_id)
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
            source = read_video_bytes(self._read(job.source_video_key))[0] if job.source_video_key else None
            request = self.request_for(job, source)
            # The video's segments as they are made (a rerun's, from those it keeps): its stream, then its MP4.
            resume, timeline = resume_point(job, len(request.chunk_frames), self._read)
            if source is not None and resume is None:  # the stream opens on the video it continues
                segment = encode_segment(source, request.fps)
                record, init_key = self._put_segment(job, "source", segment, timeline)
                self._write(job.id, jobs.segment_done(self.worker_id, record, init_key))
            if request.prompt_extend:
                request = request.model_copy(update={"prompt": self._extend_prompt(job, request)})
            from vidserve.pipelines.chain import generate_video  # torch stays out of processes that never run jobs

            caption = self._require_writer("caption_chain").caption if request.caption_chain else None
            # A video of one chunk (and no source) is that chunk: it is stored once, as the video.
            one_chunk = source is None and len(request.chunk_frames) == 1
            result = generate_video(request, self.settings.device, self.settings.dtype, on_step=self._on_step(job),
                                    on_chunk=self._on_chunk(job, request.fps, one_chunk, timeline),
                                    caption=caption, load=self.settings.load, adapters=self.adapters,
                                    on_chunk_start=self._on_chunk_start(job), resume=resume)
            self._count_loras(job, result.loras)
            # An extension's video is the source followed by the new frames.
            frames = result.frames if source is None else np.concatenate([source, result.frames])
            self._report(job.id, stage="encoding")
            start = time.perf_counter()
            outputs = self._store_outputs(job, frames, timeline, video_stored=one_chunk)
            timings = {**result.timings, "encode": time.perf_counter() - start}
            renditions, sizes = self._store_renditions(job, request, frames, timings)
            warnings = output_warnings(frames)
            timings = {name: round(seconds, 4) for name, seconds in timings.items()}  # to 0.1 ms
            done = self._write(job.id, jobs.complete(self.worker_id, {**outputs, **renditions}, timings, warnings,
                                                     output_ttl=self.settings.output_ttl, attention=result.attention,
                                                     output_bytes=sizes))
            self._forget_chain_states(job.id)
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

    def warm_up(self, model: str) -> None:
        """One tiny generation of `model` (WARM_UP_STEPS steps, one chunk at its native size) and the
        encodes a job makes, so that the first job pays for none of the first calls: imports, the
        load, each kernel's first run (on CUDA, its autotuning), ffmpeg's. A failure is logged and
        left to the first job, which reports it; weights not on this machine are never fetched for it."""
        start = time.perf_counter()
        try:
            spec = resolve_local(model)
            if not weights_here(spec):
                log.info("no warm-up: the weights of %s are not on this machine", model)
                return
            from vidserve.pipelines.chain import generate_video

            # An image-to-video model takes a first frame: a gray one.
            image = Image.new("RGB", (spec.width, spec.height), (128, 128, 128)) if spec.kind == "i2v" else None
            request = build_request(spec, self.settings, "warm-up", GenerationOptions(steps=WARM_UP_STEPS, seed=0),
                                    image=image)
            frames = generate_video(request, self.settings.device, self.settings.dtype, load=self.settings.load).frames
            with tempfile.TemporaryDirectory(prefix="warm-up-") as tmp:
                segment = encode_segment(frames, request.fps)
                join_segments(segment.init, [segment.media], Path(tmp) / "video.mp4")
                save_thumbnail(frames, Path(tmp) / "thumbnail.webp")
                save_spritesheet(frames, Path(tmp) / "spritesheet.jpg")
        except Exception:
            log.exception("the warm-up of %s failed; its first job will load it", model)
            return
        log.info("warmed up %s in %.1f s", model, time.perf_counter() - start)

    def request_for(self, job: Job, source: np.ndarray | None) -> GenerationRequest:
        """The request the API validated, from the job's parameters and stored first frame
        (or the last frame of the video it extends)."""
        image = None
        if job.input_image_key:
            image = load_image(self._read(job.input_image_key), self.settings.max_image_pixels)
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
        self._write(job.id, jobs.prompt_extended(self.worker_id, extended))
        return extended

    def _on_step(self, job: Job):
        last = [time.perf_counter()]

        def on_step(done: int, total: int) -> None:
            now = time.perf_counter()
            self.metrics.step_time.labels(job.model).observe(now - last[0])
            last[0] = now
            self._report(job.id, DENOISE_SHARE * done // total, steps_done=done)

        return on_step

    def _report(self, job_id: str, progress: int | None = None, stage: str | None = None,
                steps_done: int | None = None) -> None:
        """Record progress (and renew the lease); JobCancelled if a cancel was asked for meanwhile.
        JobNotFound (deleted) and LeaseLost end the run like a cancel; Interrupted gives the job back."""
        if self._interrupted.is_set():
            raise Interrupted()
        current = self._write(job_id, jobs.heartbeat(self.worker_id, self.settings.lease_seconds, progress, stage,
                                                     steps_done))
        if current.cancel_requested:
            raise JobCancelled()

    def _on_chunk_start(self, job: Job):
        """Each chunk's steering, read as it begins: a prompt update, or a stop."""
        def on_chunk_start(index: int) -> str | None:
            if self._interrupted.is_set():
                raise Interrupted()
            current = self._write(job.id, jobs.chunk_started(self.worker_id, index))
            if current.cancel_requested:
                raise JobCancelled()
            if current.stop_after_chunks is not None and index >= current.stop_after_chunks:
                raise StopChain()
            return jobs.steered_prompt(current, index)

        return on_chunk_start

    def _on_chunk(self, job: Job, fps: int, whole_video: bool, timeline: Timeline):
        """Each chunk, stored as it finishes, as an MP4 of its own (under the video's key when it
        is the `whole_video`) and as the stream's next segment: one encode for both. The chain's
        `state` after it is stored too, before the chunk is recorded, for a rerun to go on from."""
        def on_chunk(index: int, frames: np.ndarray, drift: DriftMetrics, prompt: str,
                     state: ChainState | None = None) -> None:
            segment = encode_segment(frames, fps)
            name = "video.mp4" if whole_video else f"chunk-{index}.mp4"
            with tempfile.TemporaryDirectory(prefix=f"{job.id}-") as tmp:
                key = self._put(f"{job.id}/{name}", join_segments(segment.init, [segment.media], Path(tmp) / name))
            record, init_key = self._put_segment(job, str(index), segment, timeline)
            if state is not None:
                state_key = chain_state_key(job.id, index)
                self._through_outages(lambda: self.storage.put_bytes(state_key, state.to_bytes()),
                                      f"storing {state_key}")
            chunk = {"index": index, "frames": len(frames), "key": key, "drift": drift.to_dict(), "prompt": prompt}
            # Checked as it is made, so a blank or frozen chunk is flagged while the video goes on.
            warnings = chunk_warnings(frames, index)
            current = self._write(job.id, jobs.chunk_done(self.worker_id, chunk, record, init_key, warnings))
            announce_chunk(self.webhooks, self.settings, current, index)

        return on_chunk

    def _forget_chain_states(self, job_id: str) -> None:
        """A completed job is never run again: its chain states go (a failure here leaves them to
        the job's deletion)."""
        try:
            self._through_outages(lambda: self.storage.delete_prefix(f"{job_id}/{CHAIN_STATES}/"),
                                  f"deleting {job_id}/{CHAIN_STATES}/")
        except StorageUnavailable as exc:
            log.warning("job %s: its chain states stay until it is deleted: %s", job_id, exc)

    def _put_segment(self, job: Job, name: str, segment: Segment, timeline: Timeline) -> tuple[dict, str]:
        """Store `segment` as the stream's next, `name` (and the init segment with the first):
        (its record, the init segment's key)."""
        init_key = f"{job.id}/stream/{INIT_NAME}"
        if not timeline.media:
            self._through_outages(lambda: self.storage.put_bytes(init_key, segment.init), f"storing {init_key}")
        media = timeline.add(segment)
        key = f"{job.id}/stream/{name}.m4s"
        self._through_outages(lambda: self.storage.put_bytes(key, media), f"storing {key}")
        if len(timeline.media) == 1:
            self.metrics.first_segment.labels(job.model).observe(time.time() - job.created_at)
        return {"name": f"{name}.m4s", "key": key, "frames": segment.frames, "seconds": segment.seconds}, init_key

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

    def _store_outputs(self, job: Job, frames, timeline: Timeline, video_stored: bool) -> dict[str, str]:
        """The video (its stream's segments joined, unless its one chunk already is it), the
        thumbnail and the spritesheet."""
        with tempfile.TemporaryDirectory(prefix=f"{job.id}-") as tmp:
            video = f"{job.id}/video.mp4"
            if not video_stored:
                self._put(video, timeline.join(Path(tmp) / "video.mp4"))
            thumb = save_thumbnail(frames, Path(tmp) / "thumbnail.webp")
            sprites = save_spritesheet(frames, Path(tmp) / "spritesheet.jpg")
            return {"video": video, "thumbnail": self._put(f"{job.id}/thumbnail.webp", thumb),
                    "spritesheet": self._put(f"{job.id}/spritesheet.jpg", sprites)}

    def _store_renditions(self, job: Job, request: GenerationRequest, frames: np.ndarray,
                          timings: dict[str, float]) -> tuple[dict[str, str], dict[str, int]]:
        """Each rendition the job asks for, encoded, stored and timed (`encode.NAME` in `timings`)
        in turn: (their storage keys, their sizes). Progress moves on as each is stored, and a
        cancel stops them between two."""
        keys: dict[str, str] = {}
        sizes: dict[str, int] = {}
        renditions = job.params.outputs
        renderer = Renderer(frames, request.fps, Provenance(request.prompt, job.model, request.seed))
        # Renditions at one rate one after another: each frame rate conversion is made once
        # (and counts toward the first rendition's time).
        ordered = sorted(renditions, key=lambda r: (r.fps_mode or "", r.fps))
        with tempfile.TemporaryDirectory(prefix=f"{job.id}-") as tmp:
            for done, rendition in enumerate(ordered, 1):
                start = time.perf_counter()
                path = renderer.write(rendition, Path(tmp) / rendition.filename)
                sizes[rendition.name] = path.stat().st_size
                keys[rendition.name] = self._put(f"{job.id}/outputs/{rendition.filename}", path)
                timings[f"encode.{rendition.name}"] = time.perf_counter() - start
                self._report(job.id, DENOISE_SHARE + (ENCODED - DENOISE_SHARE) * done // len(ordered))
        return keys, sizes

    def _end_quietly(self, job: Job, reason: Exception) -> Job | None:
        current = self._update_quietly(job.id, jobs.cancelled(self.worker_id))
        if current is None or current.status is not JobStatus.cancelled:
            log.info("job %s stopped: %s", job.id, type(reason).__name__)
        if self._get(job.id) is None:
            # Deleted while running: leave nothing behind.
            self._through_outages(lambda: self.storage.delete_prefix(f"{job.id}/"), f"deleting {job.id}/")
        return current

    def _update_quietly(self, job_id: str, change) -> Job | None:
        try:
            return self._write(job_id, change)
        except (JobNotFound, InvalidTransition):
            return self._get(job_id)

    def _through_outages(self, call: Callable[[], T], what: str) -> T:
        """`call()`, retried through an outage of up to a lease: a job store outage that long
        lets the lease lapse anyway, and the lease reaper then runs the job again."""
        return through_outages(call, self.settings.lease_seconds, what)

    def _write(self, job_id: str, change: Callable[[Job], None]) -> Job:
        return self._through_outages(lambda: self.store.update(job_id, change), f"job {job_id}: job store")

    def _get(self, job_id: str) -> Job | None:
        return self._through_outages(lambda: self.store.get(job_id), f"job {job_id}: job store")

    def _read(self, key: str) -> bytes:
        return self._through_outages(lambda: self.storage.read_bytes(key), f"reading {key}")

    def _put(self, key: str, src_path: str | Path) -> str:
        return self._through_outages(lambda: self.storage.put_file(key, src_path), f"storing {key}")

    def _keep_lease(self, job_id: str) -> threading.Event:
        """Renew the lease between steps too, so one slow step never looks like a dead worker."""
        stop = threading.Event()
        interval = self.settings.lease_seconds / 3

        def beat() -> None:
            while not stop.wait(interval):
                try:
                    self.store.update(job_id, jobs.heartbeat(self.worker_id, self.settings.lease_seconds))
                except (JobNotFound, LeaseLost):
                    return
                except Exception:  # a store hiccup: the next beat tries again
                    log.warning("heartbeat for %s failed", job_id, exc_info=True)

        threading.Thread(target=beat, name=f"lease-{job_id}", daemon=True).start()
        return stop


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


def _recover_if_expired(now: float):
    def apply(job: Job) -> None:
        if job.status is not JobStatus.in_progress or (job.lease_expires_at or now) >= now:
            raise InvalidTransition(f"job {job.id} is not a lost job")
        jobs.recover(job)

    return apply
