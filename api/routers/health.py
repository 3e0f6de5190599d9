"""Liveness (the API answers) and readiness (the job store, the storage and the queue work)."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from vidserve.storage import Storage, StorageUnavailable

from ..errors import unavailable
from ..services import Services, services

router = APIRouter(tags=["health"])

# A load balancer may ask every second; each storage probe writes and deletes an object.
PROBE_CACHE_SECONDS = 2.0


@router.get("/healthz")
async def healthz():
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, svc: Services = Depends(services)):
    """200 when every component works; otherwise 503 naming each one that does not, and why
    (the code is the first one's)."""
    problems: list[tuple[str, str]] = []  # (code, message)
    try:
        await run_in_threadpool(svc.store.list, None, 1, "desc")
    except Exception as exc:
        problems.append(("store_unavailable", f"job store unavailable: {exc}"))
    storage_problem = await _storage_problem(request, svc.storage)
    if storage_problem is not None:
        problems.append((StorageUnavailable.code, storage_problem))
    if not svc.queue.alive:
        problems.append(("queue_unavailable", "the job queue is not running"))
    if problems:
        return unavailable("; ".join(message for _, message in problems), problems[0][0])
    return {"status": "ready", "queue": svc.settings.queue, "storage": svc.storage.location}


async def _storage_problem(request: Request, storage: Storage) -> str | None:
    """What is wrong with the storage (None: nothing), from a probe at most PROBE_CACHE_SECONDS old."""
    checked_at, problem = getattr(request.app.state, "storage_probe", (None, None))
    now = time.monotonic()
    if checked_at is None or now - checked_at > PROBE_CACHE_SECONDS:
        problem = await run_in_threadpool(_probe, storage)
        request.app.state.storage_probe = (now, problem)
    return problem


def _probe(storage: Storage) -> str | None:
    try:
        storage.probe()
    except StorageUnavailable as exc:  # its message names the storage already
        return str(exc)
    except Exception as exc:  # it answers, but does not work (a full disk, a bucket we may not write)
        return f"storage {storage.location} failed its probe: {type(exc).__name__}: {exc}"
    return None
