"""The generation request: one validated, fully-resolved description of a video to make.

Shared by the CLI and the API so both apply the same rules, before any model is loaded:
`num_frames = 4*ceil(seconds*fps/4) + 1`, explicit frame counts are 4k+1, width and
height are multiples of 16 (or of the model's VAE stride x patch).
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from vidserve.config import Settings
from vidserve.errors import InvalidRequest, echo, from_validation_error
from vidserve.loras import LoraRegistry, LoraRequest
from vidserve.options import AttentionOptions, CacheOptions
from vidserve.registry import ModelSpec


@dataclass
class GenerationRequest:
    model: str
    prompt: str
    width: int
    height: int
    num_frames: int
    fps: int
    steps: int
    guidance: float
    seed: int
    negative_prompt: str = ""
    image: Any = None  # a PIL RGB image conditioning the first frame (i2v / ti2v)
    # The frames each chunk generates; more than one chunk chains them (see drift.chain).
    chunk_frames: list[int] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)  # per-chunk prompts; chunks past the list use `prompt`
    drift_correction: str = "color"
    # `image` is the last frame of a video being extended: it is not repeated in the output,
    # and num_frames counts only the new frames (a multiple of 4).
    continuing: bool = False
    attention: AttentionOptions = field(default_factory=AttentionOptions)
    # The LLM path helps: rewrite the prompt first (seeing the image, if any); caption the
    # frame each continuation chunk starts from into that chunk's prompt.
    prompt_extend: bool = False
    caption_chain: bool = False
    cache: CacheOptions = field(default_factory=CacheOptions)
    # LoRA adapters applied on every chunk; none runs exactly the base model.
    loras: tuple[LoraRequest, ...] = ()
    preset: str | None = None  # the preset it was filled from, as recorded
    flow_shift: float | None = None  # the sampler's shift; None: the model's

    @property
    def seconds(self) -> float:
        return (self.num_frames if self.continuing else self.num_frames - 1) / self.fps

    def prompt_for(self, chunk: int) -> str:
        return self.prompts[chunk] if chunk < len(self.prompts) else self.prompt


def plan_chunks(num_frames: int, frames_per_chunk: int, continuing: bool = False) -> list[int]:
    """Frames each chunk generates. A chunk after the first (or every chunk, when continuing a
    video) opens on the frame it continues from, so it adds one frame fewer than it makes."""
    plan = [] if continuing else [min(num_frames, frames_per_chunk)]
    remaining = num_frames - sum(plan)
    while remaining > 0:
        new = min(frames_per_chunk - 1, remaining)
        plan.append(new + 1)
        remaining -= new
    return plan


def frames_for_seconds(seconds: float, fps: int) -> int:
    """5 s at 16 fps -> 81; 2 s -> 33. The +1 is the first frame the VAE keeps whole."""
    return 4 * math.ceil(round(seconds * fps, 6) / 4) + 1


# ASCII digits only: str.isdigit() also takes superscripts, which int() then refuses. Six at
# most, so no digit string is long enough for int() to refuse either.
_SIZE = re.compile(r"\s*([0-9]{1,6})\s*[xX]\s*([0-9]{1,6})\s*")


def parse_size(size: str) -> tuple[int, int]:
    """'WxH' -> (width, height)."""
    match = _SIZE.fullmatch(size)
    if match is None:
        raise InvalidRequest(f"size must look like WIDTHxHEIGHT (e.g. 832x480), got {echo(size)}", param="size")
    return int(match.group(1)), int(match.group(2))


def build_request(
    spec: ModelSpec,
    settings: Settings,
    prompt: str,
    *,
    size: str | None = None,
    seconds: float | None = None,
    num_frames: int | None = None,
    fps: int | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    seed: int | None = None,
    negative_prompt: str = "",
    image: Any = None,
    prompts: list[str] | None = None,
    drift_correction: str = "color",
    continuing: bool = False,
    attention: AttentionOptions | dict[str, Any] | None = None,
    prompt_extend: bool = False,
    caption_chain: bool = False,
    cache: CacheOptions | dict[str, Any] | None = None,
    loras: list[LoraRequest | dict[str, Any]] | None = None,
    preset: str | None = None,
    adapters: LoraRegistry | None = None,
) -> GenerationRequest:
    """Check every field against the model and the server limits; fill in defaults.

    With `continuing`, `image` is the last frame of a video being extended and the length
    (`seconds` or `num_frames`) is what is added: 4*ceil(seconds*fps/4) new frames.
    `preset` (one of the model's) fills steps, guidance, the sampler's shift and adapters the
    request leaves unset; `adapters` are the registered ones `loras` may name."""
    check_prompt(prompt, settings)
    flow_shift = None
    if preset is not None:
        chosen = spec.preset(preset)
        steps = chosen.steps if steps is None else steps
        guidance = chosen.guidance if guidance is None else guidance
        flow_shift = chosen.flow_shift
        loras = list(chosen.loras) if loras is None else loras
    if len(negative_prompt) > settings.max_prompt_chars:
        raise InvalidRequest(f"negative_prompt is {len(negative_prompt)} characters; the limit is "
                             f"{settings.max_prompt_chars}", param="negative_prompt")
    if continuing:
        request = _continuation(spec, settings, prompt, image=image, seconds=seconds, num_frames=num_frames,
                                fps=fps, size=size, steps=steps, guidance=guidance, seed=seed,
                                negative_prompt=negative_prompt, prompts=prompts, drift_correction=drift_correction,
                                attention=attention, prompt_extend=prompt_extend, caption_chain=caption_chain,
                                cache=cache)
        return _with_adapters(request, spec, settings, loras, preset, flow_shift, adapters)
    if spec.needs_image and image is None:
        raise InvalidRequest(f"model {spec.name} is image-to-video: give an image to start from", param="image")
    if image is not None and not spec.accepts_image:
        raise InvalidRequest(f"model {spec.name} is text-to-video and takes no image", param="image")

    width, height = parse_size(size) if size else (spec.width, spec.height)
    multiple = spec.size_multiple
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise InvalidRequest(
            f"width and height must be positive multiples of {multiple} for {spec.name}, got {width}x{height}",
            param="size",
        )
    if max(width, height) > settings.max_side:
        raise InvalidRequest(f"size {width}x{height} exceeds the limit of {settings.max_side} pixels a side",
                             param="size")

    fps = spec.fps if fps is None else fps
    if not 1 <= fps <= 60:
        raise InvalidRequest(f"fps must be between 1 and 60, got {fps}", param="fps")
    if seconds is not None and num_frames is not None:
        raise InvalidRequest("give seconds or num_frames, not both", param="num_frames")
    if num_frames is not None:
        if num_frames < 1 or num_frames % 4 != 1:
            raise InvalidRequest(f"num_frames must be 4k+1 (e.g. 17, 33, 81), got {num_frames}",
                                 param="num_frames")
    elif seconds is not None:
        if not 0 < seconds <= settings.max_seconds:
            raise InvalidRequest(f"seconds must be greater than 0 and at most {settings.max_seconds:g}, "
                                 f"got {seconds:g}", param="seconds")
        num_frames = frames_for_seconds(seconds, fps)
    else:
        num_frames = spec.frames_per_chunk
    if num_frames > settings.max_frames or (num_frames - 1) / fps > settings.max_seconds:
        raise InvalidRequest(f"{num_frames} frames at {fps} fps exceeds the limit of {settings.max_frames} frames "
                             f"or {settings.max_seconds:g} seconds", param="num_frames")

    steps = spec.default_steps if steps is None else steps
    if not 1 <= steps <= settings.max_steps:
        raise InvalidRequest(f"steps must be between 1 and {settings.max_steps}, got {steps}",
                             param="num_inference_steps")
    guidance = spec.default_guidance if guidance is None else guidance
    if not 0 <= guidance <= 30:
        raise InvalidRequest(f"guidance must be between 0 and 30, got {guidance:g}", param="guidance_scale")
    if seed is None:
        seed = random.randrange(2**31)
    elif not 0 <= seed < 2**63:
        raise InvalidRequest(f"seed must be between 0 and 2^63-1, got {seed}", param="seed")

    chunk_frames = plan_chunks(num_frames, spec.frames_per_chunk)
    _check_chain(spec, chunk_frames, prompts, drift_correction, settings.max_prompt_chars)
    if caption_chain and len(chunk_frames) == 1:
        raise InvalidRequest(f"caption_chain captions the frame each chunk continues from, but {num_frames} frames "
                             f"fit in one chunk of {spec.frames_per_chunk}; ask for a longer video", param="caption_chain")
    attention = _with_defaults(AttentionOptions, "attention", attention, settings.attention)
    cache = _with_defaults(CacheOptions, "cache", cache, settings.cache)

    request = GenerationRequest(
        model=spec.name, prompt=prompt, negative_prompt=negative_prompt, image=image,
        width=width, height=height, num_frames=num_frames, fps=fps, steps=steps,
        guidance=guidance, seed=seed, chunk_frames=chunk_frames, prompts=list(prompts or []),
        drift_correction=drift_correction, attention=attention,
        prompt_extend=prompt_extend, caption_chain=caption_chain, cache=cache,
    )
    return _with_adapters(request, spec, settings, loras, preset, flow_shift, adapters)


def _with_adapters(request: GenerationRequest, spec: ModelSpec, settings: Settings, loras, preset: str | None,
                   flow_shift: float | None, adapters: LoraRegistry | None) -> GenerationRequest:
    """The request with its adapters, checked against the registered ones and every model it
    runs on: a long video's or an extension's continuation model too."""
    try:
        request.loras = tuple(LoraRequest.model_validate(lora) for lora in loras or ())
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="loras") from None
    if request.loras:
        models = [] if request.continuing else [spec.name]
        if request.continuing or len(request.chunk_frames) > 1:
            models.append(spec.continues_with)
        (adapters or LoraRegistry([])).check(request.loras, models, settings.max_loras)
    request.preset, request.flow_shift = preset, flow_shift
    return request


def check_prompt(prompt: str, settings: Settings) -> None:
    """The one set of prompt limits, for the API and the CLI alike."""
    if not prompt or not prompt.strip():
        raise InvalidRequest("prompt must not be empty", param="prompt")
    if len(prompt) > settings.max_prompt_chars:
        raise InvalidRequest(f"prompt is {len(prompt)} characters; the limit is {settings.max_prompt_chars}",
                             param="prompt")


def _with_defaults(options_type, name: str, given, default):
    """A request's options object; fields it leaves out keep the server's default."""
    if given is None:
        return default
    if isinstance(given, options_type):
        return given
    try:
        return options_type.model_validate({**default.model_dump(), **given})
    except ValidationError as exc:
        raise from_validation_error(exc, prefix=name) from None


def _check_chain(spec: ModelSpec, chunk_frames: list[int], prompts: list[str] | None, drift_correction: str,
                 max_prompt_chars: int) -> None:
    if len(chunk_frames) > 1 and spec.continues_with is None:
        raise InvalidRequest(f"{spec.name} makes at most {spec.frames_per_chunk} frames and has no image-to-video "
                             "model to continue its clips; ask for fewer frames", param="num_frames")
    if prompts is not None:
        if len(prompts) > len(chunk_frames) or not all(p and p.strip() for p in prompts):
            raise InvalidRequest(f"prompts must be at most {len(chunk_frames)} non-empty prompts, one per chunk "
                                 f"of {spec.frames_per_chunk} frames", param="prompts")
        if any(len(p) > max_prompt_chars for p in prompts):
            raise InvalidRequest(f"each of prompts may have at most {max_prompt_chars} characters", param="prompts")
    if drift_correction not in ("color", "none"):
        raise InvalidRequest(f"drift_correction must be 'color' or 'none', got {drift_correction!r}",
                             param="drift_correction")


def _continuation(spec: ModelSpec, settings: Settings, prompt: str, *, image: Any, seconds: float | None,
                  num_frames: int | None, fps: int | None, **kwargs: Any) -> GenerationRequest:
    """An extension: validated as a clip of the new frames plus the one it continues from."""
    if image is None:
        raise InvalidRequest("an extension needs the video to continue from", param="video")
    if spec.continues_with is None:
        raise InvalidRequest(f"{spec.name} has no image-to-video model to continue its clips", param="model")
    fps = spec.fps if fps is None else fps
    if num_frames is not None:
        if num_frames < 4 or num_frames % 4:
            raise InvalidRequest(f"an extension adds a multiple of 4 frames, got {num_frames}", param="num_frames")
        seconds, num_frames = None, num_frames + 1
    # Validate as a clip that opens on the continued frame, then drop that frame from the count.
    # (Every chunk of an extension continues a frame, so caption_chain always applies.)
    caption_chain = kwargs.pop("caption_chain")
    request = build_request(spec, settings, prompt, seconds=seconds, num_frames=num_frames, fps=fps,
                            image=image if spec.accepts_image else None, **kwargs)
    request.image, request.continuing, request.num_frames = image, True, request.num_frames - 1
    request.caption_chain = caption_chain
    request.chunk_frames = plan_chunks(request.num_frames, spec.frames_per_chunk, continuing=True)
    _check_chain(spec, request.chunk_frames, kwargs.get("prompts"), request.drift_correction,
                 settings.max_prompt_chars)
    return request
