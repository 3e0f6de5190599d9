"""Triton block-sparse attention vs dense flash attention on a CUDA GPU.

Real Wan2.1-1.3B self-attention shapes: a 5 s 480p clip is a 21x30x52 latent token grid
(L = 32760), 12 heads, head_dim 128, bf16, batch 1. For each density: dense SDPA (flash
backend) and the sparse path (tiling, selection, Triton kernel and permutation back),
plus the Triton kernel alone; ms, achieved TFLOP/s, and cosine similarity vs dense.

FLOPs: dense counts 4*L*L*d per head (QK^T and PV). The sparse kernel is given two ways:
what it computes, 4 * query_tile * key_tile * d for every kept (query tile, key tile) pair,
padded slots included; and the real work, the same over real tokens only (Wan grids leave
edge tiles part empty). The kernel runs with 2 and 3 K/V stages (support.py launches 3),
and is checked against the PyTorch block-sparse path on the same selection in fp32: bf16
rounding alone moves outputs by ~1.6e-2, so the check is a tolerance, not equality.

    python benchmarks/gpu_attention.py [--densities 0.125 0.25] [--repeats 20] [--json PATH]

Needs a CUDA GPU and triton; on a CPU it exits with a message (use benchmarks/attention.py).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vidserve.kernels import sparse_attention
from vidserve.kernels.dispatch import default_query_tile
from vidserve.kernels.selection import select_key_tiles
from vidserve.kernels.sparse_torch import block_sparse_attention_torch
from vidserve.kernels.sparse_triton import block_sparse_attention_triton, triton_available
from vidserve.kernels.synthetic import video_like_qkv
from vidserve.kernels.tiles import tile_layout

# bf16 rounding of q, k, v and the softmax weights, against an fp32 computation.
TOLERANCE = 3e-2
GRID = (21, 30, 52)  # Wan2.1 480p, 81 frames: latent frames x height x width
HEADS, HEAD_DIM = 12, 128
TILE = (4, 4, 4)
QUERY_TILE = default_query_tile(TILE)
NEIGHBOURS, SINK = 0, False  # sparse_attention's defaults, spelled out so both runs below agree
DEFAULT_JSON = Path(__file__).parent / "results" / "gpu_attention.json"


def cuda_ms(fn, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of fn() on the current CUDA stream."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--densities", type=float, nargs="+", default=[0.125, 0.25])
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/gpu_attention.py needs a CUDA GPU; none is visible. "
                 "On a CPU, run benchmarks/attention.py instead.")
    if not triton_available():
        sys.exit("benchmarks/gpu_attention.py needs triton (pip install triton).")

    dtype = getattr(torch, args.dtype)
    length = math.prod(GRID)
    q, k, v = (x.cuda() for x in video_like_qkv(1, HEADS, GRID, HEAD_DIM, dtype=dtype))

    def dense_flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v)

    dense = dense_flash()
    dense_ms = cuda_ms(dense_flash, args.repeats)
    dense_flops = 4 * HEADS * length * length * HEAD_DIM
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, grid {GRID} (L={length}), heads {HEADS}, "
          f"d {HEAD_DIM}, {args.dtype}, tile {TILE}, query tile {QUERY_TILE}")
    print(f"dense SDPA (flash): {dense_ms:.2f} ms, {dense_flops / dense_ms / 1e9:.1f} TFLOP/s")

    q_layout, k_layout = tile_layout(GRID, QUERY_TILE, "cuda"), tile_layout(GRID, TILE, "cuda")
    q_tiles, k_tiles, v_tiles = q_layout.to_tiles(q), k_layout.to_tiles(k), k_layout.to_tiles(v)
    header = f"{'density':>8} {'kept/tiles':>11} {'sparse ms':>10} {'kernel ms':>10} {'3 vs 2 stages':>14} " \
             f"{'TFLOP/s padded':>15} {'real':>6} {'speedup':>8} {'cosine':>8} {'|triton-fp32|':>14}"
    print(header)
    print("-" * len(header))
    rows = []
    for density in args.densities:
        run_sparse = lambda: sparse_attention(  # noqa: E731
            q, k, v, GRID, density=density, tile=TILE, query_tile=QUERY_TILE, neighbours=NEIGHBOURS, sink=SINK,
            backend="triton")
        sparse = run_sparse()
        sparse_ms = cuda_ms(run_sparse, args.repeats)

        selection = select_key_tiles(q_tiles, k_tiles, q_layout, k_layout, density, neighbours=NEIGHBOURS, sink=SINK)
        run_kernel = lambda stages=None: block_sparse_attention_triton(  # noqa: E731
            q_tiles, k_tiles, v_tiles, selection, k_layout, num_stages=stages)
        kernel_ms = cuda_ms(run_kernel, args.repeats)
        two_stages_ms = cuda_ms(lambda: run_kernel(2), args.repeats)
        kept_pairs = int(selection.counts.sum())
        kept_tiles = kept_pairs / selection.counts.numel()  # per query tile: lists differ in length with "mass"
        kernel_flops = 4 * kept_pairs * q_layout.tile_size * k_layout.tile_size * HEAD_DIM
        used = torch.arange(selection.max_kept, device="cuda") < selection.counts[..., None]
        real_keys = (k_layout.counts.long()[selection.key_tiles] * used).sum(-1)  # [B, heads, query tiles]
        real_flops = 4 * HEAD_DIM * int((real_keys * q_layout.counts).sum())
        reference = block_sparse_attention_torch(q_tiles.float(), k_tiles.float(), v_tiles.float(), selection, k_layout)
        check = (run_kernel().float() - reference).abs().max().item()

        row = {
            "density": density,
            "kept_tiles": round(kept_tiles, 1),
            "key_tiles": k_layout.n_tiles,
            "dense_ms": round(dense_ms, 3),
            "sparse_ms": round(sparse_ms, 3),
            "kernel_ms": round(kernel_ms, 3),
            "dense_tflops": round(dense_flops / dense_ms / 1e9, 1),
            "kernel_ms_2_stages": round(two_stages_ms, 3),
            "kernel_tflops": round(kernel_flops / kernel_ms / 1e9, 1),
            "kernel_tflops_real_tokens": round(real_flops / kernel_ms / 1e9, 1),
            "speedup": round(dense_ms / sparse_ms, 2),
            "cosine": round(cosine(sparse, dense), 5),
            "max_abs_triton_vs_fp32": check,
            "within_tolerance": check <= TOLERANCE,
        }
        rows.append(row)
        print(f"{density:>8.3f} {kept_tiles:>5.1f}/{k_layout.n_tiles:<5} {sparse_ms:>10.2f} {kernel_ms:>10.2f} "
              f"{two_stages_ms / kernel_ms:>13.2f}x {row['kernel_tflops']:>15.1f} {row['kernel_tflops_real_tokens']:>6.1f} "
              f"{row['speedup']:>7.2f}x {row['cosine']:>8.4f} {check:>10.2e} {'ok' if check <= TOLERANCE else 'OVER'}",
              flush=True)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "command": " ".join(["python", *sys.argv]),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "grid": GRID,
        "dtype": args.dtype,
        "rows": rows,
    }, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
