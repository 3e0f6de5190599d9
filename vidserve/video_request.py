"""The generation request: one validated, fully-resolved description of a video to make.

Shared by the CLI and the API so both apply the same rules, before any model is loaded:
`num_frames = 4*ceil(seconds*fps/4) + 1`, explicit frame counts are 4k+1 of at least
`MIN_FRAMES`, width and height are multiples of 16 (or of the model's VAE stride x patch) and
no larger than the model's position table covers. A size far from those the model was trained
at is made, with a warning on the request.
"""

from __future__ import annotations

import math
import random
from typing import Any

from pydantic import ValidationError

from vidserve.config import Settings
from vidserve.errors import InvalidRequest, from_validation_error
from vidserve.loras import LoraRegistry, LoraRequest
from vidserve.media.drift import MIN_CHUNK_FRAMES
from vidserve.media.quality import OutputWarning
from vidserve.media.renditions import parse_size
from vidserve.options import AttentionOptions, CacheOptions, GenerationOptions
from vidserve.registry import ModelSpec
from vidserve.vocabulary import prompt_warnings


# The fewest frames a video may have: the smallest 4k+1 a chunk can make. An extension, which
# opens on the frame it continues, adds at least one fewer.
MIN_FRAMES = 4 * math.ceil((MIN_CHUNK_FRAMES - 1) / 4) + 1


class ResolvedOptions(GenerationOptions):
    """`GenerationOptions` with every default filled in, and the clip's geometry: what a
    pipeline runs and a job keeps (`vidserve.params.JobParams`)."""

    width: int
    height: int
    num_frames: int  # frames generated; when continuing, only the new ones
    fps: int
    # The frames each chunk generates; more than one chunk chains them (see drift.chain).
    chunk_frames: tuple[int, ...]
    steps: int
    guidance: float
    seed: int
    negative_prompt: str = ""
    prompts: tuple[str, ...] = ()
    attention: AttentionOptions = AttentionOptions()
    cache: CacheOptions = CacheOptions()
    loras: tuple[LoraRequest, ...] = ()  # applied on every chunk; none runs exactly the base model
    flow_shift: float | None = None  # the sampler's shift, from the preset; None: the model's


class GenerationRequest(ResolvedOptions):
    model: str
    prompt: str
    image: Any = None  # a PIL RGB image conditioning the first frame (i2v / ti2v)
    # `image` is the last frame of a video being extended: it is not repeated in the output,
    # and num_frames counts only the new frames (a multiple of 4).
    continuing: bool = False
    # What the request itself gives reason to doubt (a size the model was not trained at, a
    # prompt it cannot read), known before a frame is made: the job's first warnings.
    warnings: tuple[OutputWarning, ...] = ()

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
def build_request(
    spec: ModelSpec,
    settings: Settings,
    prompt: str,
    options: GenerationOptions = GenerationOptions(),
    *,
    size: str | None = None,
    seconds: float | None = None,
    num_frames: int | None = None,
    fps: int | None = None,
    image: Any = None,
    continuing: bool = False,
    adapters: LoraRegistry | None = None,
) -> GenerationRequest:
    """Check every field against the model and the server limits; fill in defaults.

    With `continuing`, `image` is the last frame of a video being extended and the length
    (`seconds` or `num_frames`) is what is added: 4*ceil(seconds*fps/4) new frames.
    `options.preset` (one of the model's) fills steps, guidance, the sampler's shift and
    adapters the options leave unset; `adapters` are the registered ones `loras` may name."""
    check_prompt(prompt, settings)
    if continuing:
        return _continuation(spec, settings, prompt, options, image=image, seconds=seconds, num_frames=num_frames,
                             fps=fps, size=size, adapters=adapters)
    if spec.needs_image and image is None:
        raise InvalidRequest(f"model {spec.name} is image-to-video: give an image to start from", param="image")
    if image is not None and not spec.accepts_image:
        raise InvalidRequest(f"model {spec.name} is text-to-video and takes no image", param="image")
    width, height, num_frames, fps = _geometry(spec, settings, size, seconds, num_frames, fps)
    chunk_frames = plan_chunks(num_frames, spec.frames_per_chunk)
    if options.caption_chain and len(chunk_frames) == 1:
        raise InvalidRequest(f"caption_chain captions the frame each chunk continues from, but {num_frames} frames "
                             f"fit in one chunk of {spec.frames_per_chunk}; ask for a longer video",
                             param="caption_chain")
    resolved = _resolved_options(spec, settings, options, chunk_frames, adapters, continuing=False)
    return GenerationRequest(**resolved, model=spec.name, prompt=prompt, image=image, width=width, height=height,
                             num_frames=num_frames, fps=fps, chunk_frames=chunk_frames,
                             warnings=(*size_warnings(spec, width, height),
                                       *prompt_warnings(spec.understands, spec.name, prompt, options.prompts or ())))


