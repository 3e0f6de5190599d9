"""Synthetic q/k/v for tests and benchmarks: several families of structure, none privileged.

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

A sparse method tuned on one family can fail on another, so `FAMILIES` holds several, each
a different way attention concentrates (`family_qkv` draws from any of them):

- `video_like`: the smooth fields above.
- `positional`: sinusoids of each token's (f, h, w) position at random frequencies, shared
  by q and k plus noise, every head alike: the structure 3-D RoPE gives a video DiT, where
  attention falls on tokens at matching phases, near and far.
- `motion`: a smooth field panned over the frames (each head its own velocity), so a
  query's best keys in other frames sit where its content has moved.
- `sinks`: `video_like` plus a few global tokens every query attends to strongly.
- `mixed`: heads of the four above, in turn.

Tokens of real trained models are captured by `benchmarks/capture_attention.py`.
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


def _scaled(shared: torch.Tensor, noise: float, peak_logit: float, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k [*, head_dim, n]: a shared unit-variance signal plus each its own noise, scaled
    so that a token's expected score with itself, q·k/√d, is `peak_logit`."""
    head_dim = shared.shape[-2]
    scale = (peak_logit / math.sqrt(head_dim)) ** 0.5
    q = scale * (shared + noise * torch.randn(shared.shape, generator=generator))
    k = scale * (shared + noise * torch.randn(shared.shape, generator=generator))
    return q, k


def _values(shape, grid, generator, noise: float = 0.5) -> torch.Tensor:
    n = grid[0] * grid[1] * grid[2]
    return smooth_field(shape, grid, (1.5, 3.0, 3.0), generator) + noise * torch.randn(*shape, n, generator=generator)


def _out(q, k, v, dtype):
    return tuple(x.transpose(-1, -2).contiguous().to(dtype) for x in (q, k, v))


def positional_qkv(batch: int, heads: int, grid: tuple[int, int, int], head_dim: int, *, noise: float = 0.5,
                   peak_logit: float = 8.0, dtype: torch.dtype = torch.float32, seed: int = 0):
    """q, k, v [batch, heads, F*H*W, head_dim]: q and k are cos/sin of random linear phases of
    the token's (f, h, w), the same for every head. Frequencies are log-uniform between 1/16 and
    1 radian a token, each channel pair turning mostly with one axis, as RoPE's do: lower ones
    are near constant over a grid (a softmax ignores them), higher ones alias."""
    generator = torch.Generator().manual_seed(seed)
    f, h, w = torch.meshgrid(*(torch.arange(n, dtype=torch.float32) for n in grid), indexing="ij")
    position = torch.stack([f, h, w], -1).reshape(-1, 3)  # [n, 3]
    pairs = head_dim // 2
    magnitude = torch.exp(torch.empty(pairs, 3).uniform_(math.log(1 / 16), 0.0, generator=generator))
    frequencies = magnitude * torch.randn(pairs, 3, generator=generator).sign()
    axis = torch.arange(pairs) % 3
    frequencies = frequencies * (0.15 + 0.85 * torch.nn.functional.one_hot(axis, 3))
    phase = position @ frequencies.T + 2 * math.pi * torch.rand(pairs, generator=generator)  # [n, pairs]
    features = math.sqrt(2) * torch.cat([phase.cos(), phase.sin()], -1).T  # [head_dim, n], unit variance
    shared = features.expand(batch, heads, -1, -1)
    q, k = _scaled(shared, noise, peak_logit, generator)
    return _out(q, k, _values((batch, heads, head_dim), grid, generator), dtype)


def motion_qkv(batch: int, heads: int, grid: tuple[int, int, int], head_dim: int, *, noise: float = 0.5,
               peak_logit: float = 8.0, speed: tuple[float, float] = (0.5, 2.0), dtype: torch.dtype = torch.float32,
               seed: int = 0):
    """q, k, v [batch, heads, F*H*W, head_dim]: each head a smooth 2-D field panned over the
    frames at its own velocity (`speed` tokens a frame, in a random direction)."""
    generator = torch.Generator().manual_seed(seed)
    frames, height, width = grid
    reach = math.ceil(speed[1] * (frames - 1))
    canvas = (1, height + 2 * reach, width + 2 * reach)
    field = smooth_field((batch, heads, head_dim), canvas, (1.0, 3.0, 3.0), generator)
    field = field.view(batch, heads, head_dim, canvas[1], canvas[2])
    shared = torch.empty(batch, heads, head_dim, frames, height, width)
    for head in range(heads):
        angle = 2 * math.pi * torch.rand((), generator=generator).item()
        velocity = speed[0] + (speed[1] - speed[0]) * torch.rand((), generator=generator).item()
        for frame in range(frames):
            dy = reach + round(velocity * frame * math.sin(angle))
            dx = reach + round(velocity * frame * math.cos(angle))
            shared[:, head, :, frame] = field[:, head, :, dy:dy + height, dx:dx + width]
    q, k = _scaled(shared.flatten(-3), noise, peak_logit, generator)
    return _out(q, k, _values((batch, heads, head_dim), grid, generator), dtype)


def sinks_qkv(batch: int, heads: int, grid: tuple[int, int, int], head_dim: int, *, sinks: int = 16,
              sink_logit: float = 6.0, dtype: torch.dtype = torch.float32, seed: int = 0):
    """`video_like_qkv` plus, per head, `sinks` random global tokens that every query scores
    about `sink_logit` higher than it would: a few tokens take a large share of all attention."""
    q, k, v = video_like_qkv(batch, heads, grid, head_dim, seed=seed)
    generator = torch.Generator().manual_seed(seed + 1_000_003)
    direction = torch.randn(batch, heads, 1, head_dim, generator=generator)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    strength = (sink_logit * math.sqrt(head_dim)) ** 0.5
    chosen = torch.stack([torch.randperm(q.shape[2], generator=generator)[:sinks] for _ in range(heads)])
    q = q + strength * direction
    k = k.clone()
    for head in range(heads):
        k[:, head, chosen[head]] += strength * direction[:, head]
    return q.to(dtype), k.to(dtype), v.to(dtype)


def mixed_qkv(batch: int, heads: int, grid: tuple[int, int, int], head_dim: int, *,
              dtype: torch.dtype = torch.float32, seed: int = 0):
    """Heads of the other synthetic families in turn: video_like, positional, motion, sinks, ..."""
    kinds = [video_like_qkv, positional_qkv, motion_qkv, sinks_qkv]
    drawn = [make(batch, math.ceil((heads - i) / len(kinds)), grid, head_dim, seed=seed + i)
             for i, make in enumerate(kinds[:heads])]
    order = [(i % len(kinds), i // len(kinds)) for i in range(heads)]
    return tuple(torch.stack([drawn[kind][part][:, index] for kind, index in order], 1).to(dtype)
                 for part in range(3))


FAMILIES = {"video_like": video_like_qkv, "positional": positional_qkv, "motion": motion_qkv,
            "sinks": sinks_qkv, "mixed": mixed_qkv}


def family_qkv(family: str, batch: int, heads: int, grid: tuple[int, int, int], head_dim: int, *,
               dtype: torch.dtype = torch.float32, seed: int = 0):
    """q, k, v [batch, heads, F*H*W, head_dim] from the named family (see FAMILIES)."""
    return FAMILIES[family](batch, heads, grid, head_dim, dtype=dtype, seed=seed)
