"""A worker's warm-up before its first job: one tiny generation of the model and the encodes a job
makes, so that the first job pays for none of the first calls: imports, the load, each kernel's
first run (on CUDA, its autotuning), ffmpeg's."""

from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

from PIL import Image

from vidserve.config import Settings
from vidserve.media import save_thumbnail
from vidserve.media.hls import encode_segment, join_segments
from vidserve.media.spritesheet import save_spritesheet
from vidserve.options import GenerationOptions
from vidserve.registry import resolve_local, weights_here
from vidserve.video_request import build_request

log = logging.getLogger("vidserve.runner")

WARM_UP_STEPS = 2  # a warm-up generation's: enough for every call a job makes, at a tenth of its steps


def warm_up(settings: Settings, model: str) -> None:
    """One generation of `model` (WARM_UP_STEPS steps, one chunk at its native size) and a job's
    encodes. A failure is logged and left to the first job, which reports it; weights not on this
    machine are never fetched for it."""
    start = time.perf_counter()
    try:
        spec = resolve_local(model)
        if not weights_here(spec):
            log.info("no warm-up: the weights of %s are not on this machine", model)
            return
        from vidserve.pipelines.chain import generate_video  # torch stays out of processes that never run jobs

        # An image-to-video model takes a first frame: a gray one.
        image = Image.new("RGB", (spec.width, spec.height), (128, 128, 128)) if spec.kind == "i2v" else None
        request = build_request(spec, settings, "warm-up", GenerationOptions(steps=WARM_UP_STEPS, seed=0),
                                image=image)
        frames = generate_video(request, settings.device, settings.dtype, load=settings.load).frames
        with tempfile.TemporaryDirectory(prefix="warm-up-") as tmp:
            segment = encode_segment(frames, request.fps)
            join_segments(segment.init, [segment.media], Path(tmp) / "video.mp4")
            save_thumbnail(frames, Path(tmp) / "thumbnail.webp")
            save_spritesheet(frames, Path(tmp) / "spritesheet.jpg")
    except Exception:
        log.exception("the warm-up of %s failed; its first job will load it", model)
        return
    log.info("warmed up %s in %.1f s", model, time.perf_counter() - start)
