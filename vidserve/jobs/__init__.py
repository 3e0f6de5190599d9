"""The video job: its record, its state machine, and the JobStore contract.

Job state lives here, not in a queue's result backend. Every change to a job is a
transition function applied through `JobStore.update`, which runs it atomically
(read, apply, write) so two workers, or a worker and a cancel request, never race.

    queued ──start──> in_progress ──complete──> completed
      │                  │  ├──────fail──────> failed
      │                  │  └──cancelled─────> cancelled
      │                  ├──release (an outage)──> lease lapsed at once, then as below
      │                  └──lease lost──> queued again (or failed, attempts used up)
      └──cancel──> cancelled
"""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Iterable, Literal

from pydantic import BaseModel, Field, field_validator

from vidserve.params import JobParams
from vidserve.media.quality import OutputWarning, video_warnings


class JobStatus(str, Enum):
    queued = "queued"
    in_progress = "in_progress"
    completed = "completed"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.completed, JobStatus.failed, JobStatus.cancelled)


class JobError(BaseModel):
    code: str
    message: str


class Job(BaseModel):
    id: str = Field(default_factory=lambda: "video_" + secrets.token_hex(12))
    model: str
    prompt: str
    status: JobStatus = JobStatus.queued
    progress: int = 0  # 0-100, advanced per denoising step, then per rendition encoded
    steps_done: int = 0  # denoising steps done, over every chunk
    stage: Literal["generating", "encoding"] | None = None  # what a running job is doing
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    completed_at: float | None = None
    expires_at: float | None = None  # a completed video's files are deleted after this (None: kept until deleted)
    expired: bool = False  # the expiry sweeper has deleted its files
    params: JobParams  # what to generate, resolved and validated
    input_image_key: str | None = None  # storage key of an uploaded first frame
    outputs: dict[str, str] = Field(default_factory=dict)  # variant ("video", "thumbnail", a rendition) -> storage key
    output_bytes: dict[str, int] = Field(default_factory=dict)  # rendition -> its file's size
    # Chunks of a long video as they finish: {"index", "frames", "key", "drift"}; downloadable at once.
    chunks: list[dict[str, Any]] = Field(default_factory=list)
    # Its HLS stream as it grows (media/hls.py): {"name", "key", "frames", "seconds"} per segment, in play
    # order (an extension's source first, then one per chunk), all behind the init segment at `stream_init_key`.
    segments: list[dict[str, Any]] = Field(default_factory=list)
    stream_init_key: str | None = None
    # Realtime steering: {"from_chunk", "prompt"} in the order sent; a chunk runs the last one that applies.
    prompt_updates: list[dict[str, Any]] = Field(default_factory=list)
    chunks_started: int = 0  # chunks a running job has begun: an update applies from the next one
    stop_after_chunks: int | None = None  # end the video (completed) once this many chunks are done
    source_video_key: str | None = None  # the MP4 an extension continues (copied or uploaded)
    extends_video_id: str | None = None
    error: JobError | None = None
    # Chunks that look wrong as they are made, then the video once completed (quality.py).
    warnings: list[OutputWarning] = Field(default_factory=list)
    attention_effective: Literal["sparse", "dense"] | None = None  # the self-attention that ran, once completed
    extended_prompt: str | None = None  # the LLM's rewrite of `prompt` (prompt_extend), what was generated
    attempts: int = 0
    max_attempts: int = 2
    worker_id: str | None = None
    lease_expires_at: float | None = None  # a running job whose lease lapses has lost its worker
    cancel_requested: bool = False
    timings: dict[str, float] = Field(default_factory=dict)
    idempotency_key: str | None = None
    request_hash: str | None = None  # of the request body, to tell a retry from a reuse of the key
    webhook_url: str | None = None
    webhook_events: list[str] | None = None  # the events its webhook receives (None: the terminal ones)
    metadata: dict[str, str] | None = None
    remixed_from_video_id: str | None = None
    owner: str | None = None  # the name of the API key that made it (None: a server without keys)
    share: float = 1.0  # its owner's weight in the fair share of workers, as the keys file said at submission

    @field_validator("attention_effective", mode="before")
    @classmethod
    def _topk_means_sparse(cls, effective):
        return "sparse" if effective == "topk" else effective  # "topk": the sparse mode's other name

    def is_expired(self, now: float | None = None) -> bool:
        """Whether its files are gone, or due to go: past expires_at, swept or not yet."""
        if self.expired:
            return True
        return self.expires_at is not None and self.expires_at <= (time.time() if now is None else now)


class InvalidTransition(Exception):
    """The job is not in a state that allows this change (e.g. completing a cancelled job)."""


class LeaseLost(InvalidTransition):
    """A worker changed a job it no longer holds: requeued after its lease lapsed, or ended meanwhile."""


class JobNotFound(Exception):
    """No job has this id (never created, or deleted)."""

    def __init__(self, job_id: str):
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


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


def chunk_done(worker_id: str, chunk: dict[str, Any], segment: dict[str, Any] | None = None,
               init_key: str | None = None, warnings: Iterable[OutputWarning] = ()) -> Callable[[Job], None]:
    """Chunk `chunk["index"]` is stored; with `segment`, so is its stream segment (behind `init_key`);
    `warnings`: what looks wrong in it."""
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.chunks = _replaced(job.chunks, dict(chunk), lambda c: c["index"] == chunk["index"])
        job.warnings = [w for w in job.warnings if w.chunk != chunk["index"]] + list(warnings)
        if segment is not None:
            segment_done(worker_id, segment, init_key)(job)

    return apply


