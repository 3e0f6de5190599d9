"""The playground: a small page at `/` that drives the public API from a browser (video
jobs and their streams, live sessions, the gallery, chat). Plain files from `api/static/`, no
build step. No auth for the page itself, which holds no data: it sends the user's key on its own
`/v1` calls, and on `/playground/models`, which tells its model list which models would take a
job now, and which one a request naming none gets."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, Request
from starlette.staticfiles import StaticFiles

from vidserve.registry import MODELS

from ..auth import authenticate
from ..protocol.models import ModelAvailability, ModelAvailabilityList
from ..services import Services, services

STATIC = Path(__file__).resolve().parent.parent / "static"

# The page loads nothing from elsewhere, and says so: scripts, styles and calls stay on this
# origin; media and images may also be blob: URLs (fetched with the key, or Media Source
# Extensions playing a stream) or data: (previews). form-action 'none': the forms are handled by
# script, so a form can never send a key anywhere.
CSP = ("default-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; connect-src 'self'{storage}; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           # Revalidate each time (the ETag makes that a 304): a new release is never half-cached.
           "Cache-Control": "no-cache"}


def content_security_policy(svc: Services) -> str:
    """The page's policy ('self' covers the live sessions' WebSocket too, as CSP 3 has it). Where
    content downloads redirect to the storage's presigned URLs, the page's media fetches follow
    them there: that origin, and only it, is added to connect-src."""
    origin = svc.storage.url_origin() if svc.settings.content_redirect else None
    return CSP.format(storage=f" {origin}" if origin else "")


router = APIRouter(tags=["playground"], include_in_schema=False)
# StaticFiles does the careful parts: paths confined to the folder, ETag / If-None-Match, HEAD.
# check_dir=False: without the folder the API still serves, and these routes answer 404.
_files = StaticFiles(directory=STATIC, check_dir=False)


async def _serve(path: str, request: Request, svc: Services):
    response = await _files.get_response(path, request.scope)
    response.headers.update({**HEADERS, "Content-Security-Policy": content_security_policy(svc)})
    return response


@router.api_route("/", methods=["GET", "HEAD"])
async def index(request: Request, svc: Services = Depends(services)):
    return await _serve("index.html", request, svc)


@router.api_route("/static/{path:path}", methods=["GET", "HEAD"])
async def static(path: str, request: Request, svc: Services = Depends(services)):
    return await _serve(path, request, svc)


@router.get("/playground/models", response_model=ModelAvailabilityList, dependencies=[Depends(authenticate)])
def model_availability(svc: Services = Depends(services)) -> ModelAvailabilityList:
    """Each registry model, and why a job for it would be refused now (null: it would not); and
    the model a request that names none gets."""
    reasons = {name: svc.unavailable(spec) for name, spec in MODELS.items()}
    return ModelAvailabilityList(default_model=svc.settings.default_model,
                                 data=[ModelAvailability(id=name, available=reason is None, reason=reason)
                                       for name, reason in reasons.items()])
