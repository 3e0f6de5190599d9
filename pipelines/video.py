"""The video pipeline entry point: a `GenerationRequest` in, frames and timings out.

Wraps diffusers' `WanPipeline` / `WanImageToVideoPipeline` (Wan2.1 T2V and I2V, Wan2.2
TI2V with `expand_timesteps`, Wan2.2 A14B with two experts). A model is loaded once per
(model, device, dtype) and kept; a per-step callback reports progress and lets the
caller cancel between denoising steps by raising `JobCancelled`.
"""

from __future__ import annotations

import json
import tempfile
from contextlib import contextmanager
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from diffusers import DiffusionPipeline, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline
from PIL import Image, ImageOps

from vidserve.loras import LoraRegistry
from vidserve.options import LoadOptions
from vidserve.registry import SERVING_FILE, ModelSpec
from vidserve.video_request import GenerationRequest

from .attention import SparseAttention
from .devices import placement
from .fetch import fetching
from .loras import AdapterCache, LoraEvent
from .speedups import prepare, step_cache, transformers_of
from .tiny import build_tiny_pipeline

StepCallback = Callable[[int, int], None]  # (steps done, total steps); may raise JobCancelled

@dataclass
class GenerationResult:
    frames: np.ndarray  # uint8 [frames, height, width, 3]
    fps: int
    seed: int
    timings: dict[str, float] = field(default_factory=dict)  # seconds: load, denoise, decode
    loras: list[LoraEvent] = field(default_factory=list)  # the adapters it used, loaded now or cached
    attention: str = "dense"  # the self-attention that ran: "sparse", or "dense" (asked for, or too few tokens)


def _load_diffusers(spec: ModelSpec, dtype: torch.dtype) -> DiffusionPipeline:
    if spec.builtin:
        # Built-in models take the checkpoint path too (build -> save -> from_pretrained),
        # so `--model wan-tiny` and an exported folder give bit-identical frames.
        with tempfile.TemporaryDirectory(prefix=f"vidserve-{spec.name}-") as folder:
            build_tiny_pipeline(spec).save_pretrained(folder)
            return _from_pretrained(folder, spec, dtype)
    return _from_pretrained(spec.source, spec, dtype)


def _from_pretrained(source: str, spec: ModelSpec, dtype: torch.dtype) -> DiffusionPipeline:
    # The VAE and CLIP image encoder stay in float32, as Wan's authors run them: they are
    # small, and their precision is what the decoded frames show.
    dtypes = {"default": dtype, "vae": torch.float32, "image_encoder": torch.float32}
    with fetching(source):
        pipe = DiffusionPipeline.from_pretrained(source, dtype=dtypes)
    if "flow_shift" in pipe.scheduler.config and pipe.scheduler.config.flow_shift != spec.flow_shift:
        pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=spec.flow_shift)
    return pipe


