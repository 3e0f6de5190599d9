"""Turning a validated request body into a queued job. Everything is checked against the
model and the server's limits first, so nothing invalid ever reaches a worker."""

from __future__ import annotations

import io

from PIL import Image

from vidserve.jobs import AdmissionLimits, Job, JobStatus, QuotaExceeded
from vidserve.jobs.files import JobFiles
from vidserve.keys import Caller
from vidserve.config import Settings
from vidserve.media import VideoInfo, load_image, probe_video, read_last_frame
from vidserve.options import GenerationOptions
from vidserve.outbound import check_url
from vidserve.params import JobParams
from vidserve.priorities import Priority, allows
from vidserve.registry import ModelSpec, resolve, resolve_local
from vidserve.media.renditions import OutputRequest, resolve_outputs
from vidserve.video_request import GenerationRequest, build_request, check_prompt
from vidserve.telemetry import ANONYMOUS_LABEL
from vidserve.vocabulary import prompt_warnings

from .errors import APIError, not_found, video_expired
from .protocol.videos import VideoCreate, VideoExtend
from .services import Services


def submit_video(svc: Services, caller: Caller, body: VideoCreate, image_bytes: bytes | None, *,
                 idempotency_key: str | None = None, request_hash: str | None = None) -> Job:
    spec = _model_spec(svc, body.model, svc.settings.default_model)
    image = load_image(image_bytes, svc.settings.max_image_pixels) if image_bytes is not None else None
    request = build_request(spec, svc.settings, body.prompt, body, size=body.size, seconds=body.seconds,
                            num_frames=body.num_frames, fps=body.fps, image=image, adapters=svc.adapters)
    _check_request_quotas(svc, caller, request)
    outputs = resolve_outputs(body.outputs, request.width, request.height, request.fps, request.num_frames,
                              svc.settings)
    seconds = f"{body.seconds:g}" if body.seconds is not None else f"{request.seconds:g}"
    if idempotency_key is not None and caller.name is not None:
        idempotency_key = f"{caller.name}:{idempotency_key}"  # one key's retries never find another key's job
    job = _job(svc, caller, spec.name, request.prompt, JobParams.of(request, seconds, outputs=outputs),
               webhook_url=body.webhook_url, webhook_events=body.webhook_events,
               metadata=body.metadata, idempotency_key=idempotency_key,
               request_hash=request_hash, warnings=list(request.warnings))
    if image is not None:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        job.input_image_key = svc.storage.put_bytes(JobFiles(job.id).input_image, buffer.getvalue())
    return _enqueue(svc, caller, job)


def submit_extension(svc: Services, caller: Caller, body: VideoExtend, upload: bytes | None) -> Job:
    """A job continuing a video from its last frame; its content is the source + the new frames."""
    if (body.video is None) == (upload is None):
        raise APIError(400, "give the video to extend: either video={\"id\": ...} or an uploaded MP4 file",
                       param="video")
    if body.video is not None:
        source_job = svc.store.get(body.video.id)
        if source_job is None or not caller.sees(source_job.owner):
            raise not_found(body.video.id)
        if source_job.status is not JobStatus.completed:
            raise APIError(409, f"video {source_job.id} is {source_job.status.value}; only a completed video "
                                "can be extended", param="video", code="video_not_ready")
        if source_job.is_expired():
            raise video_expired(source_job, param="video")
        source_bytes = svc.storage.read_bytes(source_job.outputs["video"])
        model = source_job.model
        options = _denoised_like(body, source_job)
    else:
        source_bytes, model, options = upload, svc.settings.default_model, body
    info = _probe_video(svc.settings, source_bytes)
    spec = _model_spec(svc, body.model, model)
    # Checked on a stand-in for the last frame, of the probed size: a video whose extension would
    # be over the limits is refused before a frame of it is decoded.
    stand_in = Image.new("RGB", (info.width, info.height))
    request = build_request(spec, svc.settings, body.prompt, options, size=f"{info.width}x{info.height}",
                            seconds=body.seconds, fps=round(info.fps), image=stand_in, continuing=True,
                            adapters=svc.adapters)
    _check_request_quotas(svc, caller, request)
    _check_extended_length(svc.settings, info.frames + request.num_frames, request.fps)
    source_frames = _decoded_frames(source_bytes)
    total = source_frames + request.num_frames  # decoded frames, which the worker joins to: the probe counted packets
    _check_extended_length(svc.settings, total, request.fps)
    # Renditions of the whole extended video.
    outputs = resolve_outputs(body.outputs, request.width, request.height, request.fps, total, svc.settings)
    params = JobParams.of(request, f"{(total - 1) / request.fps:g}", source_frames=source_frames, outputs=outputs)
    job = _job(svc, caller, spec.name, request.prompt, params, webhook_url=body.webhook_url,
               webhook_events=body.webhook_events, metadata=body.metadata,
               extends_video_id=body.video.id if body.video else None, warnings=list(request.warnings))
    source_key = JobFiles(job.id).source_video
    job.source_video_key = (svc.storage.copy(source_job.outputs["video"], source_key) if body.video is not None
                            else svc.storage.put_bytes(source_key, source_bytes))
    return _enqueue(svc, caller, job)


