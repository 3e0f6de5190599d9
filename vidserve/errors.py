"""Errors that carry a message a person can act on.

`InvalidRequest` is bad input: the CLI prints it as one line and exits 2, the API turns
it into an OpenAI-shaped 4xx. It is raised before any model is touched.
"""

from __future__ import annotations


class VidserveError(Exception):
    """Base class for errors vidserve raises on purpose."""


class InvalidRequest(VidserveError):
    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class UnknownModel(InvalidRequest):
    def __init__(self, name: str, known: list[str], folder: str = "a local diffusers folder"):
        super().__init__(
            f"unknown model {name!r}; known models: {', '.join(known)} (or {folder})",
            param="model",
            code="model_not_found",
        )


class JobCancelled(VidserveError):
    """Raised from the denoising-step callback when a job's cancel flag is set."""


class EngineOverloaded(VidserveError):
    """More chat requests are waiting than the LLM engine accepts; retry later (HTTP 429)."""
