"""End to end: vidserve's speed-ups against diffusers' own WanPipeline, on one model (issue 7).

    python benchmarks/e2e.py [--quick] [--runs R] [--steps S] [--json PATH]

Method. A random-weight Wan2.1-style text-to-video model (tiny text encoder and VAE from
vidserve.pipelines.tiny, a transformer big enough that self-attention dominates on a CPU) is
built, saved as an ordinary diffusers folder, and loaded from it by both sides. Every variant
makes the same clip (prompt, seed, size, frames, steps, guidance), one process, torch's default
threads:
  diffusers          WanPipeline.from_pretrained(folder)(...), SDPA attention, called directly
  dense              vidserve VideoPipeline.generate, dense attention (diffusers' processors)
  topk               + top-k block-sparse self-attention, density 0.125
  cache              + step caching (diffusers' cache hooks; which kind and why: CACHE below)
  topk+cache         both
  topk+cache+int8    both, plus torchao int8 weight-only transformer blocks
Seconds: wall time of the call that returns uint8 frames (text encoding, denoising, VAE decode,
conversion), median of R runs; each variant runs once untimed first, then the R rounds take the
variants in turn, so load that comes and goes hits all alike. Peak memory: on CPU, process RSS
sampled every 10 ms during the call minus RSS before it; on CUDA, max_memory_allocated minus
memory_allocated. Fidelity: PSNR over all frames and SSIM (mean over frames) of the decoded
uint8 frames against the diffusers variant's. Skipped: the share of transformer-block forward
passes (blocks x steps x 2 CFG branches) that step caching did not compute, counted by a hook.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

PROMPT = "a red fox running through fresh snow, morning light"
SEED, GUIDANCE = 0, 5.0  # guidance > 1: classifier-free guidance, two transformer passes a step, as Wan runs
SIZE, FRAMES = "512x448", 33  # latent grid 9x28x32 = 8064 tokens (VAE 4x8x8, patch 1x2x2)
# The transformer: head_dim 128 as in Wan2.1; sized so self-attention over 8064 tokens is most of a step.
HEADS, HEAD_DIM, LAYERS, FFN_DIM, FREQ_DIM = 2, 128, 4, 512, 64
TOPK = {"mode": "topk", "density": 0.125}
CACHE = {"kind": "taylorseer", "interval": 3, "warmup_steps": 2}
VARIANTS = ("diffusers", "dense", "topk", "cache", "topk+cache", "topk+cache+int8")


def build_model(folder: Path) -> None:
    from diffusers import WanPipeline, WanTransformer3DModel

    from vidserve.pipelines.tiny import TEXT_DIM, _scheduler, _text_encoder, _wan21_vae, build_tokenizer
    from vidserve.registry import MODELS, SERVING_FILE

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, in_channels=16,
        out_channels=16, text_dim=TEXT_DIM, freq_dim=FREQ_DIM, ffn_dim=FFN_DIM, num_layers=LAYERS,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    ).eval()
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=_text_encoder(len(tokenizer)), vae=_wan21_vae(),
                       transformer=transformer, scheduler=_scheduler(MODELS["wan-tiny"]))
    pipe.save_pretrained(folder)
    # Serving facts diffusers' configs lack (chunk length, fps): wan-tiny's, so 33 frames are one chunk.
    (folder / SERVING_FILE).write_text(json.dumps({"base": "wan-tiny"}))


def to_uint8(video: np.ndarray) -> np.ndarray:
    return (np.clip(video, 0.0, 1.0) * 255.0).round().astype(np.uint8)  # as VideoPipeline.generate does


class PeakMemory:
    """Peak memory of one call above what was in use just before it, in MB."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self.rss())

    def __enter__(self) -> "PeakMemory":
        gc.collect()
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        try:  # hand freed heap back to the OS, or an earlier variant's leftovers hide this one's peak
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        self.base = self.peak = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            self.mb = (torch.cuda.max_memory_allocated() - self.base) / 2**20
            return
        self._stop.set()
        self._thread.join()
        self.mb = (max(self.peak, self.rss()) - self.base) / 2**20


class BlockCounter:
    """Counts transformer-block forward passes that really ran. The hook sits on each block's last
    feed-forward Linear: First-Block Cache skips whole blocks and TaylorSeer replaces the forward of
    `ffn` itself, so that Linear runs only when the block's work is computed, not reused."""

    def __init__(self, transformer):
        self.calls, self.blocks = 0, len(transformer.blocks)
        for block in transformer.blocks:
            block.ffn.net[-1].register_forward_hook(self._count)

    def _count(self, *_):
        self.calls += 1


