"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from vidserve.errors import InvalidRequest, echo, from_validation_error
from vidserve.jobs import Job
from vidserve.jobs.outages import STORE_UNAVAILABLE
from vidserve.storage import StorageUnavailable

from .protocol.errors import ErrorDetail, ErrorResponse
from .services import services

log = logging.getLogger("vidserve.api")

# An outage (vidserve/jobs/outages.py) anywhere in a request is a 503 the client can retry this soon.
RETRY_AFTER_SECONDS = 5

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "invalid_request_error",
          405: "invalid_request_error", 409: "invalid_request_error", 410: "invalid_request_error",
          413: "invalid_request_error", 416: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers


def not_found(video_id: str) -> APIError:
    return APIError(404, f"no video with id {echo(video_id)}", param="video_id", code="not_found")


def video_expired(job: Job, param: str | None = None) -> APIError:
    """The video is still listed, but its files were deleted when it expired (output_ttl)."""
    return APIError(410, f"video {job.id} expired at {int(job.expires_at or 0)} (unix time) and its files are "
                    "deleted", param=param, code="video_expired")


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorResponse(error=ErrorDetail(message=message, type=_TYPES.get(status, "server_error"), param=param,
                                           code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def unavailable(message: str, code: str) -> JSONResponse:
    """A 503 for an outage: nothing is wrong with the request, and it may work in a moment."""
    return error_response(503, message, code=code, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError):
        return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)

    @app.exception_handler(InvalidRequest)
    async def invalid_request(_: Request, exc: InvalidRequest):
        return error_response(400, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError):
        error = from_validation_error(exc)
        return error_response(400, error.message, error.param, error.code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "file_too_large"}.get(exc.status_code)
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # Starlette names only the first matching route's methods
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return error_response(exc.status_code, str(exc.detail), None, code, headers)

    async def store_unavailable(request: Request, exc: Exception):
        log.warning("%s %s: job store unavailable: %s", request.method, request.url.path, exc)
        return unavailable("the job store is unavailable; retry shortly", "store_unavailable")

    for error in STORE_UNAVAILABLE:
        app.add_exception_handler(error, store_unavailable)

    @app.exception_handler(StorageUnavailable)
    async def storage_unavailable(request: Request, exc: StorageUnavailable):
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        # The client learns what is down; the endpoint and the object it failed on stay in the log.
        location = services(request).storage.location
        return unavailable(f"storage {location} is unavailable; retry shortly", StorageUnavailable.code)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, exc: Exception):
        # A bug. Starlette raises the exception again once this response is sent, so the
        # server logs its traceback; the client still gets the OpenAI shape.
        return error_response(500, "internal server error", code="internal_error")


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (several routes may share one path)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE and getattr(route, "methods", None):
            methods |= set(route.methods)
    return sorted(methods)
