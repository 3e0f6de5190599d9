"""Liveness and readiness, as a load balancer or an operator reads them."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Liveness(BaseModel):
    """GET /healthz: the API answers."""

    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    """GET /readyz: every component works and the embedded worker has warmed up (otherwise a 503
    naming each part that does not). `queue` and `storage` are shown to admins, or on a server
    without keys, and left out for anyone else."""

    status: Literal["ready"] = "ready"
    queue: Literal["embedded", "celery"] | None = Field(None, description="Which job queue the server runs.")
    storage: Literal["local", "s3"] | None = Field(None, description="Which storage kind holds the files.")