class AttentionTimer:
    """Wall time inside self-attention (`attn1`: projections, norms, rotary, attention) while on."""

    def __init__(self, transformer, device: torch.device):
        self.on, self.seconds, self.sync = False, 0.0, device.type == "cuda"
        for block in transformer.blocks:
            block.attn1.register_forward_pre_hook(self._start)
            block.attn1.register_forward_hook(self._stop)

    def _start(self, *_):
        if self.on:
            torch.cuda.synchronize() if self.sync else None
            self._t0 = time.perf_counter()

    def _stop(self, *_):
        if self.on:
            torch.cuda.synchronize() if self.sync else None
            self.seconds += time.perf_counter() - self._t0


def psnr(a: np.ndarray, b: np.ndarray) -> float | None:
    """In dB; None for identical videos (infinite PSNR)."""
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return None if mse == 0 else float(10 * np.log10(255**2 / mse))


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    from skimage.metrics import structural_similarity

    return float(np.mean([structural_similarity(x, y, channel_axis=-1, data_range=255) for x, y in zip(a, b)]))


def chart(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bars = ax.bar([r["name"] for r in rows], [r["speedup_vs_diffusers"] for r in rows], color="tab:blue")
    for bar, r in zip(bars, rows):
        label = "identical" if r["psnr_vs_diffusers"] is None else f"{r['psnr_vs_diffusers']:.1f} dB"
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=9, xytext=(0, 2), textcoords="offset points")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_ylabel("speedup vs diffusers WanPipeline (x)")
    ax.set_title(title, fontsize=10)
    ax.tick_params(axis="x", labelsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 timed run per variant instead of 3")
    parser.add_argument("--runs", type=int, help="timed runs per variant (default 3, --quick 1)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--size", default=SIZE)
    parser.add_argument("--frames", type=int, default=FRAMES)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (bfloat16 transformer, float32 VAE)")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "e2e.json")
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    width, height = map(int, args.size.split("x"))
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    from diffusers import WanPipeline

    from vidserve.config import Settings
    from vidserve.options import LoadOptions
    from vidserve.pipelines.video import get_pipeline
    from vidserve.registry import resolve
    from vidserve.requests import build_request

    tmp = tempfile.TemporaryDirectory(prefix="vidserve-e2e-")
    folder = Path(tmp.name)
    build_model(folder)
    spec = resolve(str(folder))
    grid = spec.token_grid(args.frames, width, height)

    # (a): diffusers as a user would run it. On CUDA the VAE stays float32, as vidserve keeps it.
    dtypes = {} if device.type == "cpu" else {"dtype": {"default": dtype, "vae": torch.float32}}
    reference = WanPipeline.from_pretrained(folder, **dtypes).to(device)
    reference.set_progress_bar_config(disable=True)

    def run_diffusers() -> np.ndarray:
        video = reference(prompt=PROMPT, negative_prompt=None, height=height, width=width, num_frames=args.frames,
                          num_inference_steps=args.steps, guidance_scale=GUIDANCE,
                          generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").frames[0]
        return to_uint8(video)

    dtype_name = str(dtype).removeprefix("torch.")
    plain = get_pipeline(spec, args.device, dtype_name)
    int8 = get_pipeline(spec, args.device, dtype_name, LoadOptions(quantization="int8"))

    def vidserve_run(pipe, attention, cache):
        request = build_request(spec, Settings(), PROMPT, size=args.size, num_frames=args.frames, steps=args.steps,
                                guidance=GUIDANCE, seed=SEED, attention=attention, cache=cache)
        return lambda: pipe.generate(request).frames

    dense, none = {"mode": "dense"}, {"kind": "none"}
    runners = {
        "diffusers": (run_diffusers, reference.transformer),
        "dense": (vidserve_run(plain, dense, none), plain.transformers[0]),
        "topk": (vidserve_run(plain, TOPK, none), plain.transformers[0]),
        "cache": (vidserve_run(plain, dense, CACHE), plain.transformers[0]),
        "topk+cache": (vidserve_run(plain, TOPK, CACHE), plain.transformers[0]),
        "topk+cache+int8": (vidserve_run(int8, TOPK, CACHE), int8.transformers[0]),
    }
    transformers = {id(t): t for _, t in runners.values()}  # three: diffusers', vidserve's, vidserve's int8
    counters = {key: BlockCounter(t) for key, t in transformers.items()}
    timers = {key: AttentionTimer(t, device) for key, t in transformers.items()}

    print(f"model: Wan2.1-style, {LAYERS} blocks, {HEADS} heads x {HEAD_DIM}, ffn {FFN_DIM}, random weights; "
          f"{args.size} x {args.frames} frames = {grid[0]}x{grid[1]}x{grid[2]} = {np.prod(grid)} tokens, "
          f"{args.steps} steps, guidance {GUIDANCE}, seed {SEED}; {runs} timed run(s) after 1 warm-up; "
          f"{device} {dtype_name}, {torch.get_num_threads()} threads")
    load_before = os.getloadavg()[0]
    frames, skipped, attention_share = {}, {}, {}
    for name, (run, transformer) in runners.items():  # warm-up; also what fidelity and skipping are read from
        counter, timer = counters[id(transformer)], timers[id(transformer)]
        counter.calls, timer.seconds, timer.on = 0, 0.0, True
        start = time.perf_counter()
        frames[name] = run()
        attention_share[name] = timer.seconds / (time.perf_counter() - start)
        timer.on = False
        skipped[name] = 1 - counter.calls / (counter.blocks * args.steps * (2 if GUIDANCE > 1 else 1))
        print(f"  warm-up {name}: {time.perf_counter() - start:.1f} s, self-attention "
              f"{100 * attention_share[name]:.0f}% of it, blocks skipped {100 * skipped[name]:.0f}%", flush=True)

    seconds = {name: [] for name in runners}
    peak_mb = {name: 0.0 for name in runners}
    for i in range(runs):
        for name, (run, _) in runners.items():
            with PeakMemory(device) as memory:
                start = time.perf_counter()
                out = run()
                seconds[name].append(time.perf_counter() - start)
            peak_mb[name] = max(peak_mb[name], memory.mb)
            if not np.array_equal(out, frames[name]):
                print(f"  note: {name} run {i + 1} differs from its warm-up run")
            print(f"  run {i + 1}/{runs} {name}: {seconds[name][-1]:.1f} s, peak +{memory.mb:.0f} MB", flush=True)
    load_after = os.getloadavg()[0]

    base = statistics.median(seconds["diffusers"])
    rows = []
    for name in runners:
        median = statistics.median(seconds[name])
        rows.append({"name": name, "seconds": round(median, 2), "speedup_vs_diffusers": round(base / median, 3),
                     "psnr_vs_diffusers": None if (p := psnr(frames[name], frames["diffusers"])) is None else round(p, 2),
                     "ssim_vs_diffusers": round(ssim(frames[name], frames["diffusers"]), 4),
                     "peak_mem_mb": round(peak_mb[name], 1), "blocks_skipped": round(skipped[name], 3),
                     "self_attention_share": round(attention_share[name], 3),
                     "samples_s": [round(s, 2) for s in seconds[name]]})

    print("\n| variant | seconds | speedup | PSNR dB | SSIM | peak MB | blocks skipped |\n|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = "identical" if r["psnr_vs_diffusers"] is None else f"{r['psnr_vs_diffusers']:.1f}"
        print(f"| {r['name']} | {r['seconds']:.1f} | {r['speedup_vs_diffusers']:.2f}x | {p} | "
              f"{r['ssim_vs_diffusers']:.4f} | {r['peak_mem_mb']:.0f} | {100 * r['blocks_skipped']:.0f}% |")
    a, b = frames["diffusers"], frames["dense"]
    diff = int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max())
    print(f"\ndense vs diffusers frames: {'bit-identical' if diff == 0 else f'max |diff| {diff}/255'}")
    ratio = {r["name"]: r["speedup_vs_diffusers"] for r in rows}
    for label, ok in (("(b) dense within 5% of (a)", abs(1 / ratio["dense"] - 1) <= 0.05),
                      ("(c) topk >= 2x (a)", ratio["topk"] >= 2), ("(e) topk+cache >= 3x (a)", ratio["topk+cache"] >= 3)):
        print(f"{label}: {'yes' if ok else 'NO'}")
    print(f"1-min load {load_before:.2f} -> {load_after:.2f}; self-attention share of the diffusers run "
          f"{100 * attention_share['diffusers']:.0f}%")

    config = {"model": {"layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "ffn_dim": FFN_DIM,
                        "freq_dim": FREQ_DIM, "transformer_params": sum(p.numel() for p in reference.transformer.parameters())},
              "size": args.size, "frames": args.frames, "grid": list(grid), "tokens": int(np.prod(grid)),
              "steps": args.steps, "guidance": GUIDANCE, "seed": SEED, "prompt": PROMPT, "topk": TOPK, "cache": CACHE,
              "runs": runs, "warmup": 1, "quick": args.quick, "device": str(device), "dtype": dtype_name,
              "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
              "python": platform.python_version(), "loadavg_1m_before_after": [round(load_before, 2), round(load_after, 2)]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"variants": rows, "config": config}, indent=2) + "\n")
    png = args.json.with_suffix(".png")
    chart(rows, png, f"{np.prod(grid)} tokens, {args.steps} steps, {device}: median of {runs}")
    print(f"JSON in {args.json}, chart in {png}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
