"""/v1/videos: OpenAI's Videos API (create, extend, retrieve, list, delete, content,
remix) plus cancel and a Server-Sent Events stream of a job's progress and chunks."""

from __future__ import annotations

from pathlib import PurePosixPath

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from vidserve import jobs
from vidserve.errors import echo
from vidserve.jobs import Job, JobNotFound, JobStatus
from vidserve.keys import Caller
from vidserve.media.renditions import NAME_PATTERN
from vidserve.jobs.events import ChunkFinished, Deleted, Progressed, Quiet, StatusChanged
from vidserve.jobs.video_object import VideoChunkEvent, VideoObject
from vidserve.webhooks import announce

from ..auth import authenticate, capped_stream
from ..content import stored_file_response
from ..errors import APIError, not_found, video_expired
from ..forms import read_body, request_hash, validate
from ..protocol.errors import errors
from ..protocol.media import CONTENT, VIDEO_EVENTS
from ..protocol.videos import VideoDeleted, VideoList
from ..protocol.videos import VideoCreate, VideoExtend, VideoRemix
from ..services import Services, services
from ..submission import submit_extension, submit_remix, submit_video

router = APIRouter(prefix="/v1/videos", tags=["videos"], dependencies=[Depends(authenticate)])

# Every video's variants; a rendition's media type is its format's.
VARIANTS = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg", "chunk": "video/mp4"}


@router.post("", response_model=VideoObject, responses=errors(403, 422))
async def create_video(request: Request, svc: Services = Depends(services), caller: Caller = Depends(authenticate),
                       idempotency_key: str | None = Header(None, max_length=256)):
    if idempotency_key is not None and not idempotency_key.strip():
        # An empty key would name one job for every request that sends it empty.
        raise APIError(400, "Idempotency-Key is empty: send a unique value per request (a UUID), or leave the "
                            "header out", param="Idempotency-Key", code="invalid_idempotency_key")
    fields, files = await read_body(request, svc.settings.max_upload_bytes, ("input_reference",))
    body = validate(VideoCreate, fields)
    job = await run_in_threadpool(submit_video, svc, caller, body, files.get("input_reference"),
                                  idempotency_key=idempotency_key,
                                  request_hash=request_hash(fields, files) if idempotency_key else None)
    return await run_in_threadpool(svc.video, job)


@router.post("/extensions", response_model=VideoObject, responses=errors(403, 404, 409, 410))
async def extend_video(request: Request, svc: Services = Depends(services), caller: Caller = Depends(authenticate)):
    """Continue a video from its last frame; the new video is the source followed by the new frames."""
    fields, files = await read_body(request, svc.settings.max_upload_bytes, ("video",))
    body = validate(VideoExtend, fields)
    job = await run_in_threadpool(submit_extension, svc, caller, body, files.get("video"))
    return await run_in_threadpool(svc.video, job)


@router.get("", response_model=VideoList)
async def list_videos(svc: Services = Depends(services), caller: Caller = Depends(authenticate),
                      after: str | None = None, limit: int = Query(20, ge=1, le=100),
                      order: str = Query("desc", pattern="^(asc|desc)$")):
    try:
        page, has_more = await run_in_threadpool(svc.store.list, after, limit, order, caller.scope)
    except JobNotFound:
        raise APIError(400, f"after: no video with id {echo(after)}", param="after") from None
    return VideoList.of(await run_in_threadpool(svc.videos, page), has_more)


def _get(svc: Services, caller: Caller, video_id: str) -> Job:
    """The caller's video; another key's is as absent as one that never existed."""
    job = svc.store.get(video_id)
    if job is None or not caller.sees(job.owner):
        raise not_found(video_id)
    return job


@router.get("/{video_id}", response_model=VideoObject, responses=errors(404))
async def retrieve_video(video_id: str, svc: Services = Depends(services), caller: Caller = Depends(authenticate)):
    return await run_in_threadpool(lambda: svc.video(_get(svc, caller, video_id)))


@router.post("/{video_id}/cancel", response_model=VideoObject, responses=errors(404, 409))
async def cancel_video(video_id: str, svc: Services = Depends(services), caller: Caller = Depends(authenticate)):
    job = await run_in_threadpool(_get, svc, caller, video_id)
    if job.status.terminal:
        raise APIError(409, f"video {video_id} is already {job.status.value}", code="video_not_cancellable")
    try:
        job = await run_in_threadpool(svc.store.update, video_id, jobs.request_cancel)
    except JobNotFound:
        raise not_found(video_id) from None
    if job.status is JobStatus.cancelled:  # it was still queued; a running job is announced by its worker
        announce(svc.webhooks, svc.settings, job)
    return await run_in_threadpool(svc.video, job)


@router.delete("/{video_id}", response_model=VideoDeleted, responses=errors(404))
async def delete_video(video_id: str, svc: Services = Depends(services), caller: Caller = Depends(authenticate)):
    def delete() -> None:
        _get(svc, caller, video_id)
        # Files first: if the storage is down this answers 503 and changes nothing, so the delete
        # can be retried. Again after the record, for a file a running job put in between (a
        # running job that finds its record gone removes its own files too).
        svc.storage.delete_prefix(f"{video_id}/")
        try:
            svc.store.update(video_id, jobs.request_cancel)  # a running job stops at its next step
        except JobNotFound:
            raise not_found(video_id) from None
        svc.store.delete(video_id)
        svc.storage.delete_prefix(f"{video_id}/")

    await run_in_threadpool(delete)
    return VideoDeleted(id=video_id)


