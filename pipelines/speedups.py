"""The speed-ups stacked on a Wan pipeline, each through the library that owns it.

Load time (once per loaded model, see `LoadOptions`): weight-only int8/fp8 quantization
of the transformer blocks with torchao, regional `torch.compile` of the repeated blocks,
CPU offload, VAE tiling. Per request: step caching with diffusers' cache hooks
(First-Block Cache, TaylorSeer), enabled for one generation and removed after it.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from diffusers import DiffusionPipeline, WanTransformer3DModel
from diffusers.hooks import FirstBlockCacheConfig, TaylorSeerCacheConfig, apply_group_offloading

from vidserve.options import CacheOptions, LoadOptions


def quantizable(module: torch.nn.Module, name: str) -> bool:
    """The linear layers of the transformer blocks: attention projections and feed-forward.

    Everything else stays in full precision on purpose: the modulation path (timestep
    embedding and projection, each block's `scale_shift_table`, the norms) is what the
    model "sees" of the noise level, and `proj_out` is what the user sees — quantizing
    them costs image and video DiTs the most quality for the least memory.
    """
    return isinstance(module, torch.nn.Linear) and name.startswith("blocks.") and "norm" not in name


def quantize(transformer: WanTransformer3DModel, kind: str, device: torch.device) -> None:
    if kind == "none":
        return
    from torchao.quantization import Float8WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    config = Int8WeightOnlyConfig() if kind == "int8" else Float8WeightOnlyConfig()
    quantize_(transformer, config, filter_fn=quantizable)


def compile_blocks(transformer: WanTransformer3DModel) -> None:
    """Regional compile: one compiled graph shared by all identical blocks, so compiling
    costs seconds, not minutes. Shapes are static: each new video size compiles once, on
    its first generation, and is then reused."""
    transformer.compile_repeated_blocks(fullgraph=False, dynamic=False)


def offload(pipe: DiffusionPipeline, kind: str, device: torch.device) -> None:
    """Weights live in CPU memory and visit the GPU when used: for GPUs smaller than the model."""
    if kind == "none":
        pipe.to(device)
        return
    if kind == "model":  # whole components in turn: text encoder, transformer, VAE
        pipe.enable_model_cpu_offload(device=device)
    elif kind == "sequential":  # layer by layer: least memory, slowest
        pipe.enable_sequential_cpu_offload(device=device)
    else:  # groups of blocks, prefetched on a side stream while the previous group computes
        for name, component in pipe.components.items():
            if isinstance(component, WanTransformer3DModel):
                apply_group_offloading(component, onload_device=device, offload_device=torch.device("cpu"),
                                       offload_type="block_level", num_blocks_per_group=1, use_stream=True)
            elif isinstance(component, torch.nn.Module):
                component.to(device)


def prepare(pipe: DiffusionPipeline, options: LoadOptions, device: torch.device) -> DiffusionPipeline:
    """Apply the load-time options, in the order they compose: place, quantize, compile, tile."""
    offload(pipe, options.offload, device)
    for transformer in transformers_of(pipe):
        quantize(transformer, options.quantization, device)
        if options.compile:
            compile_blocks(transformer)
    if options.vae_tiling:
        pipe.vae.enable_tiling()
    return pipe


def transformers_of(pipe: DiffusionPipeline) -> list[WanTransformer3DModel]:
    """One transformer, or Wan2.2 A14B's two experts."""
    return [t for t in (pipe.transformer, getattr(pipe, "transformer_2", None)) if t is not None]


def cache_config(options: CacheOptions) -> FirstBlockCacheConfig | TaylorSeerCacheConfig | None:
    if options.kind == "first_block":
        return FirstBlockCacheConfig(threshold=options.threshold)
    if options.kind == "taylorseer":
        # Lite mode: between full steps the blocks are skipped and the transformer's output
        # is predicted. Per-module mode would keep two copies of every attention and
        # feed-forward output per CFG branch: ~150 GiB for Wan2.1-14B at 480p.
        return TaylorSeerCacheConfig(cache_interval=options.interval, disable_cache_before_step=options.warmup_steps,
                                     taylor_factors_dtype=None, use_lite_mode=True)
    return None


@contextmanager
def step_cache(transformers: list[WanTransformer3DModel], options: CacheOptions) -> Iterator[None]:
    """Caching for one generation: hooks on, then off, so no state leaks into the next request."""
    config = cache_config(options)
    if config is None:
        yield
        return
    for transformer in transformers:
        transformer.enable_cache(config)
    try:
        yield
    finally:
        for transformer in transformers:
            transformer.disable_cache()
