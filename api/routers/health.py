"""Liveness (the API answers) and readiness (the job store and the queue work)."""

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool

from ..errors import error_response
from ..services import Services, services

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz():
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(svc: Services = Depends(services)):
    try:
        await run_in_threadpool(svc.store.list, None, 1, "desc")
    except Exception as exc:
        return error_response(503, f"job store unavailable: {exc}", code="store_unavailable")
    if not svc.queue.alive:
        return error_response(503, "the job queue is not running", code="queue_unavailable")
    return {"status": "ready", "queue": svc.settings.queue}
