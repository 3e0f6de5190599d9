"""Train wan-shapes' video autoencoder for reconstruction: `python -m training.train_vae`.

Clips come fresh from the shapes world every step (train combinations only). Two phases:
first 9-frame windows (the causal VAE's first frame + two 4-frame chunks) with sampled
latents and a tiny KL term as Wan's VAE has, then whole 17-frame clips (so every chunk
position of the causal cache is trained: a VAE trained on 9 frames alone garbles frames
13-16) from the posterior mean, which sharpens the decoder; phase 3 takes smaller batches
at a lower rate (more updates per CPU-second), and phase 4 trains the decoder alone, the
encoder frozen, to sharpen the corners of squares and triangles. The loss is L1 + MSE with shape
pixels weighted up (a shape is ~5% of a frame, and its edges are what the scorer and the
eye judge).
Afterwards the per-channel latent mean/std go into the config (the pipelines normalise
with them) and held-out clips are reconstructed and scored.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import torch

from . import common, shapes_world as world
from .shapes_score import score
from .wan_shapes import FOLDER, FRAMES, SIZE, build_vae, to_tensor

WINDOW = 9


def batch(rng: np.random.Generator, seed: int, size: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    specs = world.sample_specs(size, seed, frames=FRAMES, width=SIZE, height=SIZE,
                               two_shapes=0.2, gradient=0.2, extra_motions=0.15)
    clips, weights = [], []
    for spec in specs:
        start = int(rng.integers(0, FRAMES - window + 1))
        clip = world.render(spec)[start:start + window]
        shape_px = np.abs(clip.astype(np.int16) - world.background(spec)[None]).max(-1) > 8
        clips.append(clip)
        weights.append(1.0 + 4.0 * shape_px)
    return to_tensor(clips), torch.from_numpy(np.stack(weights)).float()[:, None]


def train(vae, steps: int, size: int, window: int, sample: bool, lr: float, seed: int, log: list,
          decoder_only: bool = False) -> None:
    """One phase: its own optimizer, warm-up and cosine decay; batches drawn from `seed`."""
    rng = np.random.default_rng(seed)
    params = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()] if decoder_only else list(vae.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))))
    start = time.time()
    for step in range(steps):
        x, w = batch(rng, seed * 1_000_003 + step, size, window)
        with torch.set_grad_enabled(not decoder_only):
            posterior = vae.encode(x).latent_dist
        rec = vae.decode(posterior.sample() if sample else posterior.mode()).sample
        err = rec - x
        loss = (w * (err.abs() + err.square())).mean() / w.mean() + (1e-6 * posterior.kl().mean() if sample else 0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        schedule.step()
        if step % 50 == 0 or step == steps - 1:
            log.append({"frames": window, "decoder_only": decoder_only, "step": step, "loss": round(loss.item(), 5),
                        "seconds": round(time.time() - start, 1)})
            print(log[-1], flush=True)


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--steps", type=int, default=800, help="phase 1: 9-frame windows, sampled latents")
    parser.add_argument("--full-steps", type=int, nargs=3, default=[350, 700, 1200],
                        help="phases 2 and 3: whole clips, posterior mean; phase 4: the decoder alone")
    args = common.parse(parser)

    torch.manual_seed(args.seed)
    vae = build_vae(args.seed).train()
    log: list = []
    train(vae, args.steps, 6, WINDOW, True, 1e-3, args.seed, log)
    train(vae, args.full_steps[0], 4, FRAMES, False, 1e-3, args.seed + 1, log)
    train(vae, args.full_steps[1], 2, FRAMES, False, 5e-4, args.seed + 2, log)
    # The encoder is final from here: train_wan.py needs only its latents, so it may run
    # beside this phase (as it did for the committed weights) with the same result.
    train(vae, args.full_steps[2], 2, FRAMES, False, 5e-4, args.seed + 3, log, decoder_only=True)
    finish(vae, args, log)


def finish(vae, args, log: list) -> None:
    vae.eval()
    with torch.no_grad():
        # Latent statistics over fresh train clips, full length: what the transformer will see.
        specs = world.sample_specs(64, args.seed + 1, frames=FRAMES, width=SIZE, height=SIZE, two_shapes=0.2)
        z = torch.cat([vae.encode(to_tensor([world.render(s) for s in specs[i:i + 8]])).latent_dist.mode()
                       for i in range(0, 64, 8)])
        mean, std = z.mean(dim=(0, 2, 3, 4)), z.std(dim=(0, 2, 3, 4))
        vae.register_to_config(latents_mean=[round(v, 5) for v in mean.tolist()],
                               latents_std=[round(v, 5) for v in std.tolist()])
        held = world.sample_specs(50, 1234, split="heldout", frames=FRAMES, width=SIZE, height=SIZE)
        truth = [world.render(s) for s in held]
        recs, psnr = [], []
        for i in range(0, len(held), 10):
            x = to_tensor(truth[i:i + 10])
            out = vae.decode(vae.encode(x).latent_dist.mode()).sample.clamp(-1, 1)
            psnr += (10 * torch.log10(4 / (out - x).square().mean(dim=(1, 2, 3, 4)))).tolist()
            recs += list(((out.permute(0, 2, 3, 4, 1) + 1) * 127.5).round().byte().numpy())
        scores = [score(r, world.caption(s)) for r, s in zip(recs, held)]
    evaluation = {"heldout_clips": len(held), "psnr_db": round(float(np.mean(psnr)), 2),
                  **{k: round(float(np.mean([s[k] for s in scores])), 3) for k in ("colour", "shape", "motion", "all")}}
    print("reconstruction of held-out clips:", evaluation)
    vae.save_pretrained(f"{args.out}/vae", safe_serialization=True)
    common.write_log(Path(args.out) / "training" / "vae.json",
              {"args": vars(args), "log": log, "evaluation": evaluation,
               "latents_mean": vae.config.latents_mean, "latents_std": vae.config.latents_std})


if __name__ == "__main__":
    main()
