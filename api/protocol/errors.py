"""The error every route answers, whatever its status: OpenAI's shape; and what each status
means, for the routes to list the ones they answer (`errors`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """Every error the API answers, whatever its status: OpenAI's shape."""

    error: ErrorDetail


MEANINGS = {
    400: "Invalid request: the message names the parameter.",
    401: "Missing or unknown API key.",
    403: "The API key is not an admin key, may not ask for this priority (param priority), or a stream token "
         "is invalid or expired.",
    404: "No such video (another key's videos are not found either), or no such model.",
    409: "The video is not in a state that allows this.",
    410: "The video expired (code video_expired): its files are deleted, its record stays.",
    413: "Request body over the size limit.",
    416: "Range not satisfiable.",
    422: "An Idempotency-Key reused with a different body.",
    429: "Over a quota or rate limit, or the queue is full: see Retry-After.",
    500: "A bug: an OpenAI-shaped error, with the traceback in the server log.",
    503: "The job store, the storage or a model is unavailable: see Retry-After.",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """A route's `responses=` for the error statuses it answers: each an ErrorResponse, described."""
    return {status: {"model": ErrorResponse, "description": MEANINGS[status]} for status in statuses}