@router.get("/{video_id}/content", response_class=Response, responses={**CONTENT, **errors(404, 409, 410, 416)})
async def download_content(request: Request, video_id: str,
                           variant: str = Query("video", pattern=NAME_PATTERN,
                                                description="video, thumbnail, spritesheet, chunk (with index), "
                                                            "or the name of one of the video's outputs."),
                           index: int | None = Query(None, ge=0), svc: Services = Depends(services),
                           caller: Caller = Depends(authenticate)):
    """`variant=video|thumbnail|spritesheet|NAME` (a rendition in the video's `outputs`) once
    completed; `variant=chunk&index=K` as soon as chunk K is done."""
    job = await run_in_threadpool(_get, svc, caller, video_id)
    if job.is_expired():  # swept or about to be: its files are gone, or as good as
        raise video_expired(job)
    if variant == "chunk":
        chunk = next((c for c in job.chunks if c.index == index), None)
        if chunk is None:
            done = sorted(c.index for c in job.chunks)
            raise APIError(404 if job.status.terminal else 409, f"chunk {index} of video {video_id} is not "
                           f"available; chunks done: {done}", param="index", code="chunk_not_ready")
        key, filename, media_type = chunk.key, f"{video_id}-chunk-{index}.mp4", VARIANTS["chunk"]
    elif job.status is not JobStatus.completed:
        raise APIError(409, f"video {video_id} is {job.status.value}; content is ready once it is completed",
                       code="video_not_ready")
    else:
        key, media_type = _variant(job, variant)
        suffix = PurePosixPath(key).suffix
        # video and thumbnail keep the names they always had; the others need theirs to tell them apart.
        filename = f"{video_id}{suffix}" if variant in ("video", "thumbnail") else f"{video_id}-{variant}{suffix}"
    redirect_seconds = svc.settings.content_url_seconds if svc.settings.content_redirect else None
    try:
        return await run_in_threadpool(stored_file_response, svc.storage, key, media_type, filename,
                                       request.headers.get("range"), redirect_seconds)
    except FileNotFoundError:
        raise APIError(404, f"the {variant} of video {video_id} is gone from storage", code="content_missing") \
            from None


def _variant(job: Job, variant: str) -> tuple[str, str]:
    """(storage key, media type) of a completed video's variant."""
    key = job.outputs.get(variant)
    if key is None:
        raise APIError(404, f"video {job.id} has no {echo(variant)} variant; it has {', '.join(sorted(job.outputs))}",
                       param="variant", code="variant_not_found")
    if variant in VARIANTS:
        return key, VARIANTS[variant]
    return key, next(r.media_type for r in job.params.outputs if r.name == variant)


@router.post("/{video_id}/remix", response_model=VideoObject, responses=errors(403, 404, 410))
async def remix_video(video_id: str, request: Request, svc: Services = Depends(services),
                      caller: Caller = Depends(authenticate)):
    fields, _ = await read_body(request, svc.settings.max_upload_bytes, ())
    remix = validate(VideoRemix, fields)
    source = await run_in_threadpool(_get, svc, caller, video_id)
    job = await run_in_threadpool(submit_remix, svc, caller, source, remix.prompt, remix.priority
                                  if "priority" in remix.model_fields_set else None, remix.outputs)
    return await run_in_threadpool(svc.video, job)


@router.get("/{video_id}/events", response_class=Response, responses={**VIDEO_EVENTS, **errors(404)})
async def video_events(video_id: str, request: Request, svc: Services = Depends(services),
                       caller: Caller = Depends(authenticate)):
    """Server-Sent Events: `video.<status>` with the whole video object on each status change,
    `video.queued` again as its place in line changes, `video.progress` with what moved
    (`VideoProgress`: step, chunk, estimated end, stage, warnings) as steps complete, as the stage
    turns to `encoding` and as each rendition is stored, `video.chunk` (`VideoChunkEvent`, what a
    webhook hears too) as each chunk of a long video becomes downloadable, ending after the
    terminal event (completed, failed or cancelled)."""
    await run_in_threadpool(_get, svc, caller, video_id)

    async def stream():
        async for event in svc.events.follow(video_id):
            match event:
                case ChunkFinished(chunk=chunk, segment=segment):
                    told = VideoChunkEvent.of(video_id, chunk, segment.name if segment else None)
                    yield _event("video.chunk", told.model_dump_json())
                case Progressed(progress=progress, since=since):
                    yield _event("video.progress", progress.changes_since(since))
                case StatusChanged(job=job, place=place):  # the whole object, with where it stands
                    video = await run_in_threadpool(svc.video, job, {job.id: place} if place else {})
                    yield _event(f"video.{job.status.value}", video.model_dump_json())
                case Deleted():
                    yield _event("video.deleted", VideoDeleted(id=video_id).model_dump_json())
                case Quiet():  # a comment line keeps proxies from closing a quiet stream
                    yield ": keep-alive\n\n"

    return capped_stream(request, caller, stream(), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _event(kind: str, data: str) -> str:
    return f"event: {kind}\ndata: {data}\n\n"
