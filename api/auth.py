"""API keys as `Authorization: Bearer KEY`: who is calling (a `Caller`), and their
limits: requests per minute, refused by `KeyRateLimit` before anything reads the body,
and open event streams. No keys configured: no auth, everyone sees everything (the
loopback default)."""

from __future__ import annotations

import math
from typing import Any, Callable

import anyio
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from vidserve.keys import ANONYMOUS, Caller
from vidserve.jobs.outages import STORE_UNAVAILABLE

from .errors import APIError, error_response
from .services import Services

# Where, in a request's scope, KeyRateLimit leaves a caller it has counted, so `authenticate`
# does not count it again.
_COUNTED = "vidserve.counted_caller"
STREAM_RETRY_SECONDS = 5
REFUSAL_HOLD_SECONDS = 1.0


def identify(svc: Services, headers: Headers) -> Caller | None:
    """The caller an Authorization header names: ANONYMOUS when the server has no keys,
    None for a missing or unknown key."""
    if not svc.keyring.enabled:
        return ANONYMOUS
    scheme, _, token = headers.get("authorization", "").partition(" ")
    # Headers arrive as latin-1 text, so encoding back gives the bytes sent, whatever they are.
    return svc.keyring.caller(token.strip().encode("latin-1")) if scheme.lower() == "bearer" else None


def spend(svc: Services, caller: Caller) -> float:
    """Spend one of the caller's requests: 0.0 if it had one (or has no limit), else the
    seconds until it has one again."""
    per_minute = caller.limit("requests_per_minute", svc.settings.key_requests_per_minute)
    if caller.name is None or not per_minute:
        return 0.0
    wait = svc.limiter.take(caller.name, per_minute)
    if wait > 0:
        svc.metrics.key_rejected.labels(caller.name, "requests_per_minute").inc()
    return wait


def rate_refusal(svc: Services, caller: Caller, wait: float) -> APIError:
    """The 429 for a request `wait` seconds before the caller's next one may go through."""
    per_minute = caller.limit("requests_per_minute", svc.settings.key_requests_per_minute)
    retry = max(1, math.ceil(wait))
    return APIError(429, f"API key {caller.name!r} is over its limit of {per_minute} requests per minute; "
                         f"retry in {retry} s", param="requests_per_minute", code="rate_limit_exceeded",
                    headers={"Retry-After": str(retry)})


def authenticate(request: Request) -> Caller:
    """The caller behind this request; 401 without a known key, 429 over the key's rate."""
    counted = request.scope.get(_COUNTED)
    if counted is not None:
        return counted
    svc = request.app.state.services
    caller = identify(svc, request.headers)
    if caller is None:
        raise APIError(401, "missing or invalid API key; send 'Authorization: Bearer YOUR_KEY'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    wait = spend(svc, caller)
    if wait > 0:
        raise rate_refusal(svc, caller, wait)
    return caller


def require_admin(request: Request) -> Caller:
    """For what shows the whole server (its metrics, readiness detail): an admin key, when the
    server has keys; 403 for any other key."""
    caller = authenticate(request)
    if caller.role != "admin":
        raise APIError(403, f"this needs an admin key; API key {caller.name!r} is a {caller.role} key",
                       code="admin_required")
    return caller


class KeyRateLimit:
    """Counts every request that carries a known key against that key's rate, and answers
    the 429 itself, from the headers alone: a refused request costs no body read, parse or
    route. Requests without a known key pass on to `authenticate`, which answers the 401.

    A refusal is answered once the key's next request could go through, at most
    REFUSAL_HOLD_SECONDS later. Cheap refusals alone would let a client that asks again
    the moment it is answered send thousands a second and keep the event loop from other
    keys' requests; held, each of its connections gets about one refusal a second."""

    def __init__(self, app: ASGIApp, services: Services):
        self.app, self.services = app, services

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        svc = self.services
        caller = identify(svc, Headers(scope=scope)) if scope["type"] == "http" else None
        if caller is not None and caller.name is not None:
            try:
                wait = await run_in_threadpool(spend, svc, caller) if svc.limiter.blocks else spend(svc, caller)
            except STORE_UNAVAILABLE:
                # Uncounted, so `authenticate` tries again inside the app, whose handlers make an outage a 503.
                await self.app(scope, receive, send)
                return
            if wait > 0:
                hold = min(wait, REFUSAL_HOLD_SECONDS)
                await anyio.sleep(hold)
                error = rate_refusal(svc, caller, wait - hold)
                await error_response(error.status, error.message, error.param, error.code, error.headers)(
                    scope, receive, send)
                return
            scope[_COUNTED] = caller
        await self.app(scope, receive, send)


class _ClosingStream(StreamingResponse):
    """Calls `on_close` once the response is over, however it ended: done, client gone, or an error."""

    def __init__(self, content: Any, on_close: Callable[[], None], **kwargs: Any):
        super().__init__(content, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


def capped_stream(request: Request, caller: Caller, content: Any, **kwargs: Any) -> StreamingResponse:
    """A streaming response counted among the caller's open streams while it lasts; 429 when
    the caller already has its max_streams open."""
    if caller.name is None:
        return StreamingResponse(content, **kwargs)
    svc, streams = request.app.state.services, request.app.state.streams
    limit = caller.limit("max_streams", svc.settings.key_max_streams)
    if not streams.open(caller.name, limit):
        svc.metrics.key_rejected.labels(caller.name, "max_streams").inc()
        raise APIError(429, f"API key {caller.name!r} has {limit} event streams open, its limit (max_streams "
                            f"{limit}); close one first", param="max_streams", code="too_many_streams",
                       headers={"Retry-After": str(STREAM_RETRY_SECONDS)})
    return _ClosingStream(content, lambda: streams.close(caller.name), **kwargs)
