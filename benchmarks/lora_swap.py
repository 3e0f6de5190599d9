"""What per-request LoRA adapters cost: the first load, a switch to an adapter already loaded,
and a request without adapters on a pipeline that holds some (against one that never did).

    python benchmarks/lora_swap.py --random-rank 16      # wan-shapes + a random rank-16 adapter, 2 CPU cores
    python benchmarks/lora_swap.py --lora-dir DIR --adapter NAME   # an adapter of your own

Requests go through the pipeline the workers use (vidserve.pipelines.video), one at a time, in
this order on one pipeline: base x N, adapter (the load), then adapter / base alternating N
times; and base x N on a fresh pipeline loaded beside it, for the overhead. Results: a table on
stdout and benchmarks/results/lora_swap.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vidserve.config import Settings
from vidserve.loras import LoraRegistry
from vidserve.pipelines.video import VideoPipeline
from vidserve.registry import resolve_local
from vidserve.options import GenerationOptions
from vidserve.video_request import build_request


def timed(pipeline: VideoPipeline, request, registry) -> tuple[float, list]:
    start = time.perf_counter()
    result = pipeline.generate(request, adapters=registry)
    return time.perf_counter() - start, result.loras


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="wan-shapes")
    parser.add_argument("--adapter", default="random", help="a registered adapter's name")
    parser.add_argument("--lora-dir", default="", help="where the adapter is, if it is not bundled")
    parser.add_argument("--random-rank", type=int, help="measure a random adapter of this rank on the model's "
                        "attention and FFN layers instead (what loading costs depends on size, not on training)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/lora_swap.json")
    args = parser.parse_args()
    torch.set_num_threads(2)

    spec, settings = resolve_local(args.model), Settings()
    with tempfile.TemporaryDirectory() as folder:
        if args.random_rank:
            args.lora_dir, args.adapter = folder, "random"
            write_random_adapter(spec, args.random_rank, Path(folder) / "random")
        measure(args, spec, settings, LoraRegistry.from_settings(args.lora_dir, ""))


def write_random_adapter(spec, rank: int, folder: Path) -> None:
    from diffusers import WanPipeline
    from peft import LoraConfig, get_peft_model_state_dict

    torch.manual_seed(0)
    transformer = VideoPipeline.load(spec, torch.device("cpu"), torch.float32).transformers[0]
    layers = r"blocks\.\d+\.(attn1|attn2)\.(to_q|to_k|to_v|to_out\.0)|blocks\.\d+\.ffn\.net\.(0\.proj|2)"
    transformer.add_adapter(LoraConfig(r=rank, lora_alpha=rank, target_modules=layers, init_lora_weights=False))
    state = {k: v * 0.1 for k, v in get_peft_model_state_dict(transformer).items()}
    WanPipeline.save_lora_weights(folder, transformer_lora_layers=state)


def measure(args, spec, settings: Settings, registry: LoraRegistry) -> None:
    base = build_request(spec, settings, "a red circle moving right on a black background",
                         GenerationOptions(steps=args.steps, seed=0))
    styled = build_request(spec, settings, "a red circle moving right on a black background",
                           GenerationOptions(steps=args.steps, seed=0, loras=[{"name": args.adapter}]),
                           adapters=registry)
    untouched = VideoPipeline.load(spec, torch.device("cpu"), torch.float32)
    worker = VideoPipeline.load(spec, torch.device("cpu"), torch.float32)

    timed(untouched, base, registry)  # warm-up: first calls allocate
    timed(worker, base, registry)
    never = [timed(untouched, base, registry)[0] for _ in range(args.repeats)]
    first_total, events = timed(worker, styled, registry)
    first_load = events[0].seconds
    with_adapter, after = [], []
    for _ in range(args.repeats):  # switch on and off: each adapter request finds it loaded
        seconds, events = timed(worker, styled, registry)
        assert events[0].cached
        with_adapter.append(seconds)
        after.append(timed(worker, base, registry)[0])

    med = statistics.median
    rows = {
        "model": spec.name, "adapter": args.adapter, "steps": args.steps, "repeats": args.repeats,
        "first_load_seconds": first_load,
        "first_request_seconds": first_total,
        "cached_request_seconds": med(with_adapter),
        "base_request_seconds_never_loaded": med(never),
        "base_request_seconds_adapters_loaded": med(after),
        "no_lora_overhead": med(after) / med(never),
        "adapter_overhead": med(with_adapter) / med(never),
    }
    print(f"| {spec.name}, {args.steps} steps, median of {args.repeats} | seconds |")
    print("|---|---:|")
    print(f"| first load of {args.adapter} | {first_load:.3f} |")
    print(f"| first request with it (load included) | {first_total:.2f} |")
    print(f"| request with it, loaded (a cached switch) | {med(with_adapter):.2f} ({rows['adapter_overhead']:.2f}x) |")
    print(f"| request without adapters, on a pipeline that never had one | {med(never):.2f} |")
    print(f"| request without adapters, adapter loaded (disabled) | {med(after):.2f} "
          f"({rows['no_lora_overhead']:.2f}x) |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
