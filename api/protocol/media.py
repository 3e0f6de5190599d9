"""The answers that are not one JSON object, as each route's `responses=` documents them: files
(whole, a byte range, or a redirect to storage), the HLS playlist and segments, Server-Sent
Events, Prometheus' text.

What "names a schema" means for them: a file is `{"type": "string", "format": "binary"}` under
its media type (OpenAPI's binary body); a playlist or metrics page is a string, described; an
event stream is one event as an object whose `data` is JSON text whose `contentSchema` names
the models it may carry (`$ref`s, which `STREAMED_MODELS` puts in the schema's components)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from vidserve.jobs import JobStatus
from vidserve.jobs.video_object import VideoChunkEvent, VideoProgress
from vidserve.media.formats import FORMATS

from .chat import ChatCompletionChunk

# Models that only event streams carry: no route's response_model brings them into the schema.
STREAMED_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionChunk, VideoChunkEvent, VideoProgress)

PLAYLIST_TYPE = "application/vnd.apple.mpegurl"
SEGMENT_TYPES = {".mp4": "video/mp4", ".m4s": "video/iso.segment"}
Responses = dict[int | str, dict[str, Any]]


def _ref(model: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model}"}


def _binary(media_types: list[str]) -> dict[str, Any]:
    return {media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in media_types}


def _files(what: str, media_types: list[str], described: str) -> Responses:
    """A stored file's answers: whole, a byte range of it, or a redirect to the storage."""
    return {
        200: {"description": described, "content": _binary(media_types)},
        206: {"description": f"The asked byte range of the {what}.", "content": _binary(media_types)},
        307: {"description": f"With VIDSERVE_CONTENT_REDIRECT and S3 storage: Location is a presigned URL of the "
                             f"{what}.", "headers": {"Location": {"schema": {"type": "string"}}}}}


def _json_text(*models: str) -> dict[str, Any]:
    """An event's data: JSON text of one of these models."""
    one_of = [_ref(model) for model in models]
    return {"type": "string", "contentMediaType": "application/json",
            "contentSchema": one_of[0] if len(one_of) == 1 else {"oneOf": one_of}}


CONTENT = _files("file", ["video/mp4", "image/webp", "image/jpeg", *(f.media_type for f in FORMATS.values())],
                 "The file: video/mp4, image/webp for the thumbnail, image/jpeg for the spritesheet, or a "
                 "rendition's own media type.")

SEGMENT = _files("segment", list(SEGMENT_TYPES.values()),
                 "The init segment (init.mp4) or a media segment (N.m4s, source.m4s).")

PLAYLIST: Responses = {200: {
    "description": "An HLS media playlist (version 7, fMP4): EVENT while the video is made, ended once it is "
                   "completed, failed or cancelled.",
    "content": {PLAYLIST_TYPE: {"schema": {"type": "string", "description": "An M3U8 playlist (RFC 8216)."}}}}}

VIDEO_EVENTS: Responses = {200: {
    "description": "Server-Sent Events until the video ends: video.<status> (the video object), video.progress "
                   "(progress and steps_done, and the other fields of VideoProgress that changed), video.chunk, "
                   "and video.deleted if it is deleted meanwhile.",
    "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["event", "data"], "properties": {
            "event": {"enum": [*(f"video.{status.value}" for status in JobStatus), "video.progress",
                               "video.chunk", "video.deleted"]},
            "data": _json_text("VideoObject", "VideoProgress", "VideoChunkEvent", "VideoDeleted")}}}}}}

# One event of a streamed chat answer: its data is a chunk, or the error that ended the answer,
# as JSON; or OpenAI's closing `[DONE]`.
CHAT_EVENTS: Responses = {200: {
    "description": "A chat.completion, or with stream=true chat.completion.chunk events.",
    "content": {"text/event-stream": {"schema": {
        "type": "object", "required": ["data"], "properties": {"data": {"anyOf": [
            {"const": "[DONE]"}, _json_text("ChatCompletionChunk", "ErrorResponse")]}}}}}}}

METRICS: Responses = {200: {
    "description": "Prometheus text format.",
    "content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string",
                                                 "description": "Prometheus' text exposition format."}}}}}
