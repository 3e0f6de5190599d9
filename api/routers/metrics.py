"""/metrics in Prometheus' text format."""

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..services import Services, services

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response,
            responses={200: {"description": "Prometheus text format.", "content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(svc: Services = Depends(services)):
    body = await run_in_threadpool(generate_latest, svc.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
