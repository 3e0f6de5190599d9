"""Train wan-shapes' transformer with flow matching: `python -m training.train_wan` (after train_vae).

Train-split clips are rendered and encoded once (the VAE's mode, normalised by its latent
statistics); captions go through the frozen text encoder exactly as the pipeline encodes
prompts. Each step noises the latents to sigma (uniform, then shifted as the sampler's
flow_shift shifts it) and regresses the velocity noise - latents. A share of the samples
(--image-share, half by default) are image-to-video: their first latent frame stays clean
with timestep 0 on its tokens and out of the loss, which is how Wan2.2 TI2V conditions on a
first frame. One caption in ten is dropped to "" for classifier-free guidance. Two options
aim the training at shape, which a model trained this way draws as a blob for want of signal
(measured in vidserve/weights/wan-shapes/README.md, "Training history"): shape is decided at
middle noise levels, so --mid-sigma sends a share of the samples there; and text-to-video draws
its own first frame, which an --image-share below 0.5 puts in the loss of more samples. A third,
--object-weight, weighs the latent cells a shape touches up; it is kept only to reproduce the
committed model's earlier runs, and is off by default because it is biased: the weight depends
on where the shape truly is, so wherever the model is unsure, the loss is least when it paints
shape, and shapes come out too big and round (the same section). The exponential moving average
of the weights is what gets saved, as a complete diffusers folder (all but vae/, train_vae.py's).
--resume goes on from the saved transformer and text encoder with a fresh schedule, so training
can be split over several runs (a lent GPU's calls are 10 minutes at most); the log keeps every
run. With --deepen N it first adds N blocks that start as no-ops (wan_shapes.deepen): more
capacity, when more runs of the same model have levelled off, without starting over. --seed
picks the clips (a new seed, clips not seen before) and, without --resume, the frozen text
encoder and the transformer's initialisation.
"""

from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from transformers import UMT5EncoderModel

from vidserve.registry import SERVING_FILE

from . import common, shapes_world as world
from .wan_shapes import (FLOW_SHIFT, FOLDER, FRAMES, SIZE, TEXT_TOKENS, build_pipeline, build_transformer, deepen,
                         latent_stats, to_tensor)