def _geometry(spec: ModelSpec, settings: Settings, size: str | None, seconds: float | None, num_frames: int | None,
              fps: int | None) -> tuple[int, int, int, int]:
    """(width, height, frames, fps) of a clip, each checked against the model and the limits."""
    width, height = parse_size(size) if size else (spec.width, spec.height)
    _check_size(spec, settings, width, height)
    fps = spec.fps if fps is None else fps
    if not 1 <= fps <= 60:
        raise InvalidRequest(f"fps must be between 1 and 60, got {fps}", param="fps")
    if seconds is not None and num_frames is not None:
        raise InvalidRequest("give seconds or num_frames, not both", param="num_frames")
    if num_frames is not None:
        if num_frames < MIN_FRAMES or num_frames % 4 != 1:
            raise InvalidRequest(f"num_frames must be 4k+1 and at least {MIN_FRAMES} (e.g. 17, 33, 81), "
                                 f"got {num_frames}", param="num_frames")
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
    return width, height, num_frames, fps


def _check_size(spec: ModelSpec, settings: Settings, width: int, height: int) -> None:
    """Refuses a size the model cannot make, or one over the server's limit, saying what it can make."""
    multiple, largest = spec.size_multiple, min(spec.max_side, settings.max_side)
    can_make = f"width and height must be multiples of {multiple}, from {multiple} to {largest} pixels"
    if spec.trained_sizes:
        can_make += "; it was trained at " + ", ".join(f"{w}x{h}" for w, h in spec.trained_sizes)
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise InvalidRequest(f"size {width}x{height} is not one {spec.name} can make: {can_make}", param="size")
    if max(width, height) > largest:
        if largest == spec.max_side:
            raise InvalidRequest(f"size {width}x{height} is larger than {spec.name} can make, as its position table "
                                 f"covers {spec.max_side} pixels a side: {can_make}", param="size")
        raise InvalidRequest(f"size {width}x{height} exceeds the limit of {settings.max_side} pixels a side",
                             param="size")


def size_warnings(spec: ModelSpec, width: int, height: int) -> tuple[OutputWarning, ...]:
    """An `untrained_size` warning when (width, height) is far from every size the model was trained at."""
    nearest = spec.untrained_size(width, height)
    if nearest is None:
        return ()
    return (OutputWarning(code="untrained_size", message=f"{spec.name} was trained at {nearest[0]}x{nearest[1]}, "
                          f"and {width}x{height} is far from it: expect noise or a broken picture; ask for a size "
                          f"nearer {nearest[0]}x{nearest[1]}"),)


