"""HLS of every video job: `GET /v1/videos/{id}/stream.m3u8`, the media playlist that grows
as chunks finish, and `GET /v1/videos/{id}/stream/{name}`, its init and media segments,
read from Storage (so any API process serves any job's stream).

Players cannot send an Authorization header: on a server with keys, a `token` query
parameter (the video object's `stream_url` carries one) stands in for the key it names, and the
playlist hands that same token to its segment URIs, so a link works until the expiry it was issued
with and no longer than its key. An Authorization header works too, as everywhere.

A player started before the video has a segment (a queued job) would read an empty playlist, which
ffmpeg takes for a stream with nothing in it: that playlist request is held, as LL-HLS blocking
playlist reloads are, until the first segment exists, the job ends, or `stream_hold_seconds` pass:
it follows the job's events (`JobEvents.follow`), reading the job only as it changes.
"""

from __future__ import annotations

from contextlib import aclosing

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from vidserve.jobs import Job
from vidserve.jobs.events import Deleted, Quiet
from vidserve.jobs.files import INIT_SEGMENT, segment_chunk
from vidserve.media.hls import media_playlist, target_seconds

from ..auth import authenticate
from ..content import stored_file_response
from ..errors import APIError, not_found, video_expired
from ..protocol.errors import errors
from ..protocol.media import PLAYLIST, PLAYLIST_TYPE, SEGMENT, SEGMENT_TYPES
from ..services import Services, services

router = APIRouter(prefix="/v1/videos", tags=["videos"])

TOKEN = Query(None, max_length=200, description="The token of the video's `stream_url`, for players that cannot "
                                                "send an Authorization header (servers with keys).")


def _streamed(svc: Services, request: Request, video_id: str, token: str | None) -> Job:
    """The video, if the token (or else the Authorization header) lets the caller see it."""
    if token is not None and svc.keyring.enabled:
        key_name = svc.stream_tokens.check(video_id, token)
        if key_name is None:
            raise APIError(403, f"the stream token of video {video_id} is invalid or has expired; take a fresh "
                                "stream_url from GET /v1/videos/{id}", param="token", code="invalid_stream_token")
        caller = svc.keyring.named(key_name)
        if caller is None:
            raise APIError(403, f"the stream token of video {video_id} was issued for API key {key_name!r}, which "
                                "this server no longer has", param="token", code="invalid_stream_token")
    else:
        caller = authenticate(request)
    job = svc.store.get(video_id)
    if job is None or not caller.sees(job.owner):
        raise not_found(video_id)
    if job.is_expired():
        raise video_expired(job)
    return job


@router.get("/{video_id}/stream.m3u8", response_class=Response, responses={**PLAYLIST, **errors(403, 404, 410)})
async def stream_playlist(request: Request, video_id: str, token: str | None = TOKEN,
                          svc: Services = Depends(services)):
    job = await run_in_threadpool(_streamed, svc, request, video_id, token)
    if not job.segments and not job.status.terminal:
        job = await _first_segment(svc, request, job)
    # The token it was read with, checked above: the same URLs on every reload, expiring when the link does.
    query = f"?token={token}" if token is not None and svc.keyring.enabled else ""
    p = job.params
    longest = max([*p.chunk_frames, *(s.frames for s in job.segments)]) / p.fps
    playlist = media_playlist(f"stream/{INIT_SEGMENT}{query}",
                              [(f"stream/{s.name}{query}", s.seconds) for s in job.segments],
                              target_seconds(longest), ended=job.status.terminal)
    # A player reloads a growing playlist: no cache may hold it; an ended one no longer changes.
    cache = "no-cache" if not job.status.terminal else "max-age=60"
    return Response(playlist, media_type=PLAYLIST_TYPE, headers={"cache-control": cache})


async def _first_segment(svc: Services, request: Request, job: Job) -> Job:
    """The job once it has a segment or has ended, or as it is after `stream_hold_seconds` (a
    player that gets an empty playlist then reloads it, as it would a live one)."""
    deleted = False
    async with anyio.create_task_group() as held:
        held.start_soon(_cancel_when_disconnected, request, held.cancel_scope)
        with anyio.move_on_after(svc.settings.stream_hold_seconds):
            async with aclosing(svc.events.follow(job.id)) as events:
                async for event in events:
                    if isinstance(event, Deleted):
                        deleted = True
                        break
                    if not isinstance(event, Quiet):
                        job = event.job
                        if job.segments or job.status.terminal:
                            break
        held.cancel_scope.cancel()
    if deleted:  # meanwhile
        raise not_found(job.id)
    return job


async def _cancel_when_disconnected(request: Request, scope: anyio.CancelScope) -> None:
    """Cancel `scope` once the client has gone: a held request nobody waits for ends at once."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


@router.get("/{video_id}/stream/{name}", response_class=Response,
             responses={**SEGMENT, **errors(403, 404, 409, 410, 416)})
async def stream_segment(request: Request, video_id: str,
                         name: str = Path(pattern=r"^(init\.mp4|(source|[0-9]{1,6})\.m4s)$"),
                         token: str | None = TOKEN, svc: Services = Depends(services)):
    job = await run_in_threadpool(_streamed, svc, request, video_id, token)
    if name == INIT_SEGMENT:
        key = job.stream_init_key
    else:
        chunk = segment_chunk(name)
        key = next((s.key for s in job.segments if s.chunk == chunk), None)
    if key is None:
        made = [s.name for s in job.segments]
        raise APIError(404 if job.status.terminal else 409,
                       f"segment {name} of video {video_id} is not made; made: {made}", param="name",
                       code="segment_not_ready")
    redirect_seconds = svc.settings.content_url_seconds if svc.settings.content_redirect else None
    suffix = name[name.rindex("."):]
    try:
        return await run_in_threadpool(stored_file_response, svc.storage, key, SEGMENT_TYPES[suffix],
                                       f"{video_id}-{name}", request.headers.get("range"), redirect_seconds)
    except FileNotFoundError:
        raise APIError(404, f"segment {name} of video {video_id} is gone from storage", code="content_missing") \
            from None