class VideoPipeline:
    """One resident model, ready to serve requests one at a time."""

    def __init__(self, spec: ModelSpec, pipe: DiffusionPipeline, device: torch.device):
        self.spec = spec
        self.device = device
        pipe.set_progress_bar_config(disable=True)
        self.text_pipe = pipe if isinstance(pipe, WanPipeline) else None
        self.image_pipe = pipe if isinstance(pipe, WanImageToVideoPipeline) else None
        if spec.kind == "ti2v" and self.image_pipe is None:
            # Wan2.2 TI2V is one set of weights behind two diffusers pipelines.
            self.image_pipe = WanImageToVideoPipeline(
                tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, vae=pipe.vae, scheduler=pipe.scheduler,
                transformer=pipe.transformer, transformer_2=pipe.transformer_2,
                boundary_ratio=pipe.config.boundary_ratio, expand_timesteps=True,
            )
            self.image_pipe.set_progress_bar_config(disable=True)
        self.transformers = transformers_of(pipe)
        self.attention = SparseAttention(self.transformers)
        self.adapters = AdapterCache(pipe, self.transformers)  # both pipelines of a TI2V model share them

    @classmethod
    def load(cls, spec: ModelSpec, device: torch.device, dtype: torch.dtype,
             options: LoadOptions = LoadOptions()) -> "VideoPipeline":
        return cls(spec, prepare(_load_diffusers(spec, dtype), options, device), device)

    def save(self, folder: str) -> None:
        """Write the model as an ordinary diffusers folder that `--model FOLDER` loads: the base
        model, so adapters loaded for requests are unloaded first (they load again when used)."""
        self.adapters.unload_all()
        (self.text_pipe or self.image_pipe).save_pretrained(folder, safe_serialization=True)
        (Path(folder) / SERVING_FILE).write_text(json.dumps({"base": self.spec.name}, indent=2) + "\n")

    def generate(self, request: GenerationRequest, on_step: StepCallback | None = None,
                 adapters: LoraRegistry | None = None) -> GenerationResult:
        """`adapters`: the registered LoRAs the request's `loras` name."""
        kwargs = dict(
            prompt=request.prompt,
            negative_prompt=request.negative_prompt or None,
            height=request.height,
            width=request.width,
            num_frames=request.num_frames,
            num_inference_steps=request.steps,
            guidance_scale=request.guidance,
            generator=torch.Generator("cpu").manual_seed(request.seed),
            max_sequence_length=self.spec.text_tokens,
            output_type="np",
        )
        if request.image is not None:
            # Crop to the requested aspect instead of letting the pipeline stretch the image.
            kwargs["image"] = ImageOps.fit(request.image, (request.width, request.height), Image.LANCZOS)
            pipe = self.image_pipe
        else:
            pipe = self.text_pipe
        if pipe is None:
            raise ValueError(f"model {self.spec.name} cannot generate {'with' if request.image else 'without'} an image")

        self.attention.configure(request.attention)
        lora_events = self.adapters.use(request.loras, adapters or LoraRegistry([]))
        last_step = [time.perf_counter()]

        def step_end(_pipe, index, _timestep, callback_kwargs):
            last_step[0] = time.perf_counter()
            self.attention.step_done(index + 1)
            if on_step is not None:
                on_step(index + 1, request.steps)
            return callback_kwargs

        start = time.perf_counter()
        with torch.inference_mode(), step_cache(self.transformers, request.cache), _shifted(pipe, request.flow_shift):
            video = pipe(callback_on_step_end=step_end, **kwargs).frames[0]
        end = time.perf_counter()
        frames = (np.clip(video, 0.0, 1.0) * 255.0).round().astype(np.uint8)
        timings = {"denoise": last_step[0] - start, "decode": end - last_step[0]}
        return GenerationResult(frames=frames, fps=request.fps, seed=request.seed, timings=timings,
                                loras=lora_events, attention=self.attention.effective)


@contextmanager
def _shifted(pipe: DiffusionPipeline, flow_shift: float | None):
    """The pipeline with a scheduler of this flow shift (a preset's) for one request."""
    scheduler = pipe.scheduler
    if flow_shift is not None and scheduler.config.get("flow_shift", flow_shift) != flow_shift:
        pipe.scheduler = type(scheduler).from_config(scheduler.config, flow_shift=flow_shift)
    try:
        yield
    finally:
        pipe.scheduler = scheduler


_loaded: dict[tuple[str, str, str, LoadOptions], VideoPipeline] = {}
_load_lock = threading.Lock()


def get_pipeline(spec: ModelSpec, device: str = "auto", dtype: str = "auto",
                 options: LoadOptions = LoadOptions()) -> VideoPipeline:
    """The resident pipeline for this model (and load options), loading it on first use."""
    torch_device, torch_dtype = placement(device, dtype, options)
    key = (spec.source if not spec.builtin else spec.name, str(torch_device), str(torch_dtype), options)
    with _load_lock:
        if key not in _loaded:
            _loaded[key] = VideoPipeline.load(spec, torch_device, torch_dtype, options)
        return _loaded[key]
