"""Every change to a job, as a function applied through `JobStore.update`, which runs it
atomically (read, apply, write): two workers, or a worker and a cancel request, never race.
A transition refuses a job not in a state that allows it (InvalidTransition)."""

from __future__ import annotations

import time
from typing import Callable, Iterable, TypeVar

from vidserve.jobs.job import Job, JobError, JobStatus
from vidserve.jobs.records import ChunkRecord, PromptUpdate, SegmentRecord
from vidserve.media.quality import OutputWarning, video_warnings

R = TypeVar("R", ChunkRecord, SegmentRecord)


class InvalidTransition(Exception):
    """The job is not in a state that allows this change (e.g. completing a cancelled job)."""


class LeaseLost(InvalidTransition):
    """A worker changed a job it no longer holds: requeued after its lease lapsed, or ended meanwhile."""


def _require(job: Job, *allowed: JobStatus) -> None:
    if job.status not in allowed:
        raise InvalidTransition(f"job {job.id} is {job.status.value}; expected {', '.join(s.value for s in allowed)}")


def _held_by(job: Job, worker_id: str) -> None:
    if job.status is not JobStatus.in_progress or job.worker_id != worker_id:
        raise LeaseLost(f"job {job.id} is {job.status.value}, held by {job.worker_id}, not {worker_id}")


# Transitions. Each mutates the job it is given and is applied through JobStore.update.


def start(worker_id: str, lease_seconds: float) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _require(job, JobStatus.queued)
        now = time.time()
        job.status, job.worker_id, job.attempts = JobStatus.in_progress, worker_id, job.attempts + 1
        job.started_at, job.lease_expires_at, job.progress, job.error = now, now + lease_seconds, 0, None
        # A rerun (its worker lost) keeps the chunks and segments made, and their warnings: it goes
        # on from them, and one it makes again replaces its record in place, so the stream never shrinks.
        job.stage, job.steps_done = "generating", 0

    return apply


def heartbeat(worker_id: str, lease_seconds: float, progress: int | None = None,
              stage: str | None = None, steps_done: int | None = None) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.lease_expires_at = time.time() + lease_seconds
        if progress is not None:
            job.progress = max(job.progress, min(progress, 100))
        if stage is not None:
            job.stage = stage
        if steps_done is not None:
            job.steps_done = max(job.steps_done, steps_done)

    return apply


def chunk_done(worker_id: str, chunk: ChunkRecord, segment: SegmentRecord | None = None,
               init_key: str | None = None, warnings: Iterable[OutputWarning] = ()) -> Callable[[Job], None]:
    """`chunk` is stored; with `segment`, so is its stream segment (behind `init_key`);
    `warnings`: what looks wrong in it."""
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.chunks = _replaced(job.chunks, chunk, lambda c: c.index == chunk.index)
        job.warnings = [w for w in job.warnings if w.chunk != chunk.index] + list(warnings)
        if segment is not None:
            segment_done(worker_id, segment, init_key)(job)

    return apply


def segment_done(worker_id: str, segment: SegmentRecord, init_key: str | None) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.segments = _replaced(job.segments, segment, lambda s: s.chunk == segment.chunk)
        job.stream_init_key = init_key

    return apply


def _replaced(records: list[R], record: R, same: Callable[[R], bool]) -> list[R]:
    """`records` with `record` where the one it replaces was (a chunk made again keeps its place
    in the stream), or after them if none is."""
    if not any(same(r) for r in records):
        return [*records, record]
    return [record if same(r) else r for r in records]


def chunk_started(worker_id: str, index: int) -> Callable[[Job], None]:
    """The worker begins chunk `index`: from now on a prompt update applies from the next one."""
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.chunks_started = max(job.chunks_started, index + 1)

    return apply


class PromptUpdatesUsedUp(InvalidTransition):
    """A job already holds as many prompt updates as it may: each is kept in its record."""


def update_prompt(prompt: str, max_updates: int | None = None) -> Callable[[Job], None]:
    """Steer a job: its chunks not yet begun are made from `prompt` (`prompt_updates[-1].from_chunk`
    says from which). Past `max_updates` updates (None: no cap), PromptUpdatesUsedUp."""
    def apply(job: Job) -> None:
        if job.status.terminal or job.stop_after_chunks is not None:
            raise InvalidTransition(f"job {job.id} is {'stopping' if not job.status.terminal else job.status.value}; "
                                    "its prompt can no longer change")
        if max_updates is not None and len(job.prompt_updates) >= max_updates:
            raise PromptUpdatesUsedUp(f"video {job.id} has had the {max_updates} prompt updates a session may send "
                                      "(VIDSERVE_REALTIME_MAX_PROMPT_UPDATES); its chunks to come keep the last one")
        job.prompt_updates = [*job.prompt_updates, PromptUpdate(from_chunk=job.chunks_started, prompt=prompt)]

    return apply


