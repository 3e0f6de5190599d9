"""`docs/realtime-protocol.md`, written from the protocol's models (`api/protocol/realtime.py`), so
the page cannot drift from what the server reads and sends: `python -m vidserve.api.protocol.realtime_docs
> docs/realtime-protocol.md` (tests/test_realtime_protocol.py checks the page is its output)."""

from __future__ import annotations

import inspect
import types
from typing import Literal, Union, get_args, get_origin

from pydantic import BaseModel

from .realtime import (CLIENT_MODELS, CLOSE_CODE_MEANINGS, KEY_SUBPROTOCOL_PREFIX, PATH, SERVER_MODELS, SUBPROTOCOL,
                       ImageReference, SessionCreateMessage)
from .videos import VideoCreate

GENERATED_BY = "python -m vidserve.api.protocol.realtime_docs > docs/realtime-protocol.md"

INTRO = f"""\
`WS {PATH}` makes a video while the client watches and steers it. The client sends JSON text
messages; the server answers with JSON text messages and sends the video itself between them
as binary messages: the fMP4 init segment once, before the first `chunk.done`, then each
chunk's fragment right after that chunk's `chunk.done`. Joined, the binary messages are the
video, a fragmented MP4 that plays as one file. [Streaming and realtime](streaming.md) walks
through a session in Python.

A session is an ordinary job: retrievable, downloadable and streamable over HLS afterwards,
each chunk's prompt in `chunks[i].prompt`. Whatever ends the socket before the video ends (the
client closing it, a message over the size limit, a failure in the server) cancels the video.
A message the server refuses gets an `error` message, changes nothing, and the session goes on.

The key goes in the `Authorization: Bearer KEY` header, or, from a browser (which cannot set
one on a WebSocket), as the subprotocol `{KEY_SUBPROTOCOL_PREFIX}KEY` offered beside
`{SUBPROTOCOL}`; the server answers `{SUBPROTOCOL}` and never echoes the key.

This page is generated from the models in `api/protocol/realtime.py`
(`{GENERATED_BY}`); every message below is one of them."""


def render() -> str:
    lines = ["# Realtime protocol", "", "<!-- Generated: edit api/protocol/realtime.py, then run",
             f"     {GENERATED_BY} -->", "", INTRO, "", "## Closing codes", "", "| code | meaning |", "|---|---|"]
    lines += [f"| {int(code)} | {meaning} |" for code, meaning in CLOSE_CODE_MEANINGS.items()]
    lines += ["", "## Client to server", ""]
    for model in CLIENT_MODELS:
        lines += _message(model)
    lines += ["## Server to client", ""]
    for model in SERVER_MODELS:
        lines += _message(model)
    return "\n".join(lines).rstrip() + "\n"


def _message(model: type[BaseModel]) -> list[str]:
    kinds = " / ".join(f"`{kind}`" for kind in get_args(model.model_fields["type"].annotation))
    lines = [f"### {kinds}", "", f"`{model.__name__}`: {_paragraph(model.__doc__)}", "",
             "| field | type | description |", "|---|---|---|"]
    own = [name for name in model.model_fields if not _inherited(model, name)]
    for name in own:
        field = model.model_fields[name]
        kind = _type(field.annotation) + ("" if field.is_required() or name == "type" else ", optional")
        description = "What the message is." if name == "type" else field.description
        lines.append(f"| `{name}` | {kind} | {description} |")
    inherited = [name for name in model.model_fields if name not in own]
    if inherited:
        lines += ["", f"And every field of `POST /v1/videos` (`{VideoCreate.__name__}`, see "
                      f"[Videos, the CLI and the API](videos.md)): {', '.join(f'`{name}`' for name in inherited)}."]
    return lines + [""]


def _inherited(model: type[BaseModel], name: str) -> bool:
    return model is SessionCreateMessage and name in VideoCreate.model_fields


def _type(annotation) -> str:
    """A field's type as JSON names it."""
    origin = get_origin(annotation)
    if origin is Literal:
        return " or ".join(f'`"{value}"`' for value in get_args(annotation))
    if origin in (Union, types.UnionType):
        return " or ".join(_type(arg) for arg in get_args(annotation))
    if annotation is ImageReference:
        return "object: " + ", ".join(f"`{name}` ({_type(field.annotation)})"
                                      for name, field in ImageReference.model_fields.items())
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"the video object (`{annotation.__name__}`)"
    return {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}[annotation]


def _paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split())


if __name__ == "__main__":
    print(render(), end="")
