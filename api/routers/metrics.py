"""/metrics in Prometheus' text format: for admin keys when the server has keys (metrics name
every key). `VIDSERVE_METRICS_ADDRESS` serves the same registry on a listener of its own,
without keys, for a Prometheus on a private network."""

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ..auth import require_admin
from ..protocol.errors import errors
from ..protocol.media import METRICS
from ..services import Services, services

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response, dependencies=[Depends(require_admin)],
            responses={**METRICS, **errors(401, 403, 429)})
async def metrics(svc: Services = Depends(services)):
    body = await run_in_threadpool(generate_latest, svc.metrics.registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
