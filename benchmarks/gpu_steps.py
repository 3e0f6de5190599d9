"""Seconds per denoising step of real-size Wan2.1 transformers on a CUDA GPU.

Wan2.1-1.3B and Wan2.1-14B transformers (diffusers' `WanTransformer3DModel`, real configs,
random bf16 weights: speed does not depend on the weights' values) at 480x832, 81 frames:
latents [1, 16, 21, 60, 104] -> 21x30x52 = 32760 tokens, text [1, 512, 4096].

Variants, each a denoising-like loop of --steps steps (one transformer forward per step,
conditional branch only, inside `cache_context("cond")` as diffusers' pipelines call it,
latents updated by the prediction, x <- x + (sigma_next - sigma) * v, so a cache sees
changing inputs): `dense` (diffusers' own processors, SDPA), `topk` (vidserve's
SparseAttention at --density), `cache` (dense + vidserve's step_cache) and `topk+cache`.
Each step is timed alone (synchronize, wall clock); the table shows the mean over the
loop. A classifier-free-guidance step runs two such forwards (cond, uncond), so its time
is reported as 2x. "computed" is the share of block modules (attn1, attn2, ffn) that ran:
forward hooks count calls of their output projections, which a cache skips. Peak memory
is `max_memory_allocated` per variant (weights included; TaylorSeer's stored features too,
which a CFG run keeps twice, once per context: "cond" and "uncond").

Attention alone at the same shape (B=1, the model's heads, L=32760, d=128): dense SDPA
(flash backend) vs `vidserve.kernels.sparse_attention` (whole path: tiling, selection,
kernel, permutation back). FLOPs as in gpu_attention.py: 4*L*L*d per head for dense, only
the kept (query tile, key tile) pairs, padded slots included, for sparse.

    python benchmarks/gpu_steps.py [--models 1.3B 14B] [--steps 8] [--json PATH]
    python benchmarks/gpu_steps.py --small     # tiny config and shape on the CPU: checks the script

The JSON is rewritten after every section, so a run cut short keeps what it finished; no
variant starts past --deadline seconds, and one that fails (out of memory) is recorded and
skipped. Expected on an H200: about 2.5 minutes for both models (1.3B ~0.7 s and 14B ~3.5 s
per dense step; 9 forwards per dense/topk variant, about half of 8 for the cache ones).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import diffusers
import torch
import torch.nn.functional as F
from diffusers import WanTransformer3DModel
from torch.nn.attention import SDPBackend, sdpa_kernel

import gpu_attention  # benchmarks/ is on sys.path when this runs as a script
from vidserve.kernels import sparse_attention
from vidserve.kernels.selection import select_key_tiles
from vidserve.kernels.sparse_triton import triton_available
from vidserve.kernels.tiles import tile_layout
from vidserve.options import AttentionOptions, CacheOptions
from vidserve.pipelines.attention import SparseAttention
from vidserve.pipelines.speedups import step_cache

# Wan's own configs (github.com/Wan-Video/Wan2.1, wan/configs/wan_t2v_1_3B.py and wan_t2v_14B.py:
# dim 1536/5120, ffn_dim 8960/13824, heads 12/40, layers 30/40, freq_dim 256, eps 1e-6, patch
# (1,2,2)) as the Diffusers checkpoints spell them (Wan-AI/Wan2.1-T2V-*-Diffusers
# transformer/config.json; diffusers' WanTransformer3DModel defaults are the 14B values).
COMMON = dict(patch_size=(1, 2, 2), attention_head_dim=128, in_channels=16, out_channels=16, text_dim=4096,
              freq_dim=256, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6)
MODELS = {"1.3B": dict(COMMON, num_layers=30, num_attention_heads=12, ffn_dim=8960),
          "14B": dict(COMMON, num_layers=40, num_attention_heads=40, ffn_dim=13824)}
LATENTS, TEXT_TOKENS = (16, 21, 60, 104), 512  # 81 frames -> 1 + 80/4 latent frames; 480/8, 832/8
SMALL = dict(COMMON, num_layers=2, num_attention_heads=2, attention_head_dim=16, ffn_dim=64, text_dim=32, freq_dim=32)
SMALL_LATENTS, SMALL_TEXT_TOKENS = (16, 9, 32, 32), 16  # 9x16x16 = 2304 tokens, 48 key tiles
VARIANTS = ("dense", "topk", "cache", "topk+cache")
DEFAULT_JSON = Path(os.environ.get("OUT", Path(__file__).parent / "results" / "gpu")) / "gpu_steps.json"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def median_ms(fn, repeats: int, device: torch.device) -> float:
    if device.type == "cuda":
        return gpu_attention.cuda_ms(fn, repeats)
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def build(config: dict, device: torch.device, dtype: torch.dtype) -> WanTransformer3DModel:
    """Random weights without running 14B parameters' worth of init kernels on the CPU."""
    with torch.device("meta"):
        model = WanTransformer3DModel(**config)
    # As from_pretrained(torch_dtype=bf16) loads it: these modules stay float32.
    model.to(dtype)
    for name, param in model.named_parameters():
        if any(part in model._keep_in_fp32_modules for part in name.split(".")):
            param.data = param.data.float()
    model.to_empty(device=device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 0.02)
            else:  # norm scales 1, biases 0: activations keep a sane scale through 40 blocks
                param.fill_(1.0 if "norm" in name else 0.0)
    # rope's frequency tables are buffers computed in __init__; to_empty left them garbage.
    buffers = sorted(name for name, _ in model.named_buffers())
    assert buffers == ["rope.freqs_cos", "rope.freqs_sin"], f"unexpected buffers to re-create: {buffers}"
    with torch.device(device):
        model.rope = type(model.rope)(model.config.attention_head_dim, model.config.patch_size,
                                      model.config.rope_max_seq_len)
    return model.eval().requires_grad_(False)


