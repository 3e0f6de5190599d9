"""The video object: a job as OpenAI's Videos API shapes a video, plus vidserve's documented
extensions. The API answers with it, and webhooks and events carry it: this model is that
contract, and the served schema's `VideoObject`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vidserve.jobs import ChunkDrift, ChunkRecord, Job, JobError, JobStatus
from vidserve.jobs.place_in_line import PlaceInLine
from vidserve.loras import LoraRequest
from vidserve.media.quality import OutputWarning
from vidserve.priorities import Priority


class VideoChunk(BaseModel):
    """A chunk of a chained video, once made."""

    index: int
    frames: int
    drift: ChunkDrift = Field(description="Drift metrics against the chunk it continues (drift.py).")
    prompt: str | None = None
    segment: str | None = Field(None, description="Its segment of the video's HLS stream (a path on this API).")

    @classmethod
    def of(cls, video_id: str, chunk: ChunkRecord, segment_name: str | None) -> "VideoChunk":
        return cls(index=chunk.index, frames=chunk.frames, drift=chunk.drift, prompt=chunk.prompt,
                   segment=segment_path(video_id, segment_name))


class VideoChunkEvent(BaseModel):
    """A chunk as `video.chunk` tells of it, on the event stream and to webhooks: made, and
    downloadable at `url` at once, while the rest of the video is still being made."""

    video_id: str
    index: int
    frames: int
    drift: ChunkDrift = Field(description="Drift metrics against the chunk it continues (drift.py).")
    prompt: str | None = Field(None, description="What it was made from, where a prompt update steered it.")
    url: str = Field(description="The chunk's MP4: `content?variant=chunk&index=N` (a path on this API).")
    segment: str | None = Field(description="Its segment of the video's HLS stream (a path on this API).")
    stream_url: str = Field(description="The video's HLS playlist (a path on this API).")

    @classmethod
    def of(cls, video_id: str, chunk: ChunkRecord, segment_name: str | None) -> "VideoChunkEvent":
        return cls(video_id=video_id, index=chunk.index, frames=chunk.frames, drift=chunk.drift, prompt=chunk.prompt,
                   url=f"/v1/videos/{video_id}/content?variant=chunk&index={chunk.index}",
                   segment=segment_path(video_id, segment_name), stream_url=stream_path(video_id))


class VideoObject(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal[tuple(status.value for status in JobStatus)]
    progress: int = Field(description="0-100 over the denoising steps, then encoding.")
    stage: str | None = Field(description="What a running job is doing now (e.g. encoding); null otherwise.")
    steps_done: int = Field(description="Denoising steps done so far, over every chunk.")
    steps_total: int = Field(description="Denoising steps the video takes: num_inference_steps per chunk.")
    created_at: int
    completed_at: int | None
    expires_at: int | None = Field(description="When its files are deleted (unix time); null: kept until deleted.")
    prompt: str
    seconds: str
    size: str
    remixed_from_video_id: str | None
    error: JobError | None
    priority: Priority
    queue_position: int | None = Field(description="While queued: its place in line, 1 for the next job to start "
                                       "on its model's workers; on a server with keys, its place among its key's "
                                       "own waiting jobs (1: its key's next); null once it starts.")
    estimated_start_at: int | None = Field(description="While queued: when it should start (unix time), from its "
                                           "model's recent job durations and the jobs ahead; null once it starts, "
                                           "before the model has run a job, and on a server with keys.")
    # Extensions: what exactly was generated, and how it went.
    warnings: list[OutputWarning] = Field(description="What looks wrong (blank, flat, frozen): in a chunk as soon as "
                                          "it is made (`chunk` names it), in the whole video once completed; and, "
                                          "from submission, what the request gives reason to doubt (a size or a "
                                          "prompt the model was not trained for).")
    negative_prompt: str | None
    num_frames: int
    fps: int
    num_inference_steps: int
    guidance_scale: float
    seed: int
    attention: dict[str, Any] = Field(description="The attention options, and `effective`: what ran.")
    cache: dict[str, Any]
    loras: list[LoraRequest]
    preset: str | None
    prompts: list[str] | None
    prompt_extend: bool
    extended_prompt: str | None
    caption_chain: bool
    drift_correction: str
    extends_video_id: str | None
    chunks: list[VideoChunk]
    stream_url: str = Field(description="The video's HLS playlist, playable while the video is made "
                                                     "(on a server with keys, with a short-lived token for players).")
    has_input_reference: bool
    outputs: list[dict[str, Any]] = Field(description="Renditions beside video, thumbnail and spritesheet: "
                                                      "content?variant=NAME once completed; `filename` is NAME with "
                                                      "its format's extension.")
    started_at: int | None
    attempts: int
    timings: dict[str, float] | None
    metadata: dict[str, str] | None

    @classmethod
    def of(cls, job: Job, stream_token: str | None = None, place: PlaceInLine | None = None) -> "VideoObject":
        """`stream_token`: what the stream URL carries, on a server with keys; `place`: where a
        queued job stands in its line."""
        p = job.params
        frames, seconds = p.source_frames + p.num_frames, p.seconds
        if job.status is JobStatus.completed and job.stop_after_chunks is not None:  # a session stopped early
            frames = p.source_frames + sum(c.frames for c in job.chunks)
            seconds = f"{frames / p.fps:g}"
        segments = {s.chunk: s.name for s in job.segments}
        return cls(
            id=job.id, model=job.model, status=job.status.value, progress=job.progress,
            stage=job.stage if job.status is JobStatus.in_progress else None,
            steps_done=job.steps_done, steps_total=p.steps * len(p.chunk_frames),
            created_at=int(job.created_at), completed_at=_unix(job.completed_at), expires_at=_unix(job.expires_at),
            prompt=job.prompt, seconds=seconds, size=f"{p.width}x{p.height}",
            remixed_from_video_id=job.remixed_from_video_id, error=job.error, warnings=job.warnings,
            priority=p.priority, queue_position=place.position if place else None,
            estimated_start_at=_unix(place.estimated_start_at) if place else None,
            negative_prompt=p.negative_prompt or None, num_frames=frames, fps=p.fps, num_inference_steps=p.steps,
            guidance_scale=p.guidance, seed=p.seed,
            attention={**p.attention.model_dump(), "effective": job.attention_effective},
            cache=p.cache.model_dump(), loras=list(p.loras), preset=p.preset, prompts=list(p.prompts) or None,
            prompt_extend=p.prompt_extend, extended_prompt=job.extended_prompt, caption_chain=p.caption_chain,
            drift_correction=p.drift_correction, extends_video_id=job.extends_video_id,
            chunks=[VideoChunk.of(job.id, c, segments.get(c.index)) for c in job.chunks],
            stream_url=stream_path(job.id) + (f"?token={stream_token}" if stream_token else ""),
            has_input_reference=job.input_image_key is not None,
            outputs=[r.describe(frames, p.fps, job.output_bytes.get(r.name)) for r in p.outputs],
            started_at=_unix(job.started_at), attempts=job.attempts, timings=job.timings or None,
            metadata=job.metadata)


class VideoProgress(BaseModel):
    """What moves while a video is made. A `video.progress` event carries `progress` and
    `steps_done`, and the others where they changed since the stream's previous event; the whole
    video object comes with each status change, and a client applies these fields over it."""

    model_config = ConfigDict(extra="forbid")

    progress: int
    stage: str | None
    steps_done: int
    chunk: int = Field(description="The chunk being made, numbered from 0 as `chunks` are.")
    estimated_denoised_at: int | None = Field(description="When denoising should end (unix time), at the pace of "
                                              "the steps so far; null before the first step and once it is done.")
    warnings: list[OutputWarning] = Field(description="The video's warnings so far (a chunk found blank, say).")

    @classmethod
    def of(cls, job: Job, now: float) -> "VideoProgress":
        p = job.params
        total = p.steps * len(p.chunk_frames)
        estimate = None
        if 0 < job.steps_done < total and job.started_at is not None:
            # An end time rather than seconds left: at a steady pace it stays put, so it is seldom sent.
            estimate = round(job.started_at + (now - job.started_at) * total / job.steps_done)
        return cls(progress=job.progress, stage=job.stage, steps_done=job.steps_done,
                   chunk=min(job.steps_done // p.steps, len(p.chunk_frames) - 1), estimated_denoised_at=estimate,
                   warnings=list(job.warnings))

    def changes_since(self, before: "VideoProgress") -> str:
        """The event's data: the step and progress, and the other fields that differ from `before`."""
        return self.model_dump_json(include={name for name in type(self).model_fields if name in ("progress",
                                             "steps_done") or getattr(self, name) != getattr(before, name)})


def stream_path(video_id: str) -> str:
    return f"/v1/videos/{video_id}/stream.m3u8"


def segment_path(video_id: str, name: str | None) -> str | None:
    return f"/v1/videos/{video_id}/stream/{name}" if name else None


def _unix(seconds: float | None) -> int | None:
    return int(seconds) if seconds else None