def _resolved_options(spec: ModelSpec, settings: Settings, options: GenerationOptions, chunk_frames: list[int],
                      adapters: LoraRegistry | None, continuing: bool) -> dict[str, Any]:
    """Every option with its default filled in (the preset's, then the model's, then the
    server's), checked against the model and the limits; a field no rule here names is kept
    as asked."""
    asked = {name: getattr(options, name) for name in GenerationOptions.model_fields}
    steps, guidance, loras, flow_shift = options.steps, options.guidance, options.loras, None
    adapters = adapters or LoraRegistry([])
    if options.preset is not None:
        chosen = spec.preset(options.preset)
        steps = chosen.steps if steps is None else steps
        guidance = chosen.guidance if guidance is None else guidance
        flow_shift = chosen.flow_shift
        if loras is None:
            adapters.check_preset(options.preset, chosen.loras)
            loras = list(chosen.loras)
    negative_prompt = options.negative_prompt or ""
    if len(negative_prompt) > settings.max_prompt_chars:
        raise InvalidRequest(f"negative_prompt is {len(negative_prompt)} characters; the limit is "
                             f"{settings.max_prompt_chars}", param="negative_prompt")
    steps = spec.default_steps if steps is None else steps
    if not 1 <= steps <= settings.max_steps:
        raise InvalidRequest(f"steps must be between 1 and {settings.max_steps}, got {steps}",
                             param="num_inference_steps")
    guidance = spec.default_guidance if guidance is None else guidance
    if not 0 <= guidance <= 30:
        raise InvalidRequest(f"guidance must be between 0 and 30, got {guidance:g}", param="guidance_scale")
    seed = options.seed
    if seed is None:
        seed = random.randrange(2**31)
    elif not 0 <= seed < 2**63:
        raise InvalidRequest(f"seed must be between 0 and 2^63-1, got {seed}", param="seed")
    _check_chain(spec, chunk_frames, options.prompts, settings.max_prompt_chars)
    try:
        loras = tuple(LoraRequest.model_validate(lora) for lora in loras or ())
    except ValidationError as exc:
        raise from_validation_error(exc, prefix="loras") from None
    if loras:  # checked against every model it runs on: a long video's or an extension's continuation model too
        models = [] if continuing else [spec.name]
        if continuing or len(chunk_frames) > 1:
            models.append(spec.continues_with)
        adapters.check(loras, models, settings.max_loras)
    return {**asked, "steps": steps, "guidance": guidance, "seed": seed, "negative_prompt": negative_prompt,
            "prompts": tuple(options.prompts or ()), "loras": loras, "flow_shift": flow_shift,
            "attention": _with_defaults(AttentionOptions, "attention", options.attention, settings.attention),
            "cache": _with_defaults(CacheOptions, "cache", options.cache, settings.cache)}


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


def _check_chain(spec: ModelSpec, chunk_frames: list[int], prompts: list[str] | None, max_prompt_chars: int) -> None:
    if len(chunk_frames) > 1 and spec.continues_with is None:
        raise InvalidRequest(f"{spec.name} makes at most {spec.frames_per_chunk} frames and has no image-to-video "
                             "model to continue its clips; ask for fewer frames", param="num_frames")
    if prompts is not None:
        if len(prompts) > len(chunk_frames) or not all(p and p.strip() for p in prompts):
            raise InvalidRequest(f"prompts must be at most {len(chunk_frames)} non-empty prompts, one per chunk "
                                 f"of {spec.frames_per_chunk} frames", param="prompts")
        if any(len(p) > max_prompt_chars for p in prompts):
            raise InvalidRequest(f"each of prompts may have at most {max_prompt_chars} characters", param="prompts")


def _continuation(spec: ModelSpec, settings: Settings, prompt: str, options: GenerationOptions, *, image: Any,
                  seconds: float | None, num_frames: int | None, fps: int | None, size: str | None,
                  adapters: LoraRegistry | None) -> GenerationRequest:
    """An extension: validated as a clip of the new frames plus the one it continues from."""
    if image is None:
        raise InvalidRequest("an extension needs the video to continue from", param="video")
    if spec.continues_with is None:
        raise InvalidRequest(f"{spec.name} has no image-to-video model to continue its clips", param="model")
    if num_frames is not None:
        if num_frames < MIN_FRAMES - 1 or num_frames % 4:
            raise InvalidRequest(f"an extension adds a multiple of 4 frames, at least {MIN_FRAMES - 1}, got "
                                 f"{num_frames}", param="num_frames")
        num_frames += 1
    # The geometry of a clip that opens on the continued frame, less that frame. Every chunk of an
    # extension continues a frame, so caption_chain always applies.
    width, height, clip_frames, fps = _geometry(spec, settings, size, seconds, num_frames, fps)
    chunk_frames = plan_chunks(clip_frames - 1, spec.frames_per_chunk, continuing=True)
    resolved = _resolved_options(spec, settings, options, chunk_frames, adapters, continuing=True)
    return GenerationRequest(**resolved, model=spec.name, prompt=prompt, image=image, continuing=True, width=width,
                             height=height, num_frames=clip_frames - 1, fps=fps, chunk_frames=chunk_frames,
                             warnings=(*size_warnings(spec, width, height),
                                       *prompt_warnings(spec.understands, spec.name, prompt, options.prompts or ())))
