"""/v1/videos: OpenAI's Videos API (create, retrieve, list, delete, content, remix) plus
cancel and a Server-Sent Events stream of a job's progress."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import io
import json
from typing import Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from vidserve import jobs
from vidserve.jobs import Job, JobStatus, video_object
from vidserve.media import load_image
from vidserve.registry import resolve
from vidserve.requests import build_request
from vidserve.workers.runner import announce

from ..auth import require_api_key
from ..errors import APIError, not_found
from ..schemas import VideoCreate, VideoRemix
from ..services import Services, services

router = APIRouter(prefix="/v1/videos", tags=["videos"], dependencies=[Depends(require_api_key)])

VARIANTS = {"video": "video/mp4", "thumbnail": "image/webp"}
EVENT_POLL_SECONDS = 0.2


async def _read_body(request: Request, limit: int) -> tuple[dict[str, Any], bytes | None]:
    """The fields of a JSON or multipart/form body, and the bytes of `input_reference` if any."""
    if int(request.headers.get("content-length") or 0) > limit + 64 * 1024:
        raise APIError(413, f"request body is larger than the {limit} byte upload limit", code="file_too_large")
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        form = await request.form(max_files=1, max_fields=32)
        fields: dict[str, Any] = {}
        image = None
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key != "input_reference":
                    raise APIError(400, f"unexpected file field {key!r}", param=key)
                if value.size is not None and value.size > limit:
                    raise APIError(413, f"input_reference is larger than the {limit} byte limit",
                                   param="input_reference", code="file_too_large")
                image = await value.read()
            elif key == "metadata":
                fields[key] = _json_field(key, value)
            else:
                fields[key] = value
        return fields, image
    raw = await request.body()
    try:
        fields = json.loads(raw or b"{}")
    except ValueError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(fields, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    reference = fields.pop("input_reference", None)
    return fields, _data_url_bytes(reference) if reference is not None else None


def _json_field(key: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        raise APIError(400, f"{key} must be a JSON object", param=key) from None


def _data_url_bytes(reference: Any) -> bytes:
    """JSON bodies may carry the first frame as {"image_url": "data:image/png;base64,..."}."""
    url = reference.get("image_url") if isinstance(reference, dict) else None
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise APIError(400, "input_reference in a JSON body must be {\"image_url\": \"data:image/...;base64,...\"}; "
                            "or upload the image as multipart/form-data", param="input_reference")
    try:
        return base64.b64decode(url.split(";base64,", 1)[1], validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "input_reference data URL is not valid base64", param="input_reference") from None


def _validate(model: type, fields: dict[str, Any]):
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param,
                       code="invalid_value") from None


def _request_hash(fields: dict[str, Any], image: bytes | None) -> str:
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    digest.update(hashlib.sha256(image or b"").digest())
    return digest.hexdigest()


def _submit(svc: Services, body: VideoCreate, image_bytes: bytes | None, *, idempotency_key: str | None,
            request_hash: str | None, remixed_from: Job | None = None) -> tuple[Job, bool]:
    """Validate against the model and limits, then record and enqueue. Nothing invalid reaches a worker."""
    settings = svc.settings
    spec = resolve(body.model or settings.default_model)
    image = load_image(image_bytes, settings.max_image_pixels) if image_bytes is not None else None
    req = build_request(
        spec, settings, body.prompt, size=body.size, seconds=body.seconds, num_frames=body.num_frames,
        fps=body.fps, steps=body.num_inference_steps, guidance=body.guidance_scale, seed=body.seed,
        negative_prompt=body.negative_prompt or "", image=image, attention=body.attention,
    )
    queued = len(svc.store.with_status([JobStatus.queued]))
    if queued >= settings.max_queued:
        raise APIError(429, f"the queue is full ({queued} jobs waiting); try again later", code="queue_full",
                       headers={"Retry-After": "30"})
    seconds = f"{body.seconds:g}" if body.seconds is not None else f"{req.seconds:g}"
    job = Job(
        model=spec.name, prompt=req.prompt, max_attempts=settings.max_attempts,
        params={"seconds": seconds, "width": req.width, "height": req.height, "num_frames": req.num_frames,
                "fps": req.fps, "steps": req.steps, "guidance": req.guidance, "seed": req.seed,
                "negative_prompt": req.negative_prompt, "attention": req.attention.model_dump()},
        webhook_url=body.webhook_url, metadata=body.metadata, idempotency_key=idempotency_key,
        request_hash=request_hash, remixed_from_video_id=remixed_from.id if remixed_from else None,
    )
    if image is not None:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        job.input_image_key = svc.storage.put_bytes(f"{job.id}/input.png", buffer.getvalue())
    stored, created = svc.store.create(job)
    if not created:
        svc.storage.delete_prefix(f"{job.id}/")
        if stored.request_hash != request_hash:
            raise APIError(422, "this Idempotency-Key was already used with a different request body",
                           param="Idempotency-Key", code="idempotency_key_reused")
        return stored, False
    svc.queue.submit(stored)
    return stored, True


@router.post("")
async def create_video(request: Request, svc: Services = Depends(services),
                       idempotency_key: str | None = Header(None, max_length=256)):
    fields, image = await _read_body(request, svc.settings.max_upload_bytes)
    body = _validate(VideoCreate, fields)
    request_hash = _request_hash(fields, image) if idempotency_key else None
    job, _ = await run_in_threadpool(_submit, svc, body, image, idempotency_key=idempotency_key,
                                     request_hash=request_hash)
    return video_object(job)


@router.get("")
async def list_videos(svc: Services = Depends(services), after: str | None = None,
                      limit: int = Query(20, ge=1, le=100), order: str = Query("desc", pattern="^(asc|desc)$")):
    try:
        page, has_more = await run_in_threadpool(svc.store.list, after, limit, order)
    except KeyError:
        raise APIError(400, f"after: no video with id {after!r}", param="after") from None
    data = [video_object(job) for job in page]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


def _get(svc: Services, video_id: str) -> Job:
    job = svc.store.get(video_id)
    if job is None:
        raise not_found(video_id)
    return job


@router.get("/{video_id}")
async def retrieve_video(video_id: str, svc: Services = Depends(services)):
    return video_object(await run_in_threadpool(_get, svc, video_id))


@router.post("/{video_id}/cancel")
async def cancel_video(video_id: str, svc: Services = Depends(services)):
    job = await run_in_threadpool(_get, svc, video_id)
    if job.status.terminal:
        raise APIError(409, f"video {video_id} is already {job.status.value}", code="video_not_cancellable")
    try:
        job = await run_in_threadpool(svc.store.update, video_id, jobs.request_cancel)
    except KeyError:
        raise not_found(video_id) from None
    if job.status is JobStatus.cancelled:  # it was still queued; a running job is announced by its worker
        announce(svc.webhooks, svc.settings, job)
    return video_object(job)


@router.delete("/{video_id}")
async def delete_video(video_id: str, svc: Services = Depends(services)):
    def delete() -> None:
        try:
            svc.store.update(video_id, jobs.request_cancel)  # a running job stops at its next step
        except KeyError:
            raise not_found(video_id) from None
        svc.store.delete(video_id)
        svc.storage.delete_prefix(f"{video_id}/")

    await run_in_threadpool(delete)
    return {"id": video_id, "object": "video.deleted", "deleted": True}


@router.get("/{video_id}/content")
async def download_content(video_id: str, variant: str = "video", svc: Services = Depends(services)):
    if variant not in VARIANTS:
        raise APIError(400, f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}", param="variant")
    job = await run_in_threadpool(_get, svc, video_id)
    if job.status is not JobStatus.completed:
        raise APIError(409, f"video {video_id} is {job.status.value}; content is ready once it is completed",
                       code="video_not_ready")
    path = svc.storage.path(job.outputs[variant])
    if not path.exists():
        raise APIError(404, f"the {variant} of video {video_id} is gone from storage", code="content_missing")
    suffix = path.suffix
    return FileResponse(path, media_type=VARIANTS[variant], filename=f"{video_id}{suffix}")


@router.post("/{video_id}/remix")
async def remix_video(video_id: str, request: Request, svc: Services = Depends(services)):
    fields, _ = await _read_body(request, svc.settings.max_upload_bytes)
    remix = _validate(VideoRemix, fields)
    source = await run_in_threadpool(_get, svc, video_id)
    p = source.params
    body = VideoCreate(prompt=remix.prompt, model=source.model, size=f"{p['width']}x{p['height']}",
                       num_frames=p["num_frames"], fps=p["fps"], num_inference_steps=p["steps"],
                       guidance_scale=p["guidance"], seed=p["seed"], negative_prompt=p.get("negative_prompt"),
                       attention=p.get("attention"), webhook_url=source.webhook_url, metadata=source.metadata)
    image = svc.storage.path(source.input_image_key).read_bytes() if source.input_image_key else None
    job, _ = await run_in_threadpool(_submit, svc, body, image, idempotency_key=None, request_hash=None,
                                     remixed_from=source)
    return video_object(job)


@router.get("/{video_id}/events")
async def video_events(video_id: str, request: Request, svc: Services = Depends(services)):
    """Server-Sent Events: `video.<status>` on each status change, `video.progress` as steps
    complete, ending after the terminal event (completed, failed or cancelled)."""
    await run_in_threadpool(_get, svc, video_id)

    async def stream():
        last_status, last_progress, idle = None, None, 0.0
        while True:
            job = await run_in_threadpool(svc.store.get, video_id)
            if job is None:
                yield _event("video.deleted", {"id": video_id, "object": "video.deleted", "deleted": True})
                return
            if job.status != last_status or job.progress != last_progress:
                kind = "video.progress" if job.status == last_status else f"video.{job.status.value}"
                yield _event(kind, video_object(job))
                last_status, last_progress, idle = job.status, job.progress, 0.0
            if job.status.terminal or await request.is_disconnected():
                return
            await asyncio.sleep(EVENT_POLL_SECONDS)
            idle += EVENT_POLL_SECONDS
            if idle >= 15:  # a comment line keeps proxies from closing a quiet stream
                yield ": keep-alive\n\n"
                idle = 0.0

    return StreamingResponse(stream(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n"