def submit_remix(svc: Services, caller: Caller, source: Job, prompt: str, priority: Priority | None = None,
                 outputs: list[OutputRequest] | None = None) -> Job:
    """The same job with a new prompt: every parameter, the first frame, and for an extension
    the video it continues, are the source's; and its priority and renditions, unless `priority`
    and `outputs` name others."""
    check_prompt(prompt, svc.settings)
    spec = resolve_local(source.model)
    _check_available(svc, spec)
    params = source.params
    if priority is not None:
        params = params.model_copy(update={"priority": priority})
    if outputs is not None:
        renditions = resolve_outputs(outputs, params.width, params.height, params.fps,
                                     params.source_frames + params.num_frames, svc.settings)
        params = params.model_copy(update={"outputs": renditions})
    if source.is_expired():  # its first frame and source video went with its outputs
        raise video_expired(source)
    job = _job(svc, caller, source.model, prompt, params, webhook_url=source.webhook_url,
               webhook_events=source.webhook_events,
                   metadata=source.metadata, remixed_from_video_id=source.id, extends_video_id=source.extends_video_id,
               warnings=prompt_warnings(spec.understands, spec.name, prompt, params.prompts))
    if source.input_image_key:
        job.input_image_key = svc.storage.copy(source.input_image_key, JobFiles(job.id).input_image)
    if source.source_video_key:
        job.source_video_key = svc.storage.copy(source.source_video_key, JobFiles(job.id).source_video)
    return _enqueue(svc, caller, job)


def _denoised_like(body: VideoExtend, source: Job) -> GenerationOptions:
    """A referenced video's extension denoises like the video did, unless told otherwise."""
    asked = {"steps": body.steps if body.steps is not None else source.params.steps,
             "guidance": body.guidance if body.guidance is not None else source.params.guidance}
    if body.loras is None and body.preset is None:
        asked["loras"] = list(source.params.loras)
    return body.model_copy(update=asked)


def _job(svc: Services, caller: Caller, model: str, prompt: str, params: JobParams, *, webhook_url: str | None,
         **fields) -> Job:
    if (params.prompt_extend or params.caption_chain) and svc.chat is None and not svc.settings.chat_url:
        param = "prompt_extend" if params.prompt_extend else "caption_chain"
        raise APIError(400, f"{param} needs the LLM path, and this server runs no chat model "
                       "(set VIDSERVE_CHAT_MODEL, or VIDSERVE_CHAT_URL for workers)", param=param)
    if webhook_url:  # a receiver the server would refuse to call is bad input now, not a failed delivery later
        check_url(webhook_url, svc.settings.allow_private_urls, param="webhook_url")
    if not allows(caller.max_priority, params.priority):
        _reject(svc, caller, "max_priority")
        raise APIError(403, f"priority {params.priority!r} is above what API key {caller.name!r} may ask for "
                            f"(max_priority {caller.max_priority!r})", param="priority", code="priority_not_allowed")
    return Job(model=model, prompt=prompt, max_attempts=svc.settings.max_attempts, params=params,
               owner=caller.name, share=caller.share, webhook_url=webhook_url, **fields)


def _check_request_quotas(svc: Services, caller: Caller, request: GenerationRequest) -> None:
    """A key's own maxima, tighter than the server's (which build_request applies). A 400, not
    a 429: the same request would be refused again, however long the client waits."""
    asked = {"max_seconds": ((request.num_frames - 1) / request.fps, "seconds"),
             "max_side": (max(request.width, request.height), "size"),
             "max_steps": (request.steps, "num_inference_steps")}
    for quota, (value, param) in asked.items():
        limit = getattr(caller.quotas, quota)
        if limit is not None and value > limit:
            _reject(svc, caller, quota)
            raise APIError(400, f"{param}: API key {caller.name!r} may ask for at most {quota} {limit:g}; "
                                f"this request asks for {value:g}", param=param, code="quota_exceeded")


