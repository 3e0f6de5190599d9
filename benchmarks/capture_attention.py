"""Capture the self-attention inputs of a trained video model: q, k, v per block and step.

Runs the bundled `wan-shapes` transformer (trained on the shapes world, training/) on one
caption at a grid of L = F*H*W tokens, and saves the q, k, v (after the RMS norms and the
rotary embedding, as sparse attention sees them) of every block's self-attention on the
conditional pass of the chosen denoising steps. `benchmarks/attention.py --family captured`
reads them: each (step, block) is one draw.

    python benchmarks/capture_attention.py [--lengths 8192 16384] [--steps 8] [--at 1 4 7]

L=8192 is 256x256 pixels x 29 frames (8x32x32 tokens), L=16384 256x256 x 61 frames
(16x32x32), each as one chunk (wan-shapes makes 17 frames a chunk, 5x32x32 tokens at this size:
these are larger grids than it trained on, the largest it runs at on a CPU in minutes); its VAE
divides time and space by 4, its patches space by 2 more. Files go
to benchmarks/results/captures/ (2 heads x 64 channels, fp16: 1 MB a tensor per 4096 tokens).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from vidserve.config import Settings
from vidserve.options import GenerationOptions
from vidserve.registry import resolve
from vidserve.video_request import build_request

MODEL = "wan-shapes"
PROMPT = "a red circle moving right on a blue background"
SIZES = {8192: ("256x256", 29), 16384: ("256x256", 61)}  # L -> (size, frames)
CAPTURES = Path(__file__).parent / "results" / "captures"


def capture_path(length: int) -> Path:
    return CAPTURES / f"{MODEL}-L{length}.pt"


def capture(length: int, steps: int, at: list[int]) -> Path:
    """Generate one clip, recording q, k, v of each block on the conditional pass of steps `at`."""
    from vidserve.pipelines import attention as processors  # diffusers loads only to capture
    from vidserve.pipelines.chain import generate_video

    size, frames = SIZES[length]
    spec = dataclasses.replace(resolve(MODEL), frames_per_chunk=frames)  # one chunk: the whole grid at once
    # The sparse processors compute q, k, v as diffusers does; a token minimum above L makes
    # each of them call dense_attention, which records its inputs here.
    options = GenerationOptions(steps=steps, seed=0, attention={"mode": "sparse", "min_tokens": length + 1})
    request = build_request(spec, Settings(chat_model=""), PROMPT, options, size=size, num_frames=frames)
    grid = ((frames - 1) // spec.vae_stride[0] + 1,
            *(side // (spec.vae_stride[i + 1] * spec.patch_size[i + 1]) for i, side in
              enumerate((request.height, request.width))))
    layers = json.loads((Path(spec.source) / "transformer" / "config.json").read_text())["num_layers"]
    passes = 2 if request.guidance > 1 else 1  # classifier-free guidance: conditional, then unconditional
    captured, calls = [], [0]
    dense = processors.dense_attention

    def recording(q, k, v):
        forward, layer = divmod(calls[0], layers)
        step, which = divmod(forward, passes)
        calls[0] += 1
        if which == 0 and step in at:
            captured.append({"step": step, "layer": layer, "grid": grid,
                             **{name: t.detach().to(torch.float16).clone() for name, t in zip("qkv", (q, k, v))}})
        return dense(q, k, v)

    processors.dense_attention = recording
    try:
        start = time.perf_counter()
        generate_video(request, device="cpu", dtype="float32")
    finally:
        processors.dense_attention = dense
    assert all(c["q"].shape[2] == length for c in captured), "the clip's grid is not the one asked for"
    path = capture_path(length)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": MODEL, "prompt": PROMPT, "size": size, "frames": frames, "steps": steps,
                "captures": captured}, path)
    print(f"L={length}: {len(captured)} captures ({size} x {frames} frames, steps {at} of {steps}) in "
          f"{time.perf_counter() - start:.0f} s -> {path}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", choices=tuple(SIZES), default=tuple(SIZES))
    parser.add_argument("--steps", type=int, default=8, help="denoising steps of the clip")
    parser.add_argument("--at", type=int, nargs="+", default=[1, 4, 7], help="steps captured (0-based)")
    args = parser.parse_args()
    torch.manual_seed(0)
    for length in args.lengths:
        capture(length, args.steps, args.at)


if __name__ == "__main__":
    main()
