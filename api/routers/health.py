"""Liveness (the API answers) and readiness (the job store, the storage and the queue work, and
the embedded worker has warmed up)."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool

from vidserve.storage import Storage, StorageUnavailable

from ..auth import require_admin
from ..errors import APIError, unavailable
from ..protocol.errors import errors
from ..protocol.health import Liveness, Readiness
from ..services import Services, services

log = logging.getLogger("vidserve.api")
router = APIRouter(tags=["health"])

# A load balancer may ask every second; each storage probe writes and deletes an object.
PROBE_CACHE_SECONDS = 2.0


@router.get("/healthz", response_model=Liveness)
async def healthz() -> Liveness:
    return Liveness()


# Unset parts are left out: who may not see them gets {"status": "ready"} alone.
@router.get("/readyz", response_model=Readiness, response_model_exclude_none=True, responses=errors(503))
async def readyz(request: Request, svc: Services = Depends(services)):
    """200 when every component works; otherwise 503 naming each part that does not, with the
    first one's code. Why it failed (paths, hosts, ports) goes to the log, never to the client;
    which queue and storage kind the server runs is shown to admins (or on a server without keys)."""
    problems: list[tuple[str, str]] = []  # (code, part)
    try:
        await run_in_threadpool(svc.store.list, None, 1, "desc")
    except Exception as exc:
        log.warning("readiness: the job store is unavailable: %s", exc)
        problems.append(("store_unavailable", "job store"))
    storage_problem = await _storage_problem(request, svc.storage)
    if storage_problem is not None:
        log.warning("readiness: %s", storage_problem)
        problems.append((StorageUnavailable.code, "storage"))
    if not svc.queue.alive:
        problems.append(("queue_unavailable", "job queue"))
    if problems:
        return unavailable(f"not ready: {', '.join(part for _, part in problems)} unavailable", problems[0][0])
    if svc.queue.warming:
        return unavailable(f"not ready: warming up (one tiny generation of {svc.settings.default_model}, so that "
                           "the first job runs at full speed)", "warming_up")
    if not _is_admin(request):
        return Readiness()
    storage_kind = "s3" if svc.storage.location.startswith("s3://") else "local"
    return Readiness(queue=svc.settings.queue, storage=storage_kind)


def _is_admin(request: Request) -> bool:
    try:
        require_admin(request)
    except APIError:
        return False
    return True


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