def request_stop(job: Job) -> None:
    """End the video once the chunk under way is done (at least one chunk): it completes with what was made."""
    if job.status.terminal or job.stop_after_chunks is not None:
        return
    job.stop_after_chunks = max(job.chunks_started, 1)


def steered_prompt(job: Job, index: int) -> str | None:
    """The prompt the latest update sets for chunk `index`; None where no update reaches it."""
    applying = [u.prompt for u in job.prompt_updates if u.from_chunk <= index]
    return applying[-1] if applying else None


def prompt_extended(worker_id: str, extended: str) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.extended_prompt = extended

    return apply


def complete(worker_id: str, outputs: dict[str, str], timings: dict[str, float],
             warnings: Iterable[OutputWarning] = (), output_ttl: float = 0,
             attention: str | None = None, output_bytes: dict[str, int] | None = None) -> Callable[[Job], None]:
    """`warnings`: the whole video's, kept beside its chunks' (quality.video_warnings); `output_ttl`:
    seconds the files are kept after completion (0: until the video is deleted); `attention`: the
    self-attention that ran ("sparse", or "dense" where too few tokens made it so); `output_bytes`:
    each rendition's size."""
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.status, job.progress, job.completed_at = JobStatus.completed, 100, time.time()
        job.expires_at = job.completed_at + output_ttl if output_ttl > 0 else None
        job.outputs, job.timings, job.lease_expires_at = dict(outputs), dict(timings), None
        job.output_bytes = dict(output_bytes or {})
        job.warnings, job.attention_effective = video_warnings(list(warnings), job.warnings), attention

    return apply


def expire(now: float) -> Callable[[Job], None]:
    """Its files have been deleted: the record stays, completed, without outputs."""
    def apply(job: Job) -> None:
        _require(job, JobStatus.completed)
        if not job.is_expired(now):
            raise InvalidTransition(f"job {job.id} expires at {job.expires_at}, not by {now}")
        job.expired, job.outputs = True, {}

    return apply


def fail(worker_id: str, code: str, message: str) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.status, job.completed_at, job.lease_expires_at = JobStatus.failed, time.time(), None
        job.error = JobError(code=code, message=message)

    return apply


def release(worker_id: str, code: str, message: str) -> Callable[[Job], None]:
    """The worker gives the job up for a reason that is not the job's (its storage stayed out of
    reach): its lease lapses at once, so the lease reaper runs it again as it would a lost
    worker's job; with its attempts used up it fails with `code` instead of worker_lost."""
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        now = time.time()
        if job.attempts < job.max_attempts:
            # No worker holds it now: a heartbeat racing this one cannot renew the lease.
            job.worker_id, job.lease_expires_at = None, now
        elif job.cancel_requested:
            job.status, job.completed_at, job.lease_expires_at = JobStatus.cancelled, now, None
        else:
            job.status, job.completed_at, job.lease_expires_at = JobStatus.failed, now, None
            job.error = JobError(code=code, message=f"{message} ({job.attempts} attempts)")

    return apply


def request_cancel(job: Job) -> None:
    """A queued job is cancelled at once; a running one at its next denoising step."""
    if job.status.terminal:
        return
    job.cancel_requested = True
    if job.status is JobStatus.queued:
        job.status, job.completed_at = JobStatus.cancelled, time.time()


def cancelled(worker_id: str) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.status, job.completed_at, job.lease_expires_at = JobStatus.cancelled, time.time(), None

    return apply


def recover(job: Job) -> None:
    """A running job lost its worker: run it again, or fail it when its attempts are used up."""
    _require(job, JobStatus.in_progress)
    job.lease_expires_at, job.worker_id = None, None
    if job.cancel_requested:
        job.status, job.completed_at = JobStatus.cancelled, time.time()
    elif job.attempts >= job.max_attempts:
        job.status, job.completed_at = JobStatus.failed, time.time()
        job.error = JobError(code="worker_lost",
                             message=f"the worker died while running this job, {job.attempts} times")
    else:
        job.status, job.progress = JobStatus.queued, 0
