"""The Videos API's contract: request bodies, and the lists and deletions answered beside the video
object (`vidserve.jobs.video_object.VideoObject`).

The generation options are `vidserve.options.GenerationOptions`, which these extend. They
check types and shapes; `vidserve.video_request.build_request` checks values against the model and
the server's limits (prompt length included), the same rules the CLI gets."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from vidserve.jobs.video_object import VideoObject
from vidserve.media.renditions import OutputRequest
from vidserve.options import GenerationOptions, QueueOptions
from vidserve.webhooks import EVENT_TYPES

WEBHOOK_EVENTS = tuple(sorted(EVENT_TYPES))

OUTPUTS_DESCRIPTION = ("Renditions to make beside the default H.264 MP4 (`video`): each downloads as "
                       "content?variant=NAME once the video is completed.")


class _JobFields(GenerationOptions):
    """What any job request may say beyond OpenAI's fields: the generation options, and how
    the job reports back."""

    # The API takes each option by its one name (num_inference_steps, not steps).
    model_config = ConfigDict(populate_by_name=False)

    prompt: str
    model: str | None = Field(None, min_length=1, description="A registry name; the server's default if unset.")
    outputs: list[OutputRequest] | None = Field(None, max_length=64, description=OUTPUTS_DESCRIPTION)
    webhook_url: str | None = Field(None, max_length=2048)
    webhook_events: list[Literal[WEBHOOK_EVENTS]] | None = Field(
        None, max_length=len(WEBHOOK_EVENTS), description="What the webhook receives: by default the end "
        "(video.completed, video.failed, video.cancelled); video.chunk adds each chunk as it becomes playable, "
        "naming its stream segment.")
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


class VideoCreate(_JobFields):
    """POST /v1/videos. OpenAI's `prompt`, `model`, `seconds`, `size` (and the
    `input_reference` file), then ours."""

    seconds: float | None = Field(None, description="OpenAI sends a string such as \"4\"; numbers work too.")
    size: str | None = Field(None, description="WIDTHxHEIGHT, multiples of 16.")
    fps: int | None = None
    num_frames: int | None = None


class VideoReference(BaseModel):
    id: str


class VideoExtend(_JobFields):
    """POST /v1/videos/extensions. OpenAI's `prompt`, `seconds` and `video` (a reference to
    a completed video, or an uploaded MP4 in the `video` file field), then ours. Size and
    fps are the source's; `model` (for uploads) defaults to the server's."""

    seconds: float = Field(description="Seconds to add: 4*ceil(seconds*fps/4) new frames.")
    video: VideoReference | None = None


class VideoRemix(QueueOptions):
    """POST /v1/videos/{id}/remix: the source video's job again with OpenAI's new `prompt`;
    `outputs` and `priority`, if given, in place of the source's."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    outputs: list[OutputRequest] | None = Field(None, max_length=64, description=OUTPUTS_DESCRIPTION)


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoObject]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, videos: list[VideoObject], has_more: bool) -> "VideoList":
        return cls(data=videos, first_id=videos[0].id if videos else None,
                   last_id=videos[-1].id if videos else None, has_more=has_more)


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True
