"""Synthetic q/k/v with video-like locality, for tests and benchmarks.

Random q/k make attention almost uniform, which says nothing about a sparse method: every
key matters a little and none matters much. Video tokens are different: nearby tokens in
space and time look alike, so their queries and keys are alike and attention
concentrates on a neighbourhood (and on far tokens that happen to look similar).

This builds that: per head, a smooth random field over the (F, H, W) grid (white noise
low-passed with a Gaussian of `correlation` tokens per axis) is shared by q and k, each
adding its own white noise; v is an independent smooth field plus noise. `peak_logit` is
the expected score q·k/√d of a token with itself, i.e. how peaked the softmax is; it is
independent of head_dim. At the defaults with head_dim 128, the best 12.5% of 4x4x4 key
tiles hold on average 94%, 91% and 86% of a query's attention on 4x32x32, 8x32x32 and
16x32x32 grids, and 79% on the 21x30x52 Wan grid: attention spreads as L grows, because
far tokens that look alike by chance add up.
"""

from __future__ import annotations

import math

import torch


def smooth_field(shape: tuple[int, ...], grid: tuple[int, int, int], correlation, generator) -> torch.Tensor:
    """Unit-variance Gaussian random field [*shape, F*H*W] with a Gaussian correlation of
    `correlation` tokens per axis (no wrap-around: filtered on a padded grid, then cropped)."""
    pad = [math.ceil(3 * c) for c in correlation]
    padded = [g + 2 * p for g, p in zip(grid, pad)]
    noise = torch.randn(*shape, *padded, generator=generator)
    spectrum = torch.fft.rfftn(noise, dim=(-3, -2, -1))
    freqs = [torch.fft.fftfreq(n) for n in padded[:2]] + [torch.fft.rfftfreq(padded[2])]
    gain = 1.0
    for axis, (f, c) in enumerate(zip(freqs, correlation)):
        view = [1, 1, 1]
        view[axis] = -1
        gain = gain * torch.exp(-2 * (math.pi * c * f) ** 2).view(view)
    field = torch.fft.irfftn(spectrum * gain, s=padded, dim=(-3, -2, -1))
    field = field[..., pad[0] : pad[0] + grid[0], pad[1] : pad[1] + grid[1], pad[2] : pad[2] + grid[2]]
    field = field.reshape(*shape, -1)
    return (field - field.mean(-1, keepdim=True)) / field.std(-1, keepdim=True)


def video_like_qkv(
    batch: int,
    heads: int,
    grid: tuple[int, int, int],
    head_dim: int,
    *,
    correlation: tuple[float, float, float] = (1.5, 3.0, 3.0),
    noise: float = 0.5,
    peak_logit: float = 8.0,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [batch, heads, F*H*W, head_dim] with attention local in space and time."""
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, heads, head_dim)

    def channels_last(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-1, -2).contiguous()

    scale = (peak_logit / math.sqrt(head_dim)) ** 0.5
    shared = smooth_field(shape, grid, correlation, generator)
    n = shared.shape[-1]
    q = scale * (shared + noise * torch.randn(*shape, n, generator=generator))
    k = scale * (shared + noise * torch.randn(*shape, n, generator=generator))
    v = smooth_field(shape, grid, correlation, generator) + noise * torch.randn(*shape, n, generator=generator)
    return tuple(channels_last(x).to(dtype) for x in (q, k, v))
