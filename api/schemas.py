"""The request contract of the Videos API (responses are `vidserve.jobs.video_object`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class VideoCreate(BaseModel):
    """POST /v1/videos. OpenAI's fields first, then ours."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=10_000)
    model: str | None = None
    seconds: float | None = Field(None, description="OpenAI sends a string such as \"4\"; numbers work too.")
    size: str | None = Field(None, description="WIDTHxHEIGHT, multiples of 16.")
    negative_prompt: str | None = Field(None, max_length=10_000)
    seed: int | None = None
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    fps: int | None = None
    num_frames: int | None = None
    attention: dict[str, Any] | None = Field(None, description="AttentionOptions; unset fields keep the server's.")
    webhook_url: str | None = Field(None, max_length=2048)
    metadata: dict[str, str] | None = None

    @field_validator("webhook_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return url

    @field_validator("metadata")
    @classmethod
    def _small_metadata(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is not None and (len(metadata) > 16 or any(len(k) > 64 or len(v) > 512
                                                                 for k, v in metadata.items())):
            raise ValueError("at most 16 pairs, keys up to 64 and values up to 512 characters")
        return metadata


class VideoRemix(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, max_length=10_000)
