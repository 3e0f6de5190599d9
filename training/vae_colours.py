"""Can wan-shapes' frozen VAE carry a colour it never saw? `python -m training.vae_colours`

A transformer adapter (LoRA) changes only the latents; every clip still leaves through the
base VAE's decoder. So before training one to draw a new colour, check that the colour
survives the VAE: (1) held-out clips painted in each candidate RGB, encoded (posterior mean),
decoded and read by training/shapes_score.py's hue vote; (2) with --invert N, whether any
latent at all decodes to it: the first frames of N clips, inverted by gradient descent on
the decoder (clamp bypassed where the target is inside [-1, 1], or its gradient vanishes),
with how far those latents sit from the encoder's, in units of the latents' std.

On wan-shapes every violet comes back blue, since the encoder's latent for purple is blue's, and
the latents that do decode to purple lie far outside those the encoder makes; so a transformer
LoRA trained on encoder latents can only learn blue (measured with `--invert 12` in
vidserve/weights/wan-shapes/README.md, "Training history", "Purple through the frozen VAE").
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from diffusers import AutoencoderKLWan

from . import shapes_world as world
from .shapes_score import _hue, detect
from .wan_shapes import FOLDER, to_clips, to_tensor

VIOLETS = [(170, 0, 255), (128, 0, 255), (200, 0, 255), (210, 0, 255), (140, 0, 200), (110, 0, 180),
           (100, 40, 160), (160, 32, 240), (150, 60, 220)]


def hue(rgb) -> float:
    c = np.array(rgb, float)
    return float(_hue(c[None], c.max()[None], np.array([c.max() - c.min()]))[0])


def raw_decode(vae: AutoencoderKLWan, z: torch.Tensor) -> torch.Tensor:
    """vae.decode without its final clamp to [-1, 1] (diffusers' AutoencoderKLWan._decode, untiled)."""
    vae.clear_cache()
    x, frames = vae.post_quant_conv(z), []
    for i in range(z.shape[2]):
        vae._conv_idx = [0]
        frames.append(vae.decoder(x[:, :, i:i + 1], feat_cache=vae._feat_map, feat_idx=vae._conv_idx,
                                  first_chunk=i == 0))
    vae.clear_cache()
    return torch.cat(frames, 2)


def invert(vae: AutoencoderKLWan, target: torch.Tensor, steps: int, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(encoder latents, latents found by descent) for target [B, 3, F, H, W] in [-1, 1]."""
    with torch.no_grad():
        z0 = vae.encode(target).latent_dist.mode()
    z = z0.clone().requires_grad_(True)
    opt = torch.optim.Adam([z], lr=lr)
    for _ in range(steps):
        out = raw_decode(vae, z)  # past +-1 is as good as +-1 where the target is there, and nowhere else
        out = torch.where(target >= 0.999, out.clamp(max=1), torch.where(target <= -0.999, out.clamp(min=-1), out))
        loss = (out - target).square().mean((1, 2, 3, 4)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return z0, z.detach()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=9)
    p.add_argument("--invert", type=int, default=0, help="also invert the first frames of this many clips")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    vae = AutoencoderKLWan.from_pretrained(FOLDER / "vae").eval().requires_grad_(False)
    specs = world.sample_specs(args.clips, 5, "heldout", frames=17, colours="purple")
    for rgb in [world.NEW_COLOURS["purple"], *VIOLETS[1:]]:
        clips = [world.render(s, palette=([rgb], None)) for s in specs]
        with torch.no_grad():
            out = to_clips(vae.decode(vae.encode(to_tensor(clips)).latent_dist.mode()).sample)
        reads = [detect(o)["colour"] for o in out]
        print(f"RGB {rgb} (hue {hue(rgb):.0f}) through the VAE reads {reads.count('purple')}/{len(reads)} purple: "
              f"{reads}")
    if args.invert:
        specs = world.sample_specs(args.invert, 3, frames=17, colours="purple")
        target = to_tensor([world.render(s)[:1] for s in specs])
        z0, z = invert(vae, target, args.steps, 0.1)
        with torch.no_grad():
            out = to_clips(vae.decode(z).sample)
        reads = [detect(np.repeat(o, 2, 0))["colour"] for o in out]  # a frame twice: the detector wants 2+
        std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
        far = ((z - z0).abs() / std).amax((0, 2, 3, 4))
        print(f"inverted first frames read {reads.count('purple')}/{len(reads)} purple: {reads}; largest move per "
              f"channel {(z - z0).abs().amax((0, 2, 3, 4)).numpy().round(1).tolist()} "
              f"= {far.numpy().round(0).tolist()} x the latents' std")


if __name__ == "__main__":
    main()
