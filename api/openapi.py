"""The served OpenAPI schema, made true to what the server does.

The video routes read their bodies themselves (JSON, or multipart with files, see
`forms.read_body`), so FastAPI cannot see them: their request bodies are added here from
the same pydantic models `forms.validate` checks. Errors are OpenAI-shaped 4xx/5xx, never
FastAPI's 422, so each operation documents the statuses it really answers instead.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from vidserve.media.formats import FORMATS

from .chat_schemas import ChatCompletionChunk
from .forms import JSON_FIELDS
from .responses import ErrorResponse
from .schemas import VideoCreate, VideoExtend, VideoRemix

# (path, method) -> (body model, its file fields in multipart). Remix takes JSON only.
BODIES: dict[tuple[str, str], tuple[type[BaseModel], tuple[str, ...]]] = {
    ("/v1/videos", "post"): (VideoCreate, ("input_reference",)),
    ("/v1/videos/extensions", "post"): (VideoExtend, ("video",)),
    ("/v1/videos/{video_id}/remix", "post"): (VideoRemix, ()),
}

_MEANINGS = {
    "400": "Invalid request: the message names the parameter.",
    "401": "Missing or unknown API key.",
    "403": "The API key is not an admin key, may not ask for this priority (param priority), or a stream token "
           "is invalid or expired.",
    "404": "No such video (another key's videos are not found either), or no such model.",
    "405": "Method not allowed.",
    "409": "The video is not in a state that allows this.",
    "410": "The video expired (code video_expired): its files are deleted, its record stays.",
    "413": "Request body over the size limit.",
    "416": "Range not satisfiable.",
    "422": "An Idempotency-Key reused with a different body.",
    "429": "Over a quota or rate limit, or the queue is full: see Retry-After.",
    "500": "A bug: an OpenAI-shaped error, with the traceback in the server log.",
    "503": "The job store, the storage or a model is unavailable: see Retry-After.",
}
# Every route caps its body, chunked or not; every API route can answer _COMMON too; each
# route adds its own below.
_EVERY = ("413",)
_COMMON = ("400", "401", "429", "500", "503")
_ROUTE_ERRORS = {
    ("/v1/videos", "post"): ("403", "422"),
    ("/v1/videos/extensions", "post"): ("403", "404", "409", "410"),
    ("/v1/videos/{video_id}", "get"): ("404",),
    ("/v1/videos/{video_id}", "delete"): ("404",),
    ("/v1/videos/{video_id}/cancel", "post"): ("404", "409"),
    ("/v1/videos/{video_id}/content", "get"): ("404", "409", "410", "416"),
    ("/v1/videos/{video_id}/remix", "post"): ("403", "404", "410"),
    ("/v1/videos/{video_id}/events", "get"): ("404",),
    ("/v1/videos/{video_id}/stream.m3u8", "get"): ("403", "404", "410"),
    ("/v1/videos/{video_id}/stream/{name}", "get"): ("403", "404", "409", "410", "416"),
    ("/v1/chat/completions", "post"): ("404",),
    ("/readyz", "get"): ("503",),
    ("/metrics", "get"): ("401", "403", "429"),
}

# One event of a streamed chat answer: its data is a chunk, or the error that ended the
# answer, as JSON; or OpenAI's closing `[DONE]`.
_CHAT_EVENT = {"type": "object", "required": ["data"], "properties": {"data": {"anyOf": [
    {"const": "[DONE]"},
    {"type": "string", "contentMediaType": "application/json", "contentSchema": {"oneOf": [
        {"$ref": "#/components/schemas/ChatCompletionChunk"}, {"$ref": "#/components/schemas/ErrorResponse"}]}}]}}}

# What the successes carry where it is not JSON (or not only JSON): a variant's file.
_CONTENT = {media_type: {"schema": {"type": "string", "format": "binary"}}
            for media_type in ["video/mp4", "image/webp", "image/jpeg", *(f.media_type for f in FORMATS.values())]}
_SUCCESSES = {
    ("/v1/videos/{video_id}/content", "get"): {
        "200": {"description": "The file: video/mp4, image/webp for the thumbnail, image/jpeg for the spritesheet, "
                               "or a rendition's own media type.", "content": _CONTENT},
        "206": {"description": "The asked byte range of the file.", "content": _CONTENT},
        "307": {"description": "With VIDSERVE_CONTENT_REDIRECT and S3 storage: Location is a presigned URL "
                               "of the file.", "headers": {"Location": {"schema": {"type": "string"}}}}},
    ("/v1/videos/{video_id}/events", "get"): {
        "200": {"description": "Server-Sent Events until the video ends.", "content": {"text/event-stream": {}}}},
    ("/v1/videos/{video_id}/stream.m3u8", "get"): {
        "200": {"description": "An HLS media playlist (version 7, fMP4): EVENT while the video is made, ended once "
                               "it is completed, failed or cancelled.",
                "content": {"application/vnd.apple.mpegurl": {"schema": {"type": "string"}}}}},
    ("/v1/videos/{video_id}/stream/{name}", "get"): {
        "200": {"description": "The init segment (init.mp4) or a media segment (N.m4s, source.m4s).",
                "content": {t: {"schema": {"type": "string", "format": "binary"}} for t in ("video/mp4",
                                                                                          "video/iso.segment")}},
        "206": {"description": "The asked byte range of the segment."},
        "307": {"description": "With VIDSERVE_CONTENT_REDIRECT and S3 storage: Location is a presigned URL of the "
                               "segment.", "headers": {"Location": {"schema": {"type": "string"}}}}},
    ("/v1/chat/completions", "post"): {
        "200": {"description": "A chat.completion, or with stream=true chat.completion.chunk events.",
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletion"}},
                            "text/event-stream": {"schema": _CHAT_EVENT}}}},
}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi


def build(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    bodies = [(model, "validation") for model, _ in BODIES.values()]
    _, defs = models_json_schema([*bodies, (ErrorResponse, "serialization"), (ChatCompletionChunk, "serialization")],
                                 ref_template="#/components/schemas/{model}")
    components.update(defs.get("$defs", {}))
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                          "description": "An API key, when the server has any."}}
    # A JSON body may carry the first frame too, as a data URL (forms.read_body takes it out).
    components["VideoCreate"]["properties"]["input_reference"] = {
        "type": "string", "description": "The first frame as a data: URL (image/png, image/jpeg, image/webp)."}
    for (path, method), (model, files) in BODIES.items():
        schema["paths"][path][method]["requestBody"] = _request_body(model, files)
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)  # FastAPI's validation error; ours are 400s
            responses.update(_SUCCESSES.get((path, method), {}))
            common = _COMMON if path.startswith("/v1/") else ()
            if common:
                operation["security"] = [{"bearer": []}, {}]  # {}: a server without keys takes anyone
            for status in _EVERY + common + _ROUTE_ERRORS.get((path, method), ()):
                responses[status] = {"description": _MEANINGS[status], "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}}
    return schema


def _request_body(model: type[BaseModel], files: tuple[str, ...]) -> dict[str, Any]:
    """JSON as the model says; multipart with every field a string (JSON text for the
    structured ones) and the files as binary parts."""
    json_body: dict[str, Any] = {"$ref": f"#/components/schemas/{model.__name__}"}
    content = {"application/json": {"schema": json_body}}
    if files:
        fields = model.model_json_schema()["properties"]
        form = {name: {"type": "string", "description": "JSON" if name in JSON_FIELDS
                       else field.get("description", "")} for name, field in fields.items()}
        form.update({name: {"type": "string", "format": "binary"} for name in files})
        content["multipart/form-data"] = {"schema": {
            "type": "object", "properties": form, "required": sorted(model.model_json_schema().get("required", []))}}
    return {"required": True, "content": content}
