"""Train wan-shapes' video autoencoder for reconstruction: `python -m training.train_vae`.

Clips come fresh from the shapes world every step (train combinations only). Four phases:
first 9-frame windows (the causal VAE's first frame + two 4-frame chunks) with sampled
latents and a tiny KL term as Wan's VAE has, then whole 17-frame clips (so every chunk
position of the causal cache is trained: a VAE trained on 9 frames alone garbles frames
13-16) from the posterior mean, which sharpens the decoder; phase 3 takes smaller batches
at a lower rate (more updates per CPU-second). The encoder is then final: the per-channel
latent mean/std go into the config (the pipelines normalise with them) and the VAE is saved,
so train_wan.py may start. Phase 4 trains the decoder alone, to sharpen the corners of
squares and triangles. The loss is L1 + MSE with shape pixels weighted up. At the end
held-out clips are reconstructed and scored.

On a GPU (`--device cuda`) give it bigger batches (`--batches`) and `--workers` to render
clips ahead of the step; training/gpu.sh is that run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLWan

from . import common, shapes_world as world
from .shapes_score import score
from .wan_shapes import FOLDER, FRAMES, SIZE, build_vae, to_clips, to_tensor

WINDOW = 9


def batch(job: tuple[int, int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(clips uint8 [B, window, H, W, 3], shape-pixel masks [B, window, H, W]) for one step's seed."""
    seed, size, window = job
    rng = np.random.default_rng(seed)
    specs = world.sample_specs(size, seed, frames=FRAMES, width=SIZE, height=SIZE,
                               two_shapes=0.2, gradient=0.2, extra_motions=0.15)
    clips, masks = [], []
    for spec in specs:
        start = int(rng.integers(0, FRAMES - window + 1))
        clip = world.render(spec)[start:start + window]
        masks.append(world.shape_pixels(spec, clip))
        clips.append(clip)
    return np.stack(clips), np.stack(masks)


def train(vae, args, steps: int, size: int, window: int, sample: bool, lr: float, seed: int, log: list,
          decoder_only: bool = False) -> None:
    """One phase: its own optimizer, warm-up and cosine decay; batches drawn from `seed`."""
    params = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()] if decoder_only else list(vae.parameters())
    opt, schedule = common.optimizer(params, lr, steps, warmup=50, floor=0.1)
    start = time.time()
    jobs = ((seed * 1_000_003 + step, size, window) for step in range(steps))
    for step, (clips, masks) in enumerate(common.prefetch(batch, jobs, args.workers)):
        if common.stopped_early(args, log, step, last_phase=decoder_only, frames=window, decoder_only=decoder_only):
            break
        x = to_tensor(clips).to(args.device)
        # Shape pixels weigh 5x: a shape is ~5% of a frame, and its edges are what the scorer and eye judge.
        w = 1.0 + 4.0 * torch.from_numpy(masks).to(args.device, torch.float32)[:, None]
        with torch.set_grad_enabled(not decoder_only):
            posterior = vae.encode(x).latent_dist
        rec = vae.decode(posterior.sample() if sample else posterior.mode()).sample
        err = rec - x
        loss = (w * (err.abs() + err.square())).mean() / w.mean() + (1e-6 * posterior.kl().mean() if sample else 0)
        common.update(opt, schedule, loss, params)
        if step % 50 == 0 or step == steps - 1:
            log.append({"frames": window, "decoder_only": decoder_only, "step": step, "loss": round(loss.item(), 5),
                        "seconds": round(time.time() - start, 1)})
            print(log[-1], flush=True)


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--steps", type=int, default=800, help="phase 1: 9-frame windows, sampled latents")
    parser.add_argument("--full-steps", type=int, nargs=3, default=[350, 700, 1200],
                        help="phases 2 and 3: whole clips, posterior mean; phase 4: the decoder alone")
    parser.add_argument("--batches", type=int, nargs=4, default=[6, 4, 2, 2], help="clips per step, per phase")
    parser.add_argument("--decoder-only", action="store_true",
                        help="phase 4 alone, on fresh batches, for the VAE already in --out (to go on with a "
                             "run its deadline cut short); its log is appended to that run's")
    args = common.parse(parser)

    torch.manual_seed(args.seed)
    if args.decoder_only:
        vae = AutoencoderKLWan.from_pretrained(f"{args.out}/vae").to(args.device).train()
        log, earlier_args = common.earlier_runs(Path(args.out) / "training" / "vae.json")
        log.append({"resumed": len(earlier_args)})
        train(vae, args, args.full_steps[2], args.batches[3], FRAMES, False, 5e-4, args.seed + 4, log,
              decoder_only=True)
        finish(vae, args, log, earlier_args)
        return
    vae = build_vae(args.seed).to(args.device).train()
    log: list = []
    (b1, b2, b3, b4), (s2, s3, s4) = args.batches, args.full_steps
    train(vae, args, args.steps, b1, WINDOW, True, 1e-3, args.seed, log)
    train(vae, args, s2, b2, FRAMES, False, 1e-3, args.seed + 1, log)
    train(vae, args, s3, b3, FRAMES, False, 5e-4, args.seed + 2, log)
    # The encoder is final from here: saved now (with its latent statistics), train_wan.py
    # can start on it while the decoder trains on.
    set_latent_stats(vae, args)
    vae.save_pretrained(f"{args.out}/vae", safe_serialization=True)
    print("encoder final: saved", flush=True)
    train(vae, args, s4, b4, FRAMES, False, 5e-4, args.seed + 3, log, decoder_only=True)
    finish(vae, args, log)