def segment_done(worker_id: str, segment: dict[str, Any], init_key: str | None) -> Callable[[Job], None]:
    def apply(job: Job) -> None:
        _held_by(job, worker_id)
        job.segments = _replaced(job.segments, dict(segment), lambda s: s["name"] == segment["name"])
        job.stream_init_key = init_key

    return apply


def _replaced(records: list[dict[str, Any]], record: dict[str, Any], same: Callable[[dict[str, Any]], bool]
              ) -> list[dict[str, Any]]:
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
    """Steer a job: its chunks not yet begun are made from `prompt` (`prompt_updates[-1]["from_chunk"]`
    says from which). Past `max_updates` updates (None: no cap), PromptUpdatesUsedUp."""
    def apply(job: Job) -> None:
        if job.status.terminal or job.stop_after_chunks is not None:
            raise InvalidTransition(f"job {job.id} is {'stopping' if not job.status.terminal else job.status.value}; "
                                    "its prompt can no longer change")
        if max_updates is not None and len(job.prompt_updates) >= max_updates:
            raise PromptUpdatesUsedUp(f"video {job.id} has had the {max_updates} prompt updates a session may send "
                                      "(VIDSERVE_REALTIME_MAX_PROMPT_UPDATES); its chunks to come keep the last one")
        job.prompt_updates = [*job.prompt_updates, {"from_chunk": job.chunks_started, "prompt": prompt}]

    return apply


def request_stop(job: Job) -> None:
    """End the video once the chunk under way is done (at least one chunk): it completes with what was made."""
    if job.status.terminal or job.stop_after_chunks is not None:
        return
    job.stop_after_chunks = max(job.chunks_started, 1)


def steered_prompt(job: Job, index: int) -> str | None:
    """The prompt the latest update sets for chunk `index`; None where no update reaches it."""
    applying = [u["prompt"] for u in job.prompt_updates if u["from_chunk"] <= index]
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


class WebhookDelivery(BaseModel):
    """A webhook event on its way, kept in the JobStore until it is delivered or given up,
    so that a restarted server sends it again."""

    url: str
    event_id: str
    body: str  # the event's JSON, byte for byte what every attempt sends


def check_page(order: str, limit: int) -> None:
    """A page of `JobStore.list` as every store takes it."""
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    if limit < 1:
        raise ValueError("limit must be at least 1")


@dataclass(frozen=True)
class AdmissionLimits:
    """What a new job must fit within, checked by `JobStore.create` in the step that stores it:
    a count taken apart from the insert lets a burst of creates all see room for one more."""

    max_queued: int | None = None  # jobs queued, every owner's
    max_active: int | None = None  # its owner's jobs queued or running (None or 0, or no owner: no limit)


class QuotaExceeded(Exception):
    """`JobStore.create` refused a job: `count` jobs already fill `limit`, which allows `allowed`."""

    def __init__(self, limit: Literal["max_queued", "max_active_jobs"], count: int, allowed: int):
        super().__init__(f"{limit}: {count} of {allowed}")
        self.limit, self.count, self.allowed = limit, count, allowed


class JobStore(ABC):
    """Where job records live. Implementations: SQLite (embedded), Redis (distributed)."""

    @abstractmethod
    def create(self, job: Job, limits: AdmissionLimits | None = None) -> tuple[Job, bool]:
        """Insert `job`. With an idempotency key already taken, return (existing, False) instead:
        a retry of an accepted request is no new job, whatever the limits. Otherwise, where a
        limit of `limits` is already reached, QuotaExceeded, and nothing is stored. One atomic
        step, across every process on the store."""

    @abstractmethod
    def get(self, job_id: str) -> Job | None: ...

    @abstractmethod
    def update(self, job_id: str, change: Callable[[Job], None]) -> Job:
        """Atomically load, apply `change` (which may raise InvalidTransition), save; JobNotFound if missing."""

    @abstractmethod
    def delete(self, job_id: str) -> bool: ...

    @abstractmethod
    def list(self, after: str | None = None, limit: int = 20, order: str = "desc",
             owner: str | None = None) -> tuple[list[Job], bool]:
        """A page of jobs by creation order (only `owner`'s, if given), starting after the job
        `after` (JobNotFound if there is no such job among them); and whether more follow."""

    @abstractmethod
    def with_status(self, statuses: Iterable[JobStatus]) -> list[Job]:
        """All jobs in these states, oldest first (recovery, queue depth, metrics)."""

    @abstractmethod
    def add_delivery(self, delivery: WebhookDelivery) -> str:
        """Record a webhook delivery to make; its id, for delivery_done."""

    @abstractmethod
    def pending_deliveries(self) -> list[tuple[str, WebhookDelivery]]:
        """(id, delivery) for each recorded delivery not yet done, oldest first."""

    @abstractmethod
    def delivery_done(self, delivery_id: str) -> None:
        """Forget a delivery: delivered, or given up."""

    @abstractmethod
    def try_lock(self, name: str, seconds: float, token: str) -> bool:
        """Take the lock `name` for `token` if it is free (or its holder's time ran out), for
        `seconds`; whether it was taken. One holder at a time across every process on the store."""

    @abstractmethod
    def unlock(self, name: str, token: str) -> None:
        """Free the lock `name` if `token` still holds it (never another holder's, taken after a lapse)."""

    def incarnation(self) -> str | None:
        """What changes when the store restarts (and may have lost its last acknowledged
        writes); None for a store that never loses them."""
        return None

    def count_by_status(self) -> dict[JobStatus, int]:
        return {status: len(self.with_status([status])) for status in JobStatus}

    def close(self) -> None:
        pass
