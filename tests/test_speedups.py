"""Speed-ups are applied when asked and only then: step caching per request (diffusers'
hooks), weight-only quantization that leaves modulation and output layers alone,
regional compile once per shape, and the load options' wiring."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from apps import app_client

from vidserve.config import Settings
from vidserve.errors import InvalidRequest, VidserveError
from vidserve.options import CacheOptions, GenerationOptions, LoadOptions
from vidserve.pipelines.speedups import quantizable
from vidserve.pipelines.video import get_pipeline
from vidserve.registry import resolve
from vidserve.video_request import build_request

SPEC = resolve("wan-tiny")


def request(**options):
    return build_request(SPEC, Settings(), "a red fox", GenerationOptions(steps=8, seed=5, **options), size="64x64",
                         num_frames=17)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


@pytest.fixture(scope="module")
def pipeline():
    return get_pipeline(SPEC, "cpu", "float32")


def run_counting(pipeline, req):
    """Frames, and how often the last block's feed-forward really ran (not when a step is reused).

    Hooked inside the feed-forward: a cache hook replaces the module's forward, not its __call__."""
    calls = []
    hook = pipeline.transformers[0].blocks[-1].ffn.net[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        return pipeline.generate(req).frames, len(calls)
    finally:
        hook.remove()


@pytest.mark.parametrize("cache", [{"kind": "first_block", "threshold": 0.5},
                                   {"kind": "taylorseer", "interval": 3, "warmup_steps": 2}],
                         ids=["first_block", "taylorseer"])
def test_step_caching_skips_work_for_its_request_only(pipeline, cache):
    dense, full_calls = run_counting(pipeline, request())
    assert full_calls == 16  # 8 steps x (conditional + unconditional)
    cached, calls = run_counting(pipeline, request(cache=cache))
    assert calls < full_calls * 0.6
    assert not np.array_equal(cached, dense) and psnr(cached, dense) > 25
    after, calls = run_counting(pipeline, request())  # hooks removed: nothing leaks into the next request
    assert calls == full_calls and np.array_equal(after, dense)


def test_cache_options_come_from_the_server_default_and_are_checked():
    settings = Settings(cache=CacheOptions(kind="first_block", threshold=0.1))
    assert build_request(SPEC, settings, "x").cache.kind == "first_block"
    assert build_request(SPEC, settings, "x", GenerationOptions(cache={"threshold": 0.3})).cache == \
        CacheOptions(kind="first_block", threshold=0.3)
    with pytest.raises(InvalidRequest) as err:
        build_request(SPEC, Settings(), "x", GenerationOptions(cache={"kind": "magic"}))
    assert err.value.param == "cache.kind"


def test_api_records_the_cache_a_job_ran_with(tmp_path):
    with app_client(tmp_path) as (client, _):
        video = client.post("/v1/videos", json={"prompt": "x", "cache": {"kind": "taylorseer"}}).json()
        assert video["cache"] == CacheOptions(kind="taylorseer").model_dump()
        bad = client.post("/v1/videos", json={"prompt": "x", "cache": {"threshold": 7}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache.threshold"


def test_int8_quantizes_the_blocks_but_not_modulation_or_output(pipeline):
    quantized = get_pipeline(SPEC, "cpu", "float32", LoadOptions(quantization="int8"))
    assert quantized is not pipeline  # a separate resident copy, kept for these options
    t = quantized.transformers[0]
    linear = {name: type(m.weight).__name__ for name, m in t.named_modules() if isinstance(m, torch.nn.Linear)}
    in_blocks = [n for n in linear if n.startswith("blocks.")]
    assert in_blocks and all(linear[n] == "Int8Tensor" for n in in_blocks)
    untouched = [n for n in linear if not n.startswith("blocks.")]
    assert "proj_out" in untouched and any(n.startswith("condition_embedder.time_") for n in untouched)
    assert all(linear[n] == "Parameter" for n in untouched)
    assert t.scale_shift_table.dtype == torch.float32
    assert all(b.scale_shift_table.dtype == torch.float32 for b in t.blocks)
    assert not quantizable(t.proj_out, "proj_out") and not quantizable(t.blocks[0].norm2, "blocks.0.norm2")
    full = pipeline.generate(request()).frames
    assert psnr(quantized.generate(request()).frames, full) > 30


def test_fp8_and_offload_need_a_gpu():
    with pytest.raises(VidserveError, match="CUDA"):
        get_pipeline(SPEC, "cpu", "float32", LoadOptions(quantization="fp8"))
    with pytest.raises(VidserveError, match="between CPU and GPU"):
        get_pipeline(SPEC, "cpu", "float32", LoadOptions(offload="model"))


def test_vae_tiling_is_switched_on_and_keeps_the_video(pipeline):
    tiled = get_pipeline(SPEC, "cpu", "float32", LoadOptions(vae_tiling=True))
    assert tiled.text_pipe.vae.use_tiling and not pipeline.text_pipe.vae.use_tiling
    assert np.array_equal(tiled.generate(request()).frames, pipeline.generate(request()).frames)


def test_regional_compile_compiles_each_block_once_per_shape(pipeline):
    import torch._dynamo.utils

    compiled = get_pipeline(SPEC, "cpu", "float32", LoadOptions(compile=True))
    assert all(block._compiled_call_impl is not None for block in compiled.transformers[0].blocks)
    assert pipeline.transformers[0].blocks[0]._compiled_call_impl is None
    short = request(cache={"kind": "none"})
    first = compiled.generate(short).frames
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    again = compiled.generate(short).frames  # same shape: no new graph
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert np.array_equal(first, again)
    assert psnr(first, pipeline.generate(short).frames) > 40