@torch.no_grad()
def set_latent_stats(vae, args) -> None:
    """Per-channel mean/std of the latents of fresh full-length train clips into the config:
    the pipelines normalise with them, so the transformer sees unit-scale latents."""
    vae.eval()
    specs = world.sample_specs(64, args.seed + 1, frames=FRAMES, width=SIZE, height=SIZE, two_shapes=0.2)
    z = torch.cat([vae.encode(to_tensor([world.render(s) for s in specs[i:i + 8]]).to(args.device)).latent_dist.mode()
                   for i in range(0, 64, 8)])
    mean, std = z.mean(dim=(0, 2, 3, 4)), z.std(dim=(0, 2, 3, 4))
    vae.register_to_config(latents_mean=[round(v, 5) for v in mean.tolist()],
                           latents_std=[round(v, 5) for v in std.tolist()])
    vae.train()


def finish(vae, args, log: list, earlier_args: Sequence = ()) -> None:
    vae.eval()
    with torch.no_grad():
        held = world.sample_specs(50, 1234, split="heldout", frames=FRAMES, width=SIZE, height=SIZE)
        truth = [world.render(s) for s in held]
        recs, psnr = [], []
        for i in range(0, len(held), 10):
            x = to_tensor(truth[i:i + 10]).to(args.device)
            out = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
            psnr += (10 * torch.log10(4 / (out - x).square().mean(dim=(1, 2, 3, 4)))).tolist()
            recs += list(to_clips(out))
        scores = [score(r, world.caption(s)) for r, s in zip(recs, held)]
    evaluation = {"heldout_clips": len(held), "psnr_db": round(float(np.mean(psnr)), 2),
                  **{k: round(float(np.mean([s[k] for s in scores])), 3) for k in ("colour", "shape", "motion", "all")}}
    print("reconstruction of held-out clips:", evaluation)
    vae.to("cpu").save_pretrained(f"{args.out}/vae", safe_serialization=True)
    common.write_log(Path(args.out) / "training" / "vae.json",
                     {"args": vars(args), "log": log, "evaluation": evaluation,
                      "latents_mean": vae.config.latents_mean, "latents_std": vae.config.latents_std},
                     earlier_args)


if __name__ == "__main__":
    main()
