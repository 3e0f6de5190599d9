"""What a running video records as it goes: its chunks, its stream's segments and the prompt
updates that steer it. Typed, so every reader names a field; records stored before these
models existed (plain dicts, a segment named by its file) load into them unchanged."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from vidserve.jobs.files import segment_chunk, segment_name


class ChunkDrift(BaseModel):
    """A chunk's drift against the chunk it continues (`media.drift.DriftMetrics`, to 4 decimals)."""

    mean_luma: float = Field(description="Rec.709 luma, 0-255.")
    channel_mean: tuple[float, float, float]
    channel_std: tuple[float, float, float]
    histogram_distance: float = Field(description="Per-channel histogram distance: 0 the same, 1 no overlap.")
    sharpness: float
    luma_change: float = Field(description="Against the anchor: -0.1 is 10% darker.")
    sharpness_ratio: float = Field(description="Against the anchor: below 1 is softer.")


class ChunkRecord(BaseModel):
    """A finished chunk: its MP4 in Storage at `key`, downloadable at once."""

    model_config = ConfigDict(frozen=True)

    index: int
    frames: int
    key: str
    drift: ChunkDrift
    prompt: str | None = None  # what it was made from (a steered chunk's update)


class SegmentRecord(BaseModel):
    """One segment of the video's HLS stream, behind the job's init segment: a chunk's, or the
    `source` video's that an extension continues (`chunk` None)."""

    model_config = ConfigDict(frozen=True)

    chunk: int | None
    key: str
    frames: int
    seconds: float

    @model_validator(mode="before")
    @classmethod
    def _from_its_file_name(cls, data: Any) -> Any:
        """A record stored before `chunk` existed named its segment's file: `3.m4s`, `source.m4s`."""
        if isinstance(data, dict) and "name" in data and "chunk" not in data:
            data = {k: v for k, v in data.items() if k != "name"} | {"chunk": segment_chunk(data["name"])}
        return data

    @property
    def name(self) -> str:
        """Its file's name in the stream, as the playlist lists it."""
        return segment_name(self.chunk)


class PromptUpdate(BaseModel):
    """A realtime session's new prompt: the chunks from `from_chunk` on are made from it."""

    model_config = ConfigDict(frozen=True)

    from_chunk: int
    prompt: str
