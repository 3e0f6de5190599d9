"""The playground: a small page at `/` that drives the public API from a browser (video
jobs, the gallery, chat). Plain files from `api/static/`, no build step. No auth here: the
page itself holds no data, and it sends the user's key on its own `/v1` calls."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent.parent / "static"

# The page loads nothing from elsewhere, and says so: scripts, styles and calls stay on this
# origin; media and images may also be blob: URLs (fetched with the key) or data: (previews).
# form-action 'none': the forms are handled by script, so a form can never send a key anywhere.
CSP = ("default-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           # Revalidate each time (the ETag makes that a 304): a new release is never half-cached.
           "Cache-Control": "no-cache"}

router = APIRouter(tags=["playground"], include_in_schema=False)
# StaticFiles does the careful parts: paths confined to the folder, ETag / If-None-Match, HEAD.
# check_dir=False: without the folder the API still serves, and these routes answer 404.
_files = StaticFiles(directory=STATIC, check_dir=False)


async def _serve(path: str, request: Request):
    response = await _files.get_response(path, request.scope)
    response.headers.update(HEADERS)
    return response


@router.api_route("/", methods=["GET", "HEAD"])
async def index(request: Request):
    return await _serve("index.html", request)


@router.api_route("/static/{path:path}", methods=["GET", "HEAD"])
async def static(path: str, request: Request):
    return await _serve(path, request)
