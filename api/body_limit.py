"""One cap on every request body, on every route, chunked bodies included: over the limit
is an OpenAI-shaped 413, decided from Content-Length before the app runs, or, without one,
as soon as the bytes read pass the limit, so nothing past it is ever read."""

from __future__ import annotations

import re

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import error_response

_LENGTH = re.compile(r"[0-9]{1,19}")


class BodyTooLarge(HTTPException):
    """An HTTPException, so FastAPI's own body parsing (the chat route) passes it on instead of
    making it a 400, and the app's HTTPException handler shapes it."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body is larger than the {limit} byte limit")


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if _LENGTH.fullmatch(declared) and int(declared) > self.limit:  # refused unread
            response = error_response(413, BodyTooLarge(self.limit).detail, code="file_too_large")
            await response(scope, receive, send)
            return
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, receive_within_limit, send)
