"""End to end: vidserve's speed-ups against diffusers' own WanPipeline, on one model.

    python benchmarks/e2e.py [--quick] [--runs R] [--steps S] [--cache JSON] [--vae thin|wan-tiny]
                             [--size WxH] [--frames N] [--json PATH]

Model: a random-weight Wan2.1-style text-to-video pipeline built here (vidserve.pipelines.tiny's
tokenizer, text encoder and scheduler; a transformer big enough that self-attention dominates on a
CPU; a thin Wan2.1-layout VAE, see build_model), saved as an ordinary diffusers folder that both
sides load. Random weights: fidelity here is numerical (how far each speed-up moves the frames),
not visual quality. Every variant makes the same clip (prompt, seed, size, frames, steps, guidance)
in one process, with torch's default threads:
  diffusers         WanPipeline.from_pretrained(folder)(...), SDPA attention, called directly
  dense             vidserve VideoPipeline.generate, dense attention (diffusers' own processors)
  topk              + block-sparse self-attention with the default selection (by attention mass,
                      within top-k's cost at density 0.125)
  cache             + step caching through diffusers' hooks (CACHE below: why this kind)
  topk+cache        both
  topk+cache+int8   both, plus torchao int8 weight-only linears in the transformer blocks
Seconds: wall time of the call that returns uint8 frames (text encoding, denoising, VAE decode),
median of R runs. Each variant first runs once untimed with 1 step (same shapes, so every lazy
init and kernel choice happens there, at a fraction of the cost), then R rounds take the variants
in turn, so load that comes and goes hits all alike. Peak memory: on CPU, process RSS sampled
every 10 ms during the call minus RSS just before it; on CUDA, max_memory_allocated minus
memory_allocated. Fidelity: PSNR over all frames and SSIM (mean over frames) of the decoded uint8
frames against the diffusers variant's. Blocks skipped: the share of transformer-block passes
(blocks x steps x 2 guidance branches) that caching reused instead of computing, counted by a hook.
Self-attention share and VAE decode seconds: wall time inside those modules (hooks), first round.
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
SEED, GUIDANCE, STEPS = 0, 5.0, 10  # guidance > 1: two transformer passes a step, as Wan is run
# 8x32x32 = 8192 tokens: a multiple of the default 4x4x4 top-k tiles. 33 frames at 512x448 (9x28x32)
# pads the 4-frame tiles to 12 frames: there top-k attention alone is 2.6x faster than SDPA and topk
# end to end 1.84x (`--size 512x448 --frames 33`), below this size's figures in benchmarks/RESULTS.md
# ("Block-sparse attention on CPU", "End to end: vidserve vs diffusers WanPipeline").
SIZE, FRAMES = "512x512", 29
HEADS, HEAD_DIM, LAYERS, FFN_DIM, FREQ_DIM = 2, 128, 4, 512, 64  # head_dim as in Wan2.1
TOPK = {"mode": "topk", "density": 0.125}
# First-Block Cache reuses a step when the first block's output moved less than `threshold`; with
# random weights it moves 12-16% a step, so the usual 0.05-0.1 skip nothing. TaylorSeer's schedule
# is fixed: vidserve's defaults compute steps 0, 1, 3, 6, 9 of 10 and extrapolate the rest.
CACHE = {"kind": "taylorseer", "interval": 3, "warmup_steps": 2}


def build_model(folder: Path, vae_kind: str) -> None:
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    from vidserve.pipelines.tiny import TEXT_DIM, _scheduler, _text_encoder, _wan21_vae, build_tokenizer
    from vidserve.registry import MODELS, SERVING_FILE

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=HEADS, attention_head_dim=HEAD_DIM, in_channels=16,
        out_channels=16, text_dim=TEXT_DIM, freq_dim=FREQ_DIM, ffn_dim=FFN_DIM, num_layers=LAYERS,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads",
    ).eval()
    if vae_kind == "wan-tiny":
        vae = _wan21_vae()
    else:
        # Wan2.1's layout (z 16, 4x8x8, causal 3D convs), thinner than wan-tiny's. The decode is the same
        # work in every variant, so it caps every speed-up. wan-tiny's VAE decodes 29x512x512 in ~14 s on
        # the 2-core reference box (channel-first RMS norms and 3D convs at full resolution are slow on
        # CPU), about a quarter of a dense run; this one ~4 s, so the denoising that the variants change is
        # most of a run (`--vae wan-tiny` to compare).
        torch.manual_seed(0)
        vae = AutoencoderKLWan(base_dim=2, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=0,
                               temperal_downsample=[False, True, True]).eval()
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=_text_encoder(len(tokenizer)), vae=vae,
                       transformer=transformer, scheduler=_scheduler(MODELS["wan-tiny"]))
    pipe.save_pretrained(folder)
    # Serving facts diffusers' configs lack (fps, chunk length): wan-tiny's, so the clip is one chunk.
    (folder / SERVING_FILE).write_text(json.dumps({"base": "wan-tiny"}))


class PeakMemory:
    """Peak memory of one call above what was in use just before it; `.mb` after the block."""

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
        try:  # give freed heap back to the OS, or the last variant's leftovers would hide part of this peak
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
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
        else:
            self._stop.set()
            self._thread.join()
            self.mb = (max(self.peak, self.rss()) - self.base) / 2**20


class Probe:
    """Hooks on one pipeline. `blocks_run` counts transformer-block passes that really computed: the
    hook is on each block's last feed-forward Linear, which First-Block Cache skips with its block and
    TaylorSeer skips by replacing the forward of `ffn`. While `timing` is on, `seconds` sums the wall
    time inside self-attention (`attn1`: projections, norms, rotary, attention) and the VAE decoder."""

    def __init__(self, pipe, device: torch.device):
        self.blocks, self.blocks_run, self.timing = len(pipe.transformer.blocks), 0, False
        self.seconds = {"attention": 0.0, "decode": 0.0}
        self.sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        for block in pipe.transformer.blocks:
            block.ffn.net[-1].register_forward_hook(self._count)
            self._time(block.attn1, "attention")
        self._time(pipe.vae.decoder, "decode")

    def _count(self, *_):
        self.blocks_run += 1

    def _time(self, module: torch.nn.Module, key: str) -> None:
        def enter(*_):
            if self.timing:
                self.sync()
                self._t0 = time.perf_counter()

        def exit(*_):
            if self.timing:
                self.sync()
                self.seconds[key] += time.perf_counter() - self._t0

        module.register_forward_pre_hook(enter)
        module.register_forward_hook(exit)


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
        label = "reference" if r["name"] == "diffusers" else (
            "identical" if r["psnr_vs_diffusers"] is None else f"{r['psnr_vs_diffusers']:.1f} dB")
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
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--size", default=SIZE, help="WIDTHxHEIGHT")
    parser.add_argument("--frames", type=int, default=FRAMES)
    parser.add_argument("--cache", type=json.loads, default=CACHE, help=f"cache options as JSON (default {CACHE})")
    parser.add_argument("--vae", choices=("thin", "wan-tiny"), default="thin")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (bfloat16 transformer, float32 VAE; untested)")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "e2e.json")
    args = parser.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    width, height = map(int, args.size.split("x"))
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype_name = str(dtype).removeprefix("torch.")

    from diffusers import WanPipeline

    from vidserve.config import Settings
    from vidserve.options import LoadOptions
    from vidserve.pipelines.video import get_pipeline
    from vidserve.registry import resolve_local
    from vidserve.options import GenerationOptions
    from vidserve.video_request import build_request

    load_before = os.getloadavg()[0]  # before this process loads the box itself
    tmp = tempfile.TemporaryDirectory(prefix="vidserve-e2e-")
    folder = Path(tmp.name)
    build_model(folder, args.vae)
    spec = resolve_local(str(folder))
    grid = spec.token_grid(args.frames, width, height)

    # (a) as a diffusers user runs it (on CUDA with the VAE in float32, as vidserve keeps it).
    dtypes = {} if device.type == "cpu" else {"dtype": {"default": dtype, "vae": torch.float32}}
    reference = WanPipeline.from_pretrained(folder, **dtypes).to(device)
    reference.set_progress_bar_config(disable=True)

    def diffusers_run(steps: int):
        def run() -> np.ndarray:
            video = reference(prompt=PROMPT, negative_prompt=None, height=height, width=width, num_frames=args.frames,
                              num_inference_steps=steps, guidance_scale=GUIDANCE,
                              generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").frames[0]
            return (np.clip(video, 0.0, 1.0) * 255.0).round().astype(np.uint8)  # as VideoPipeline.generate
        return run

    plain = get_pipeline(spec, args.device, dtype_name)
    int8 = get_pipeline(spec, args.device, dtype_name, LoadOptions(quantization="int8"))

    def vidserve_run(pipe, attention, cache):
        def make(steps: int):
            request = build_request(spec, Settings(), PROMPT,
                                    GenerationOptions(steps=steps, guidance=GUIDANCE, seed=SEED, attention=attention,
                                                      cache=cache),
                                    size=args.size, num_frames=args.frames)
            return lambda: pipe.generate(request).frames
        return make

    dense, none = {"mode": "dense"}, {"kind": "none"}
    probes = [Probe(pipe, device) for pipe in (reference, plain.text_pipe, int8.text_pipe)]
    variants = {  # name: (runner for a number of steps, probe on its pipeline)
        "diffusers": (diffusers_run, probes[0]),
        "dense": (vidserve_run(plain, dense, none), probes[1]),
        "topk": (vidserve_run(plain, TOPK, none), probes[1]),
        "cache": (vidserve_run(plain, dense, args.cache), probes[1]),
        "topk+cache": (vidserve_run(plain, TOPK, args.cache), probes[1]),
        "topk+cache+int8": (vidserve_run(int8, TOPK, args.cache), probes[2]),
    }

    print(f"Wan2.1-style, random weights: {LAYERS} blocks, {HEADS} heads x {HEAD_DIM}, ffn {FFN_DIM}, "
          f"{args.vae} VAE; {args.size} x {args.frames} frames = {'x'.join(map(str, grid))} = {np.prod(grid)} "
          f"tokens; {args.steps} steps, guidance {GUIDANCE}, seed {SEED}; cache {args.cache}; {runs} timed "
          f"run(s) per variant after a 1-step warm-up; {device} {dtype_name}, {torch.get_num_threads()} threads")
    for name, (make, _) in variants.items():
        make(1)()
    timed = {name: make(args.steps) for name, (make, _) in variants.items()}
    seconds, cpu = {name: [] for name in variants}, {name: [] for name in variants}
    frames, skipped, attention_share, decode_s, peak_mb = {}, {}, {}, {}, {}
    for i in range(runs):
        for name, run in timed.items():
            probe = variants[name][1]
            probe.blocks_run, probe.seconds, probe.timing = 0, {"attention": 0.0, "decode": 0.0}, i == 0
            with PeakMemory(device) as memory:
                start, cpu_start = time.perf_counter(), time.process_time()
                out = run()
                seconds[name].append(time.perf_counter() - start)
            # Below ~0.9 the process got less CPU than its threads asked for: something else ran.
            cpu[name].append((time.process_time() - cpu_start) / (seconds[name][-1] * torch.get_num_threads()))
            probe.timing = False
            peak_mb[name] = max(peak_mb.get(name, 0.0), memory.mb)
            if i == 0:
                frames[name] = out
                attention_share[name] = probe.seconds["attention"] / seconds[name][-1]
                decode_s[name] = probe.seconds["decode"]
                skipped[name] = 1 - probe.blocks_run / (probe.blocks * args.steps * (2 if GUIDANCE > 1 else 1))
            elif not np.array_equal(out, frames[name]):
                print(f"  note: {name} run {i + 1} made other frames than run 1")
            print(f"  run {i + 1}/{runs} {name}: {seconds[name][-1]:.1f} s, cpu {cpu[name][-1]:.2f}, "
                  f"peak +{memory.mb:.0f} MB", flush=True)
    load_after = os.getloadavg()[0]

    base = statistics.median(seconds["diffusers"])
    rows = []
    for name in variants:
        median, p = statistics.median(seconds[name]), psnr(frames[name], frames["diffusers"])
        rows.append({"name": name, "seconds": round(median, 2), "speedup_vs_diffusers": round(base / median, 3),
                     "psnr_vs_diffusers": None if p is None else round(p, 2),
                     "ssim_vs_diffusers": round(ssim(frames[name], frames["diffusers"]), 4),
                     "peak_mem_mb": round(peak_mb[name], 1), "blocks_skipped": round(skipped[name], 3),
                     "self_attention_share": round(attention_share[name], 3),
                     "vae_decode_s": round(decode_s[name], 2),
                     "samples_s": [round(s, 2) for s in seconds[name]], "cpu": [round(c, 2) for c in cpu[name]]})

    print("\n| variant | seconds | speedup | PSNR dB | SSIM | peak MB | blocks skipped | self-attn share | decode s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        p = "reference" if r["name"] == "diffusers" else (
            "identical" if r["psnr_vs_diffusers"] is None else f"{r['psnr_vs_diffusers']:.1f}")
        print(f"| {r['name']} | {r['seconds']:.1f} | {r['speedup_vs_diffusers']:.2f}x | {p} | "
              f"{r['ssim_vs_diffusers']:.4f} | {r['peak_mem_mb']:.0f} | {100 * r['blocks_skipped']:.0f}% | "
              f"{100 * r['self_attention_share']:.0f}% | {r['vae_decode_s']:.1f} |")
    diff = int(np.abs(frames["diffusers"].astype(np.int16) - frames["dense"].astype(np.int16)).max())
    print(f"\ndense vs diffusers frames: {'bit-identical' if diff == 0 else f'max |difference| {diff}/255'}")
    speedup = {r["name"]: r["speedup_vs_diffusers"] for r in rows}
    for label, ok in (("(b) dense within 5% of diffusers", abs(1 / speedup["dense"] - 1) <= 0.05),
                      ("(c) topk >= 2.5x", speedup["topk"] >= 2.5),
                      ("(e) topk+cache >= 4x", speedup["topk+cache"] >= 4)):
        print(f"{label}: {'yes' if ok else 'NO'}")
    print(f"1-min load average {load_before:.2f} at the start, {load_after:.2f} at the end (this process adds ~2); "
          f"cpu (process CPU time / wall x {torch.get_num_threads()} threads) {min(min(c) for c in cpu.values()):.2f}"
          f"-{max(max(c) for c in cpu.values()):.2f}")

    model = {"layers": LAYERS, "heads": HEADS, "head_dim": HEAD_DIM, "ffn_dim": FFN_DIM, "freq_dim": FREQ_DIM,
             "transformer_params": sum(p.numel() for p in reference.transformer.parameters()), "vae": args.vae}
    config = {"model": model, "size": args.size, "frames": args.frames, "grid": list(grid),
              "tokens": int(np.prod(grid)), "steps": args.steps, "guidance": GUIDANCE, "seed": SEED, "prompt": PROMPT,
              "topk": TOPK, "cache": args.cache, "runs": runs, "warmup": "1 run of 1 step per variant",
              "quick": args.quick, "device": str(device), "dtype": dtype_name, "cpu_count": os.cpu_count(),
              "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
              "loadavg_1m_start_end": [round(load_before, 2), round(load_after, 2)]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"variants": rows, "config": config}, indent=2) + "\n")
    png = args.json.with_suffix(".png")
    chart(rows, png, f"{np.prod(grid)} tokens, {args.steps} steps, {device}, median of {runs}; "
                     "above the bars: PSNR of the frames vs diffusers'")
    print(f"JSON in {args.json}, chart in {png}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
