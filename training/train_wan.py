"""Train wan-shapes' transformer with flow matching: `python -m training.train_wan` (after train_vae).

Train-split clips are rendered and encoded once (the VAE's mode, normalised by its latent
statistics); captions go through the frozen text encoder exactly as the pipeline encodes
prompts. Each step noises the latents to sigma (uniform, then shifted as the sampler's
flow_shift shifts it) and regresses the velocity noise - latents. Half the samples are
image-to-video: their first latent frame stays clean with timestep 0 on its tokens and
out of the loss, which is how Wan2.2 TI2V conditions on a first frame. One caption in ten
is dropped to "" for classifier-free guidance. The exponential moving average of the
weights is what gets saved, as a complete diffusers folder.
"""

from __future__ import annotations

import copy
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLWan

from vidserve.registry import SERVING_FILE

from . import common, shapes_world as world
from .wan_shapes import (FLOW_SHIFT, FOLDER, FRAMES, SIZE, TEXT_TOKENS, build_pipeline, build_transformer,
                         latent_stats, to_tensor)


@torch.no_grad()
def encode_clips(vae: AutoencoderKLWan, specs: list, batch: int = 16) -> torch.Tensor:
    mean, std = latent_stats(vae)
    out = []
    for i in range(0, len(specs), batch):
        x = to_tensor([world.render(s) for s in specs[i:i + batch]])
        out.append((vae.encode(x).latent_dist.mode() - mean) / std)
    return torch.cat(out)


@torch.no_grad()
def encode_captions(pipe, captions: list[str]) -> dict[str, torch.Tensor]:
    embeds = {}
    for text in sorted(set(captions) | {""}):
        embeds[text] = pipe.encode_prompt(text, do_classifier_free_guidance=False, max_sequence_length=TEXT_TOKENS,
                                          device=torch.device("cpu"))[0][0]
    return embeds


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--clips", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--ema", type=float, default=0.999)
    args = common.parse(parser)
    out = Path(args.out)
    start = time.time()

    vae = AutoencoderKLWan.from_pretrained(out / "vae").eval()
    torch.manual_seed(args.seed)
    model = build_transformer(args.seed).train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    pipe = build_pipeline(vae, ema, args.seed)
    specs = world.sample_specs(args.clips, args.seed + 7, frames=FRAMES, width=SIZE, height=SIZE,
                               two_shapes=0.15, gradient=0.2, extra_motions=0.15)
    captions = [world.caption(s) for s in specs]
    latents = encode_clips(vae, specs)
    text = encode_captions(pipe, captions)
    print(f"encoded {len(specs)} clips {tuple(latents.shape[1:])} and {len(text)} captions "
          f"in {time.time() - start:.0f} s", flush=True)

    frame_tokens = (latents.shape[3] // 2) * (latents.shape[4] // 2)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 200) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / args.steps))))
    gen = torch.Generator().manual_seed(args.seed)
    log, losses = [], []
    for step in range(args.steps):
        idx = torch.randint(len(specs), (args.batch,), generator=gen)
        x0 = latents[idx]
        noise = torch.randn(x0.shape, generator=gen)
        u = torch.rand(args.batch, generator=gen)
        sigma = FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)
        xt = (1 - sigma.view(-1, 1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1, 1) * noise
        with_image = torch.rand(args.batch, generator=gen) < 0.5
        xt[with_image, :, 0] = x0[with_image, :, 0]
        timestep = (sigma * 1000).view(-1, 1).repeat(1, x0.shape[2] * frame_tokens)
        timestep[with_image, :frame_tokens] = 0
        weight = torch.ones_like(x0[:, :1])
        weight[with_image, :, 0] = 0
        drop = torch.rand(args.batch, generator=gen) < 0.1
        context = torch.stack([text["" if d else captions[i]] for i, d in zip(idx.tolist(), drop.tolist())])

        pred = model(xt, timestep, context, return_dict=False)[0]
        loss = (weight * (pred - (noise - x0)).square()).sum() / (weight.sum() * x0.shape[1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        with torch.no_grad():
            decay = min(args.ema, (1 + step) / (10 + step))
            for e, p in zip(ema.parameters(), model.parameters()):
                e.lerp_(p, 1 - decay)
        losses.append(loss.item())
        if (step + 1) % 100 == 0 or step == args.steps - 1:
            log.append({"step": step + 1, "loss": round(float(np.mean(losses)), 5),
                        "seconds": round(time.time() - start, 1)})
            losses = []
            print(log[-1], flush=True)
        if (step + 1) % 1000 == 0 or step == args.steps - 1:
            pipe.save_pretrained(out, safe_serialization=True)  # the EMA weights, a loadable folder
            (out / SERVING_FILE).write_text(json.dumps({"base": "wan-shapes"}, indent=2) + "\n")
    common.write_log(out / "training" / "transformer.json", {"args": vars(args), "log": log})


if __name__ == "__main__":
    main()
