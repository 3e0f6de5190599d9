"""Errors that carry a message a person can act on.

`InvalidRequest` is bad input: the CLI prints it as one line and exits 2, the API turns
it into an OpenAI-shaped 4xx. It is raised before any model is touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


# How much of a client's input an error message quotes back.
ECHO_CHARS = 64


def echo(value: object) -> str:
    """Client input as an error message quotes it: its repr, cut to a short prefix, so a huge
    input never comes back whole (nor fills the logs)."""
    text = repr(value)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}... ({len(str(value))} characters)"


def _cut(part: str) -> str:
    return part if len(part) <= ECHO_CHARS else f"{part[:ECHO_CHARS]}..."


class VidserveError(Exception):
    """Base class for errors vidserve raises on purpose: a job it ends fails with `code`."""

    code = "invalid_configuration"


class InvalidRequest(VidserveError):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


def from_validation_error(exc: "ValidationError", prefix: str | None = None,
                    skip: tuple[str, ...] = ("body", "query", "path", "header")) -> InvalidRequest:
    """A pydantic error as an InvalidRequest naming the field: `param` is its dotted path
    (under `prefix`, without FastAPI's "body"/"query" location), the message says what is wrong."""
    first = exc.errors()[0]
    parts = [prefix] if prefix else []
    parts += [_cut(str(p)) for p in first.get("loc", ()) if p not in skip]  # a loc may be a client's key
    param = ".".join(parts) or None
    return InvalidRequest(f"{param}: {first['msg']}" if param else first["msg"], param=param)


class UnknownModel(InvalidRequest):
    def __init__(self, name: str, known: list[str], folder: str = "a local diffusers folder"):
        super().__init__(
            f"unknown model {echo(name)}; known models: {', '.join(known)} (or {folder})",
            param="model",
            code="model_not_found",
        )


class ModelUnavailable(VidserveError):
    """A model's weights are neither cached nor downloadable (offline, or no such repository)."""

    code = "model_unavailable"

    def __init__(self, source: str):
        super().__init__(f"model {source} is not in the local cache and could not be downloaded: fetch it with "
                         f"`hf download {source}` where there is internet (HF_HOME picks the cache), "
                         "or pass a local diffusers folder")


class EncodeFailed(VidserveError):
    """ffmpeg could not write a rendition: the job fails with this code, the worker carries on."""

    code = "encode_failed"


class JobCancelled(VidserveError):
    """Raised from the denoising-step callback when a job's cancel flag is set."""


class EngineOverloaded(VidserveError):
    """More chat requests are waiting than the LLM engine accepts; retry later (HTTP 429)."""
