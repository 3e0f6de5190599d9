"""PSNR of a wan-tiny video made with top-k sparse attention against the dense video of the
same seed: how far the sparse path moves a whole denoising run, not one layer.

    python benchmarks/topk_video.py [--size 256x256] [--frames 33] [--steps 8] [--json PATH]

wan-tiny has random weights, so this measures numerical fidelity of the pipeline wiring
(quality with trained weights is benchmarks/shapes_eval.py's question, on the shapes-world models).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vidserve.config import Settings
from vidserve.pipelines.video import get_pipeline
from vidserve.registry import resolve


def psnr(a: np.ndarray, b: np.ndarray) -> float | None:
    """In dB; None for identical videos (infinite PSNR)."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return None if mse == 0 else float(10 * np.log10(255**2 / mse))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="256x256")
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default="benchmarks/results/topk_video.json")
    args = parser.parse_args()

    from vidserve.options import GenerationOptions
    from vidserve.video_request import build_request

    spec = resolve("wan-tiny")
    pipeline = get_pipeline(spec, "cpu", "float32")
    topk = {"mode": "topk", "selection": "topk"}  # the same share of key tiles for every query tile
    variants = {
        "dense": {"mode": "dense"},
        "topk 1.0": {**topk, "density": 1.0},
        "topk 0.25": {**topk, "density": 0.25},
        "topk 0.125": {**topk, "density": 0.125},
        "topk 0.125, 2 dense steps": {**topk, "density": 0.125, "dense_steps": 2},
    }
    results, reference = [], None
    grid = spec.token_grid(args.frames, *map(int, args.size.split("x")))
    print(f"wan-tiny {args.size}x{args.frames} ({grid[0]}x{grid[1]}x{grid[2]} = {np.prod(grid)} tokens), "
          f"{args.steps} steps, seed {args.seed}")
    print(f"{'attention':<28} {'PSNR vs dense (dB)':>19}")
    for name, attention in variants.items():
        request = build_request(spec, Settings(), "a red fox in snow",
                                GenerationOptions(steps=args.steps, seed=args.seed, attention=attention),
                                size=args.size, num_frames=args.frames)
        # (No timings: at this size the VAE decode, not attention, dominates a run.)
        frames = pipeline.generate(request).frames
        reference = frames if reference is None else reference
        value = psnr(frames, reference)
        results.append({"name": name, "attention": attention, "psnr_vs_dense": value})
        print(f"{name:<28} {'identical' if value is None else f'{value:.1f}':>19}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"config": vars(args) | {"tokens": int(np.prod(grid))},
                                           "results": results}, indent=2))


if __name__ == "__main__":
    main()