def render(specs: list) -> tuple[np.ndarray, np.ndarray]:
    """(clips uint8 [B, F, H, W, 3], bool [B, F', H/4, W/4]: the latent cells a shape touches).
    A latent cell covers 4x4 pixels of one frame (the first) or of 4 frames (the rest), as the
    VAE's strides do."""
    clips = np.stack([world.render(s) for s in specs])
    pixels = np.stack([world.shape_pixels(s, c) for s, c in zip(specs, clips)])
    b, f, h, w = pixels.shape
    frames = np.concatenate([pixels[:, :1], pixels[:, 1:].reshape(b, (f - 1) // 4, 4, h, w).max(2)], axis=1)
    return clips, frames.reshape(b, -1, h // 4, 4, w // 4, 4).max((3, 5))


@torch.no_grad()
def encode_clips(vae: AutoencoderKLWan, specs: list, workers: int = 0,
                 batch: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(normalised latents [N, C, F', H/4, W/4], shape cells bool [N, 1, F', H/4, W/4]), both on
    the VAE's device, where the training steps index them."""
    mean, std = (t.to(vae.device) for t in latent_stats(vae))
    chunks = (specs[i:i + batch] for i in range(0, len(specs), batch))
    latents, cells = [], []
    for clips, shape_cells in common.prefetch(render, chunks, workers):
        latents.append((vae.encode(to_tensor(clips).to(vae.device)).latent_dist.mode() - mean) / std)
        cells.append(torch.from_numpy(shape_cells)[:, None].to(vae.device))
    return torch.cat(latents), torch.cat(cells)


@torch.no_grad()
def encode_captions(pipe, captions: list[str], batch: int = 256) -> tuple[dict[str, int], torch.Tensor]:
    """(row of each text, embeddings [N, TEXT_TOKENS, dim]); row 0 is "", the dropped caption."""
    texts = ["", *sorted(set(captions) - {""})]
    embeds = [pipe.encode_prompt(texts[i:i + batch], do_classifier_free_guidance=False,
                                 max_sequence_length=TEXT_TOKENS, device=pipe.text_encoder.device)[0]
              for i in range(0, len(texts), batch)]
    return {t: i for i, t in enumerate(texts)}, torch.cat(embeds)


def save(pipe, out: Path) -> None:
    """The pipeline as a loadable diffusers folder, all but the VAE: out/vae is train_vae.py's,
    whose decoder may still be training beside this run."""
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        pipe.save_pretrained(tmp, safe_serialization=True)
        for item in Path(tmp).iterdir():
            if item.name != "vae":
                shutil.rmtree(out / item.name, ignore_errors=True)
                (out / item.name).unlink(missing_ok=True)
                item.rename(out / item.name)
    (out / SERVING_FILE).write_text(json.dumps({"base": "wan-shapes"}, indent=2) + "\n")


def main() -> None:
    parser = common.parser(__doc__, FOLDER)
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--clips", type=int, default=3000)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--ema", type=float, default=0.999)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--object-weight", type=float, default=1.0,
                        help="loss weight of the latent cells a shape touches (the rest weigh 1); biased, see above")
    parser.add_argument("--mid-sigma", type=float, default=0.0,
                        help="share of samples with sigma uniform in [0.25, 0.65], where shape is decided")
    parser.add_argument("--image-share", type=float, default=0.5,
                        help="share of image-to-video samples (first latent frame given clean)")
    parser.add_argument("--resume", action="store_true", help="go on from the transformer saved in --out")
    parser.add_argument("--deepen", type=int, default=0,
                        help="with --resume: add this many blocks, each starting as a no-op (wan_shapes.deepen)")
    args = common.parse(parser)
    out, device = Path(args.out), torch.device(args.device)

    vae = AutoencoderKLWan.from_pretrained(out / "vae").to(device).eval()
    torch.manual_seed(args.seed)
    log, earlier_args, text_encoder = [], [], None
    if args.resume:
        model = deepen(WanTransformer3DModel.from_pretrained(out / "transformer"), args.deepen)
        text_encoder = UMT5EncoderModel.from_pretrained(out / "text_encoder").eval()
        log, earlier_args = common.earlier_runs(out / "training" / "transformer.json")
        log.append({"resumed": len(earlier_args)})
    elif args.deepen:
        parser.error("--deepen grows a trained transformer: it needs --resume")
    else:
        model = build_transformer(args.seed)
    model = model.to(device).train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    pipe = build_pipeline(vae, ema, args.seed, text_encoder).to(device)
    specs = world.sample_specs(args.clips, args.seed + 7, frames=FRAMES, width=SIZE, height=SIZE,
                               two_shapes=0.15, gradient=0.2, extra_motions=0.15)
    captions = [world.caption(s) for s in specs]
    rows, text = encode_captions(pipe, captions)
    caption_of = torch.tensor([rows[c] for c in captions])
    latents, shape_cells = encode_clips(vae, specs, args.workers)
    print(f"encoded {len(specs)} clips {tuple(latents.shape[1:])} and {len(rows)} captions "
          f"in {time.time() - args.started:.0f} s", flush=True)

    frame_tokens = (latents.shape[3] // 2) * (latents.shape[4] // 2)
    params, ema_params = list(model.parameters()), list(ema.parameters())
    opt, schedule = common.optimizer(params, args.lr, args.steps, args.warmup, floor=0.1, weight_decay=0.01)
    # On the CPU: the same draws on any device; a resumed run draws other noise than the runs before it.
    gen = torch.Generator().manual_seed(args.seed + 1000 * len(earlier_args))
    losses = []
    for step in range(args.steps):
        if common.stopped_early(args, log, step):
            break
        idx = torch.randint(len(specs), (args.batch,), generator=gen)
        picked = idx.to(device)
        x0, cells = latents[picked], shape_cells[picked]
        noise = torch.randn(x0.shape, generator=gen).to(device)
        u = torch.rand(args.batch, generator=gen)
        sigma = FLOW_SHIFT * u / (1 + (FLOW_SHIFT - 1) * u)
        if args.mid_sigma:  # drawn only when asked, so the default recipe's draws stay what they were
            mid = torch.rand(args.batch, generator=gen) < args.mid_sigma
            sigma = torch.where(mid, 0.25 + 0.4 * torch.rand(args.batch, generator=gen), sigma)
        sigma = sigma.to(device)
        xt = (1 - sigma.view(-1, 1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1, 1) * noise
        with_image = (torch.rand(args.batch, generator=gen) < args.image_share).to(device)
        xt[with_image, :, 0] = x0[with_image, :, 0]
        timestep = (sigma * 1000).view(-1, 1).repeat(1, x0.shape[2] * frame_tokens)
        timestep[with_image, :frame_tokens] = 0
        weight = 1 + (args.object_weight - 1) * cells.to(x0.dtype)
        weight[with_image, :, 0] = 0
        drop = torch.rand(args.batch, generator=gen) < 0.1
        context = text[torch.where(drop, 0, caption_of[idx]).to(device)]

        pred = model(xt, timestep, context, return_dict=False)[0]
        loss = (weight * (pred - (noise - x0)).square()).sum() / (weight.sum() * x0.shape[1])
        common.update(opt, schedule, loss, params)
        with torch.no_grad():
            torch._foreach_lerp_(ema_params, params, 1 - min(args.ema, (1 + step) / (10 + step)))
        losses = common.log_losses(log, [*losses, loss.detach()], step, args.steps, args.started)
        if (step + 1) % 1000 == 0:
            save(pipe, out)  # the EMA weights, a loadable checkpoint while training goes on
    save(pipe, out)
    common.write_log(out / "training" / "transformer.json", {"args": vars(args), "log": log}, earlier_args)


if __name__ == "__main__":
    main()
