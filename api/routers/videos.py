"""/v1/videos: OpenAI's Videos API (create, extend, retrieve, list, delete, content,
remix) plus cancel and a Server-Sent Events stream of a job's progress and chunks."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from pathlib import PurePosixPath

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool

from vidserve import jobs
from vidserve.errors import echo
from vidserve.jobs import Job, JobNotFound, JobStatus
from vidserve.keys import Caller
from vidserve.media.renditions import NAME_PATTERN
from vidserve.jobs.video_object import VideoObject, VideoProgress, segment_path
from vidserve.webhooks import announce

from ..auth import authenticate, capped_stream
from ..content import stored_file_response
from ..errors import APIError, not_found, video_expired
from ..forms import read_body, request_hash, validate
from ..responses import VideoDeleted, VideoList
from ..schemas import VideoCreate, VideoExtend, VideoRemix
from ..services import Services, services
from ..submission import submit_extension, submit_remix, submit_video

router = APIRouter(prefix="/v1/videos", tags=["videos"], dependencies=[Depends(authenticate)])

# Every video's variants; a rendition's media type is its format's.
VARIANTS = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg", "chunk": "video/mp4"}
EVENT_POLL_SECONDS = 0.2


@router.post("", response_model=VideoObject)
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


@router.post("/extensions", response_model=VideoObject)
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


@router.get("/{video_id}", response_model=VideoObject)
async def retrieve_video(video_id: str, svc: Services = Depends(services), caller: Caller = Depends(authenticate)):
    return await run_in_threadpool(lambda: svc.video(_get(svc, caller, video_id)))


@router.post("/{video_id}/cancel", response_model=VideoObject)
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


@router.delete("/{video_id}", response_model=VideoDeleted)
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


@router.get("/{video_id}/content")
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
        chunk = next((c for c in job.chunks if c["index"] == index), None)
        if chunk is None:
            done = sorted(c["index"] for c in job.chunks)
            raise APIError(404 if job.status.terminal else 409, f"chunk {index} of video {video_id} is not "
                           f"available; chunks done: {done}", param="index", code="chunk_not_ready")
        key, filename, media_type = chunk["key"], f"{video_id}-chunk-{index}.mp4", VARIANTS["chunk"]
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


@router.post("/{video_id}/remix", response_model=VideoObject)
async def remix_video(video_id: str, request: Request, svc: Services = Depends(services),
                      caller: Caller = Depends(authenticate)):
    fields, _ = await read_body(request, svc.settings.max_upload_bytes, ())
    remix = validate(VideoRemix, fields)
    source = await run_in_threadpool(_get, svc, caller, video_id)
    job = await run_in_threadpool(submit_remix, svc, caller, source, remix.prompt, remix.priority
                                  if "priority" in remix.model_fields_set else None, remix.outputs)
    return await run_in_threadpool(svc.video, job)


@router.get("/{video_id}/events")
async def video_events(video_id: str, request: Request, svc: Services = Depends(services),
                       caller: Caller = Depends(authenticate)):
    """Server-Sent Events: `video.<status>` with the whole video object on each status change,
    `video.queued` again as its place in line changes, `video.progress` with what moved
    (`VideoProgress`: step, chunk, estimated end, stage, warnings) as steps complete, as the stage
    turns to `encoding` and as each rendition is stored, `video.chunk` as each chunk of a long
    video becomes downloadable, ending after the terminal event (completed, failed or cancelled)."""
    await run_in_threadpool(_get, svc, caller, video_id)

    async def stream():
        # What the stream last told: the job's state, and the progress fields a client now holds.
        last: _Seen | None = None
        told: VideoProgress | None = None
        announced, idle = set(), 0.0
        while True:
            job = await run_in_threadpool(svc.store.get, video_id)
            if job is None:
                yield _event("video.deleted", VideoDeleted(id=video_id).model_dump_json())
                return
            for chunk in sorted(job.chunks, key=lambda c: c["index"]):
                if chunk["index"] not in announced:
                    announced.add(chunk["index"])
                    segment = next((s["name"] for s in job.segments if s["name"] == f"{chunk['index']}.m4s"), None)
                    yield _event("video.chunk", json.dumps({
                        "video_id": video_id, "index": chunk["index"], "frames": chunk["frames"],
                        "drift": chunk["drift"],
                        "url": f"/v1/videos/{video_id}/content?variant=chunk&index={chunk['index']}",
                        "segment": segment_path(video_id, segment)}, separators=(",", ":")))
            seen, moved = _Seen.of(job), VideoProgress.of(job, time.time())
            if last is not None and seen.status is last.status and seen.status is not JobStatus.queued:
                if seen != last:
                    yield _event("video.progress", moved.changes_since(told))
                    last, told, idle = seen, moved, 0.0
            else:  # a new status, or a queued job's place in line: the object, with its standing
                video = await run_in_threadpool(svc.video, job)
                seen = dataclasses.replace(seen, queue_position=video.queue_position)
                if seen != last:
                    yield _event(f"video.{job.status.value}", video.model_dump_json())
                    last, told, idle = seen, moved, 0.0
            if job.status.terminal or await request.is_disconnected():
                return
            await asyncio.sleep(EVENT_POLL_SECONDS)
            idle += EVENT_POLL_SECONDS
            if idle >= 15:  # a comment line keeps proxies from closing a quiet stream
                yield ": keep-alive\n\n"
                idle = 0.0

    return capped_stream(request, caller, stream(), media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@dataclasses.dataclass(frozen=True)
class _Seen:
    """What an event stream last told of a job: a change in any of it is the next event."""

    status: JobStatus
    progress: int
    steps_done: int
    stage: str | None
    warnings: int
    queue_position: int | None = None

    @classmethod
    def of(cls, job: Job) -> "_Seen":
        return cls(job.status, job.progress, job.steps_done, job.stage, len(job.warnings))


def _event(kind: str, data: str) -> str:
    return f"event: {kind}\ndata: {data}\n\n"
