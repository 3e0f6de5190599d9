"""The video job's record and its states.

Job state lives here, not in a queue's result backend: every change to a job is a transition
(`transitions.py`) applied through `JobStore.update`, which runs it atomically."""

from __future__ import annotations

import secrets
import time
from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from vidserve.jobs.records import ChunkRecord, PromptUpdate, SegmentRecord
from vidserve.media.quality import OutputWarning
from vidserve.params import JobParams


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
    chunks: list[ChunkRecord] = Field(default_factory=list)  # a long video's chunks as they finish
    # Its HLS stream as it grows (media/hls.py), in play order (an extension's source first, then one per
    # chunk), all behind the init segment at `stream_init_key`.
    segments: list[SegmentRecord] = Field(default_factory=list)
    stream_init_key: str | None = None
    # Realtime steering, in the order sent; a chunk runs the last one that applies.
    prompt_updates: list[PromptUpdate] = Field(default_factory=list)
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
