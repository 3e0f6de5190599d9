"""The realtime protocol, `WS /v1/realtime/video`: a video made while the client watches and
steers it.

The client sends JSON text messages, `ClientMessage`: one of its models, told apart by `type`
and read by `CLIENT_MESSAGES`. The server answers with JSON text messages, `ServerMessage`, and
sends the video's stream between them as binary messages: the fMP4 init segment once, before the
first `chunk.done`, then each chunk's fragment right after that chunk's `chunk.done`. Joined, the
binary messages are the video, a fragmented MP4. `docs/realtime-protocol.md` is generated from
these models (`python -m vidserve.api.protocol.realtime_docs`)."""

from __future__ import annotations

from enum import IntEnum
from typing import Annotated, Literal, Union

from pydantic import BaseModel, Field, TypeAdapter

from vidserve.jobs.video_object import VideoObject

from .videos import VideoCreate

PATH = "/v1/realtime/video"
# Browsers cannot set an Authorization header on a WebSocket: they may send the key as a
# subprotocol, `vidserve.key.KEY`, beside `vidserve`. A browser that offers subprotocols closes a
# socket whose server names none back; the server answers `vidserve`, never echoing the key.
SUBPROTOCOL = "vidserve"
KEY_SUBPROTOCOL_PREFIX = "vidserve.key."


class CloseCode(IntEnum):
    """How the server closes a session's socket (WebSocket close codes): `CLOSE_CODE_MEANINGS`."""

    normal = 1000
    policy_violation = 1008
    message_too_big = 1009
    internal_error = 1011


CLOSE_CODE_MEANINGS = {
    CloseCode.normal: "The video ended and its last message was sent.",
    CloseCode.policy_violation: "No valid API key (before the session opens).",
    CloseCode.message_too_big: "A message over `VIDSERVE_MAX_BODY_BYTES`; the video is cancelled.",
    CloseCode.internal_error: "A failure in the server; the video is cancelled.",
}


# Client -> server


class ImageReference(BaseModel):
    image_url: str = Field(description="The first frame as a data URL: `data:image/png;base64,...`.")


class SessionCreateMessage(VideoCreate):
    """Start the session's video: any field `POST /v1/videos` takes, as JSON. Without `seconds` (or
    `num_frames`) it runs until stopped, at most `VIDSERVE_REALTIME_MAX_SECONDS`. Keys, quotas and
    rate limits apply here. Answered with `video.created`; one session per socket."""

    type: Literal["session.create"] = "session.create"
    image: str | None = Field(None, description="The first frame as a data URL (`data:image/png;base64,...`): the "
                              "realtime spelling of `input_reference`.")
    input_reference: ImageReference | None = Field(None, description="The first frame, as `POST /v1/videos` takes "
                                                   "it in a JSON body; it wins over `image`.")


class PromptUpdateMessage(BaseModel):
    """Steer the video: the chunks not yet begun are made from `prompt`. Answered with
    `prompt.updated`; at most `VIDSERVE_REALTIME_MAX_PROMPT_UPDATES` a session."""

    type: Literal["prompt.update"] = "prompt.update"
    prompt: str = Field(description="Non-empty, at most `VIDSERVE_MAX_PROMPT_CHARS` characters.")


class SessionStopMessage(BaseModel):
    """End the video after the chunk under way: it completes with the chunks made. Answered with
    `session.stopping`."""

    type: Literal["session.stop"] = "session.stop"


CLIENT_MODELS = (SessionCreateMessage, PromptUpdateMessage, SessionStopMessage)
ClientMessage = Annotated[Union[CLIENT_MODELS], Field(discriminator="type")]
CLIENT_MESSAGES: TypeAdapter[ClientMessage] = TypeAdapter(ClientMessage)
CLIENT_TYPES = tuple(model.model_fields["type"].default for model in CLIENT_MODELS)


# Server -> client


class VideoCreatedMessage(BaseModel):
    """The session's video exists, queued: a job like any other, retrievable, downloadable and
    streamable over HLS."""

    type: Literal["video.created"] = "video.created"
    video: VideoObject = Field(description="The video object, as `GET /v1/videos/{id}` answers.")


class VideoQueuedMessage(BaseModel):
    """While the video waits, each time its place in line changes."""

    type: Literal["video.queued"] = "video.queued"
    position: int | None = Field(description="The video object's `queue_position`.")
    estimated_start_at: int | None = Field(description="The video object's `estimated_start_at` (unix time).")


class VideoProgressMessage(BaseModel):
    """While the video is made, each time its progress moves."""

    type: Literal["video.progress"] = "video.progress"
    progress: int = Field(description="0-100 over the denoising steps, then encoding.")
    stage: Literal["generating", "encoding"] | None = Field(description="What the job is doing now.")


class ChunkDoneMessage(BaseModel):
    """A chunk is made; the next binary message is its fMP4 fragment (the first chunk's comes after
    the init segment's)."""

    type: Literal["chunk.done"] = "chunk.done"
    index: int = Field(description="The chunk's index, from 0.")
    frames: int = Field(description="Its frames.")


class PromptUpdatedMessage(BaseModel):
    """A `prompt.update` is kept."""

    type: Literal["prompt.updated"] = "prompt.updated"
    from_chunk: int = Field(description="The first chunk made from the new prompt.")


class SessionStoppingMessage(BaseModel):
    """A `session.stop` is kept: the video completes after the chunk under way."""

    type: Literal["session.stopping"] = "session.stopping"
    after_chunks: int | None = Field(description="The chunks the video will have; null if it had already ended.")


class VideoEndedMessage(BaseModel):
    """The video ended; the server closes the socket (1000) after this message."""

    type: Literal["video.completed", "video.failed", "video.cancelled"]
    video: VideoObject = Field(description="The video object, as `GET /v1/videos/{id}` answers.")

    @classmethod
    def of(cls, video: VideoObject) -> "VideoEndedMessage":
        return cls(type=f"video.{video.status}", video=video)


class VideoDeletedMessage(BaseModel):
    """The video was deleted while the session followed it; the server closes the socket (1000)."""

    type: Literal["video.deleted"] = "video.deleted"
    video_id: str = Field(description="The deleted video's id.")


class ErrorMessage(BaseModel):
    """A message was refused: it changed nothing, and the session goes on. The fields are an HTTP
    error's (`{"error": ...}`)."""

    type: Literal["error"] = "error"
    code: str = Field(description="What went wrong, for programs: `invalid_json`, `unknown_type`, `no_session`, ...")
    message: str = Field(description="What went wrong and what to do, for people.")
    param: str | None = Field(description="The field at fault, as a dotted path; null for the message as a whole.")


SERVER_MODELS = (VideoCreatedMessage, VideoQueuedMessage, VideoProgressMessage, ChunkDoneMessage, PromptUpdatedMessage,
                 SessionStoppingMessage, VideoEndedMessage, VideoDeletedMessage, ErrorMessage)
ServerMessage = Annotated[Union[SERVER_MODELS], Field(discriminator="type")]
