"""API keys as `Authorization: Bearer KEY`. No keys configured: no auth (loopback default)."""

from __future__ import annotations

import hmac

from fastapi import Request

from .errors import APIError


def require_api_key(request: Request) -> None:
    keys = request.app.state.services.settings.keys
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not any(hmac.compare_digest(token.strip(), key) for key in keys):
        raise APIError(401, "missing or invalid API key; send 'Authorization: Bearer YOUR_KEY'",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