def forward_tflop(model: WanTransformer3DModel, tokens: int, text_tokens: int) -> float:
    """Matmul FLOPs of one forward: block linears (text K/V projections see the text tokens) + attention."""
    c = model.config
    linear = sum(2 * m.weight.numel() * (text_tokens if ".attn2.to_k" in n or ".attn2.to_v" in n else tokens)
                 for n, m in model.blocks.named_modules(prefix="blocks") if isinstance(m, torch.nn.Linear))
    attention = 4 * tokens * (tokens + text_tokens) * c.attention_head_dim * c.num_attention_heads * c.num_layers
    return (linear + attention) / 1e12


def count_block_calls(model: WanTransformer3DModel) -> list[int]:
    """A counter of attn1/attn2/ffn computations: their output projections only run when they do."""
    calls = [0]
    for block in model.blocks:
        for module in (block.attn1.to_out[0], block.attn2.to_out[0], block.ffn.net[-1]):
            module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def denoise(model, sparse, x, text, steps: int, device: torch.device) -> tuple[list[float], bool]:
    """Per-step seconds of a flow-matching Euler loop over the conditional branch."""
    sigmas = torch.linspace(1.0, 0.0, steps + 1).tolist()
    times = []
    for i in range(steps):
        sync(device)
        start = time.perf_counter()
        with model.cache_context("cond"):
            v = model(hidden_states=x, timestep=torch.full((1,), 1000.0 * sigmas[i], device=device),
                      encoder_hidden_states=text, return_dict=False)[0]
        x = x + (sigmas[i + 1] - sigmas[i]) * v
        sparse.step_done(i + 1)  # as VideoPipeline's step callback does
        sync(device)
        times.append(time.perf_counter() - start)
    return times, bool(torch.isfinite(x).all())


def attention_figures(heads: int, head_dim: int, grid: tuple, density: float, repeats: int,
                      device: torch.device, dtype: torch.dtype) -> dict:
    length = math.prod(grid)
    q, k, v = (torch.randn(1, heads, length, head_dim, device=device, dtype=dtype) for _ in range(3))

    def dense():
        if device.type != "cuda":
            return F.scaled_dot_product_attention(q, k, v)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    dense_ms = median_ms(dense, repeats, device)
    sparse_ms = median_ms(lambda: sparse_attention(q, k, v, grid, density=density), repeats, device)
    # Kept pairs with the same tiles sparse_attention defaults to (gpu_attention's constants).
    q_layout = tile_layout(grid, gpu_attention.QUERY_TILE, device)
    k_layout = tile_layout(grid, gpu_attention.TILE, device)
    selection = select_key_tiles(q_layout.to_tiles(q), k_layout.to_tiles(k), q_layout, k_layout, density,
                                 neighbours=gpu_attention.NEIGHBOURS, sink=gpu_attention.SINK)
    sparse_flops = 4 * int(selection.counts.sum()) * q_layout.tile_size * k_layout.tile_size * head_dim
    dense_flops = 4 * heads * length * length * head_dim
    return {"heads": heads, "tokens": length, "dense_ms": round(dense_ms, 3), "sparse_ms": round(sparse_ms, 3),
            "dense_tflops": round(dense_flops / dense_ms / 1e9, 2), "sparse_tflops": round(sparse_flops / sparse_ms / 1e9, 2),
            "kept_tiles": round(float(selection.counts.float().mean()), 1), "key_tiles": k_layout.n_tiles, "speedup": round(dense_ms / sparse_ms, 2)}


