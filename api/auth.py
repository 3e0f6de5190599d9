"""API keys as `Authorization: Bearer KEY`: who is calling (a `Caller`), and their
requests-per-minute limit. No keys configured: no auth, everyone sees everything
(the loopback default)."""

from __future__ import annotations

import math

from fastapi import Request

from vidserve.keys import ANONYMOUS, Caller

from .errors import APIError


def authenticate(request: Request) -> Caller:
    """The caller behind this request; 401 without a known key, 429 over the key's rate."""
    svc = request.app.state.services
    if not svc.keyring.enabled:
        return ANONYMOUS
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    # Headers arrive as latin-1 text, so encoding back gives the bytes sent, whatever they are.
    key = svc.keyring.find(token.strip().encode("latin-1")) if scheme.lower() == "bearer" else None
    if key is None:
        raise APIError(401, "missing or invalid API key; send 'Authorization: Bearer YOUR_KEY'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    caller = Caller.of(key)
    per_minute = caller.limit("requests_per_minute", svc.settings.key_requests_per_minute)
    if per_minute:
        wait = svc.limiter.take(caller.name, per_minute)
        if wait > 0:
            svc.metrics.key_rejected.labels(caller.name, "requests_per_minute").inc()
            retry = max(1, math.ceil(wait))
            raise APIError(429, f"API key {caller.name!r} is over its limit of {per_minute} requests per minute; "
                                f"retry in {retry} s", param="requests_per_minute", code="rate_limit_exceeded",
                           headers={"Retry-After": str(retry)})
    return caller