def _reject(svc: Services, caller: Caller, limit: str) -> None:
    svc.metrics.key_rejected.labels(caller.name or ANONYMOUS_LABEL, limit).inc()


def _enqueue(svc: Services, caller: Caller, job: Job) -> Job:
    """Store `job` and queue it, within the queue's and the caller's limits, which the store
    checks in the step that stores it: however many requests race, no limit is overshot."""
    limits = AdmissionLimits(max_queued=svc.settings.max_queued,
                             max_active=caller.limit("max_active_jobs", svc.settings.key_max_active_jobs))
    try:
        stored, created = svc.store.create(job, limits)
    except QuotaExceeded as refused:
        svc.storage.delete_prefix(JobFiles(job.id).prefix)  # its first frame or source video, stored for a job that never was
        _reject(svc, caller, refused.limit)
        raise _quota_error(caller, refused) from None
    if not created:  # an Idempotency-Key retry: the job already exists
        svc.storage.delete_prefix(JobFiles(job.id).prefix)
        if stored.request_hash != job.request_hash:
            raise APIError(422, "this Idempotency-Key was already used with a different request body",
                           param="Idempotency-Key", code="idempotency_key_reused")
        return stored
    svc.queue.submit(stored)
    svc.metrics.key_accepted.labels(stored.owner or ANONYMOUS_LABEL).inc()
    return stored


def _quota_error(caller: Caller, refused: QuotaExceeded) -> APIError:
    if refused.limit == "max_queued":
        return APIError(429, f"the queue is full ({refused.count} jobs waiting); try again later", param="max_queued",
                        code="queue_full", headers={"Retry-After": "30"})
    return APIError(429, f"API key {caller.name!r} has {refused.count} jobs queued or running, its limit "
                         f"(max_active_jobs {refused.allowed}); retry when one finishes", param="max_active_jobs",
                    code="quota_exceeded", headers={"Retry-After": "30"})


def _model_spec(svc: Services, asked: str | None, default: str) -> ModelSpec:
    """A model a client names is a registry entry or a folder in model_dirs, never another path;
    the default (the server's, or the extended video's) was the operator's choice or resolved already.
    Either way it must be able to run now."""
    spec = resolve(asked, svc.settings.model_directories) if asked else resolve_local(default)
    _check_available(svc, spec)
    return spec


def _check_available(svc: Services, spec: ModelSpec) -> None:
    """Refused before anything is stored or queued: the job could only fail, or wait for nobody."""
    reason = svc.unavailable(spec)
    if reason is None:
        return
    if svc.settings.queue == "celery":  # a worker may start: the same request can succeed later
        raise APIError(503, reason, param="model", code="model_unavailable", headers={"Retry-After": "30"})
    raise APIError(400, reason, param="model", code="model_unavailable")


def _probe_video(settings: Settings, data: bytes) -> VideoInfo:
    """Size, frames and rate of the video to extend, read without decoding it, within the limits."""
    info = probe_video(data)
    if info.frames == 0:
        raise APIError(400, "the uploaded video has no frames", param="video", code="invalid_video")
    if max(info.width, info.height) > settings.max_side:
        raise APIError(400, f"the video is {info.width}x{info.height}; the limit is {settings.max_side} pixels a side",
                       param="video", code="invalid_video")
    if info.frames > settings.max_frames:
        raise APIError(400, f"the video has {info.frames} frames; the limit is {settings.max_frames}",
                       param="video", code="invalid_video")
    return info


def _decoded_frames(data: bytes) -> int:
    """Frames of the video to extend, decoded one at a time: the count the worker joins to,
    and proof the worker can decode it."""
    try:
        _, frames, _ = read_last_frame(data)
    except Exception:
        raise APIError(400, "the uploaded video could not be decoded; send an MP4 (H.264)",
                       param="video", code="invalid_video") from None
    return frames


def _check_extended_length(settings: Settings, total: int, fps: int) -> None:
    """An extension's video is the source and the new frames, which a worker holds whole and
    encodes: the same limits as any video apply to it."""
    if total > settings.max_frames or (total - 1) / fps > settings.max_seconds:
        raise APIError(400, f"the extended video would be {total} frames ({(total - 1) / fps:g} s); the limit is "
                            f"{settings.max_frames} frames or {settings.max_seconds:g} seconds", param="seconds")