def run_variant(variant: str, model, sparse, calls, x, text, args, device) -> dict:
    sparse.configure(AttentionOptions(mode="topk", density=args.density) if "topk" in variant else AttentionOptions())
    if "cache" not in variant:  # the cache variants reuse the kernels these warm-ups compiled (Triton, cuBLAS)
        for _ in range(args.warmup):
            model(hidden_states=x, timestep=torch.full((1,), 999.0, device=device),
                  encoder_hidden_states=text, return_dict=False)
    gc.collect()  # the previous variant's cache state, so it does not count in this peak
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    calls[0] = 0
    cache = CacheOptions(kind=args.cache, interval=3, warmup_steps=2) if "cache" in variant else CacheOptions()
    with step_cache([model], cache):
        times, finite = denoise(model, sparse, x, text, args.steps, device)
    mean = statistics.mean(times)
    return {"s_per_step": round(mean, 4), "cfg_s_per_step": round(2 * mean, 4), "step_s": [round(t, 4) for t in times],
            "computed": round(calls[0] / (3 * model.config.num_layers * args.steps), 3), "finite": finite,
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None}


def bench_model(result: dict, config: dict, latents: tuple, text_tokens: int, args, device, dtype, deadline: float,
                save) -> None:
    """Fills `result` and calls save() as it goes: a failure (out of memory, a timeout) keeps what came before."""
    tic = time.perf_counter()
    model = build(config, device, dtype)
    sync(device)
    grid = tuple(n // p for n, p in zip(latents[1:], config["patch_size"]))
    tokens = math.prod(grid)
    result.update(config=config, grid=grid, params_b=round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
                  forward_tflop=round(forward_tflop(model, tokens, text_tokens), 3), build_s=round(time.perf_counter() - tic, 1))
    print(f"\n== Wan2.1-{result['model']}: {result['params_b']}B params, grid {grid} (L={tokens}), "
          f"~{result['forward_tflop']} TFLOP per forward; built in {result['build_s']} s", flush=True)
    with torch.inference_mode():
        # Attention alone first: seconds, and it survives a variant below running out of memory.
        # A kernel failure here is recorded and the variants still run (dense and cache need no kernel).
        tic = time.perf_counter()
        try:
            result["attention"] = attention_figures(config["num_attention_heads"], config["attention_head_dim"],
                                                    grid, args.density, args.repeats, device, dtype)
        except Exception as error:
            traceback.print_exc()
            result["attention"] = {"error": f"{type(error).__name__}: {error}"[:500]}
        print(f"attention alone: {result['attention']} ({time.perf_counter() - tic:.1f} s)", flush=True)
        save()
        sparse, calls = SparseAttention([model]), count_block_calls(model)
        x = torch.randn(1, *latents, device=device, dtype=dtype)
        text = torch.randn(1, text_tokens, config["text_dim"], device=device, dtype=dtype)
        result["variants"] = {}
        for variant in VARIANTS:
            if time.perf_counter() > deadline:
                print(f"{variant}: skipped, past the --deadline", flush=True)
                continue
            tic = time.perf_counter()
            try:
                row = run_variant(variant, model, sparse, calls, x, text, args, device)
            except Exception as error:  # one variant out of memory must not lose the others
                traceback.print_exc()
                row = {"error": f"{type(error).__name__}: {error}"[:500]}
            row["elapsed_s"] = round(time.perf_counter() - tic, 1)
            result["variants"][variant] = row
            print(f"{variant}: " + ", ".join(f"{k} {v}" for k, v in row.items() if k != "step_s"), flush=True)
            save()


def print_tables(results: list[dict]) -> None:
    print(f"\n{'model':>6} {'variant':>11} {'s/step':>8} {'CFG s/step':>11} {'vs dense':>9} {'TFLOP/s':>8} "
          f"{'computed':>9} {'peak GiB':>9}")
    for r in results:
        variants = r.get("variants", {})
        dense = variants.get("dense", {}).get("s_per_step")  # None if dense failed
        if "error" in r:
            print(f"{r['model']:>6} failed: {r['error']}")
        for name, v in variants.items():
            if "error" in v:
                print(f"{r['model']:>6} {name:>11} failed: {v['error']}")
                continue
            speedup = f"{dense / v['s_per_step']:.2f}x" if dense else "-"
            tflops = f"{r['forward_tflop'] / v['s_per_step']:.0f}" if name == "dense" else ""
            flag = "" if v["finite"] else "  (non-finite output)"
            print(f"{r['model']:>6} {name:>11} {v['s_per_step']:>8.3f} {v['cfg_s_per_step']:>11.3f} {speedup:>9} "
                  f"{tflops:>8} {v['computed']:>9.0%} {str(v['peak_gib']):>9}{flag}")
    print("(s/step: one forward, conditional branch; a CFG step is two forwards, 2x. TFLOP/s: matmul FLOPs of a dense forward.)")
    print(f"\n{'model':>6} {'heads':>6} {'L':>6} {'dense ms':>9} {'TFLOP/s':>8} {'sparse ms':>10} {'TFLOP/s':>8} "
          f"{'kept':>8} {'speedup':>8}")
    for r in results:
        a = r.get("attention")
        if a and "error" in a:
            print(f"{r['model']:>6} {a['error']}")
        elif a:
            print(f"{r['model']:>6} {a['heads']:>6} {a['tokens']:>6} {a['dense_ms']:>9.2f} {a['dense_tflops']:>8.1f} "
                  f"{a['sparse_ms']:>10.2f} {a['sparse_tflops']:>8.1f} {a['kept_tiles']:>5.1f}/{a['key_tiles']:<4} {a['speedup']:>7.2f}x")
    print("(sparse TFLOP/s counts only kept tile pairs, padding included, over the whole sparse_attention call.)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--steps", type=int, default=8, help="denoising steps per variant (cache needs a few)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed forwards before dense and topk")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs of attention alone")
    parser.add_argument("--density", type=float, default=0.125)
    parser.add_argument("--cache", choices=["taylorseer", "first_block"], default="taylorseer")
    parser.add_argument("--deadline", type=float, default=270,
                        help="seconds after start past which no new variant starts (the lease is short)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--small", action="store_true", help="tiny config and shape on the CPU, float32")
    args = parser.parse_args()
    if args.small:
        device, dtype = torch.device("cpu"), torch.float32
        torch.set_num_threads(1)  # a check, not a measurement: stay off the other cores
        runs = [("tiny", SMALL, SMALL_LATENTS, SMALL_TEXT_TOKENS)]
    else:
        if not torch.cuda.is_available():
            sys.exit("benchmarks/gpu_steps.py needs a CUDA GPU; none is visible. "
                     "Run it with --small to check the script on a CPU.")
        device, dtype = torch.device("cuda"), torch.bfloat16
        runs = [(name, MODELS[name], LATENTS, TEXT_TOKENS) for name in args.models]
        if not triton_available():
            print("warning: triton is missing, so topk runs vidserve's PyTorch sparse path", flush=True)
    start = time.perf_counter()
    report = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__, "diffusers": diffusers.__version__,
              "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "dtype": str(dtype),
              "sparse_backend": "triton" if device.type == "cuda" and triton_available() else "torch",
              "density": args.density, "cache": args.cache, "steps": args.steps, "models": []}
    print(f"{report['device']}, torch {torch.__version__}, diffusers {diffusers.__version__}, {dtype}, "
          f"{args.steps} steps per variant, density {args.density} ({report['sparse_backend']}), cache {args.cache}", flush=True)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    save = lambda: args.json.write_text(json.dumps(report, indent=2))  # noqa: E731
    for name, config, latents, text_tokens in runs:
        tic, result = time.perf_counter(), {"model": name}
        report["models"].append(result)
        try:
            bench_model(result, config, latents, text_tokens, args, device, dtype, start + args.deadline, save)
        except Exception as error:  # e.g. out of memory: keep the other model's figures
            traceback.print_exc()
            result["error"] = f"{type(error).__name__}: {error}"[:500]
        result["elapsed_s"] = round(time.perf_counter() - tic, 1)
        save()
        gc.collect()  # the model goes with bench_model's frame: free its memory before the next one
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"{name}: {result['elapsed_s']} s in all; wrote {args.json}", flush=True)
    print_tables(report["models"])
    print(f"\ntotal {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
