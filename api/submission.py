"""Turning a validated request body into a queued job. Everything is checked against the
model and the server's limits first, so nothing invalid ever reaches a worker."""

from __future__ import annotations

import io

from vidserve.jobs import Job, JobStatus
from vidserve.media import last_frame, load_image, read_video_bytes
from vidserve.params import JobParams
from vidserve.registry import resolve
from vidserve.requests import build_request, check_prompt

from .errors import APIError, not_found
from .schemas import VideoCreate, VideoExtend, _JobFields
from .services import Services


def submit_video(svc: Services, body: VideoCreate, image_bytes: bytes | None, *, idempotency_key: str | None = None,
                 request_hash: str | None = None) -> Job:
    spec = resolve(body.model or svc.settings.default_model)
    image = load_image(image_bytes, svc.settings.max_image_pixels) if image_bytes is not None else None
    request = build_request(spec, svc.settings, body.prompt, size=body.size, seconds=body.seconds,
                            num_frames=body.num_frames, fps=body.fps, image=image, **_options(body))
    seconds = f"{body.seconds:g}" if body.seconds is not None else f"{request.seconds:g}"
    job = _job(svc, spec.name, request.prompt, JobParams.of(request, seconds), webhook_url=body.webhook_url,
               metadata=body.metadata, idempotency_key=idempotency_key, request_hash=request_hash)
    if image is not None:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        job.input_image_key = svc.storage.put_bytes(f"{job.id}/input.png", buffer.getvalue())
    return _enqueue(svc, job)


def submit_extension(svc: Services, body: VideoExtend, upload: bytes | None) -> Job:
    """A job continuing a video from its last frame; its content is the source + the new frames."""
    if (body.video is None) == (upload is None):
        raise APIError(400, "give the video to extend: either video={\"id\": ...} or an uploaded MP4 file",
                       param="video")
    if body.video is not None:
        source_job = svc.store.get(body.video.id)
        if source_job is None:
            raise not_found(body.video.id)
        if source_job.status is not JobStatus.completed:
            raise APIError(409, f"video {source_job.id} is {source_job.status.value}; only a completed video "
                                "can be extended", param="video", code="video_not_ready")
        source_bytes = svc.storage.read_bytes(source_job.outputs["video"])
        model = body.model or source_job.model
        steps, guidance = source_job.params.steps, source_job.params.guidance
    else:
        source_bytes, model, steps, guidance = upload, body.model or svc.settings.default_model, None, None
    frames, fps = _decode_video(source_bytes)
    spec = resolve(model)
    options = _options(body)
    # A referenced video's extension denoises like the video did, unless told otherwise.
    options["steps"] = options["steps"] if options["steps"] is not None else steps
    options["guidance"] = options["guidance"] if options["guidance"] is not None else guidance
    height, width = frames.shape[1:3]
    request = build_request(spec, svc.settings, body.prompt, size=f"{width}x{height}", seconds=body.seconds,
                            fps=round(fps), image=last_frame(frames), continuing=True, **options)
    total = len(frames) + request.num_frames
    params = JobParams.of(request, f"{(total - 1) / request.fps:g}", source_frames=len(frames))
    job = _job(svc, spec.name, request.prompt, params, webhook_url=body.webhook_url, metadata=body.metadata,
               extends_video_id=body.video.id if body.video else None)
    job.source_video_key = svc.storage.put_bytes(f"{job.id}/source.mp4", source_bytes)
    return _enqueue(svc, job)


def submit_remix(svc: Services, source: Job, prompt: str) -> Job:
    """The same job with a new prompt: every parameter, the first frame, and for an extension
    the video it continues, are the source's."""
    check_prompt(prompt, svc.settings)
    job = _job(svc, source.model, prompt, source.params, webhook_url=source.webhook_url,
                   metadata=source.metadata, remixed_from_video_id=source.id, extends_video_id=source.extends_video_id)
    if source.input_image_key:
        job.input_image_key = svc.storage.copy(source.input_image_key, f"{job.id}/input.png")
    if source.source_video_key:
        job.source_video_key = svc.storage.copy(source.source_video_key, f"{job.id}/source.mp4")
    return _enqueue(svc, job)


def _options(body: _JobFields) -> dict:
    return dict(steps=body.num_inference_steps, guidance=body.guidance_scale, seed=body.seed,
                negative_prompt=body.negative_prompt or "", prompts=body.prompts,
                drift_correction=body.drift_correction, attention=body.attention,
                prompt_extend=body.prompt_extend, caption_chain=body.caption_chain, cache=body.cache)


def _job(svc: Services, model: str, prompt: str, params: JobParams, **fields) -> Job:
    if (params.prompt_extend or params.caption_chain) and svc.chat is None and not svc.settings.chat_url:
        param = "prompt_extend" if params.prompt_extend else "caption_chain"
        raise APIError(400, f"{param} needs the LLM path, and this server runs no chat model "
                       "(set VIDSERVE_CHAT_MODEL, or VIDSERVE_CHAT_URL for workers)", param=param)
    queued = len(svc.store.with_status([JobStatus.queued]))
    if queued >= svc.settings.max_queued:
        raise APIError(429, f"the queue is full ({queued} jobs waiting); try again later", code="queue_full",
                       headers={"Retry-After": "30"})
    return Job(model=model, prompt=prompt, max_attempts=svc.settings.max_attempts, params=params, **fields)


def _enqueue(svc: Services, job: Job) -> Job:
    stored, created = svc.store.create(job)
    if not created:  # an Idempotency-Key retry: the job already exists
        svc.storage.delete_prefix(f"{job.id}/")
        if stored.request_hash != job.request_hash:
            raise APIError(422, "this Idempotency-Key was already used with a different request body",
                           param="Idempotency-Key", code="idempotency_key_reused")
        return stored
    svc.queue.submit(stored)
    return stored


def _decode_video(data: bytes):
    try:
        frames, fps = read_video_bytes(data)
    except Exception:
        raise APIError(400, "the uploaded video could not be decoded; send an MP4 (H.264)",
                       param="video", code="invalid_video") from None
    if len(frames) == 0:
        raise APIError(400, "the uploaded video has no frames", param="video", code="invalid_video")
    return frames, fps
