"""The synthetic attention families have the structure each is named for, and the default
sparse attention holds on every one of them, not only the family it was first tuned on."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from vidserve.kernels import dense_attention, sparse_attention
from vidserve.kernels.synthetic import FAMILIES, family_qkv, motion_qkv, positional_qkv, sinks_qkv

GRID = (8, 16, 16)  # L = 2048: small enough for dense attention in a test, large enough to tile
HEADS, HEAD_DIM = 4, 64


def weights(q: torch.Tensor, k: torch.Tensor, head: int) -> torch.Tensor:
    """[L, L] attention weights of one head."""
    return torch.softmax(q[0, head] @ k[0, head].T / math.sqrt(q.shape[-1]), dim=-1)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_is_a_seeded_draw_of_the_documented_shape(family):
    q, k, v = family_qkv(family, 1, HEADS, GRID, HEAD_DIM, seed=3)
    assert q.shape == k.shape == v.shape == (1, HEADS, math.prod(GRID), HEAD_DIM)
    assert torch.equal(q, family_qkv(family, 1, HEADS, GRID, HEAD_DIM, seed=3)[0])
    assert not torch.equal(q, family_qkv(family, 1, HEADS, GRID, HEAD_DIM, seed=4)[0])


def test_positional_heads_are_alike_and_video_like_heads_are_not():
    def head_correlation(q):
        return F.cosine_similarity(q[0, 0].flatten(), q[0, 1].flatten(), dim=0).item()

    assert head_correlation(positional_qkv(1, 2, GRID, HEAD_DIM)[0]) > 0.6
    assert abs(head_correlation(family_qkv("video_like", 1, 2, GRID, HEAD_DIM)[0])) < 0.1


def test_in_motion_a_querys_attention_in_the_next_frame_has_moved():
    frames, height, width = GRID
    plane = height * width
    ys, xs = torch.arange(plane) // width, torch.arange(plane) % width
    central = ((ys - height // 2).abs() < 4) & ((xs - width // 2).abs() < 4)

    def mean_step(q, k, head):
        """Tokens from a central query to the attention-weighted mean position of its keys in
        the next frame, averaged over frames: a pan moves them all one way; noise scatters
        them around no step at all."""
        w = weights(q, k, head)
        steps = []
        for t in range(1, frames - 1):
            nxt = w[t * plane:(t + 1) * plane, (t + 1) * plane:(t + 2) * plane][central]
            nxt = nxt / nxt.sum(-1, keepdim=True)
            dy = (nxt * (ys[None] - ys[central][:, None])).sum(-1).mean().item()
            dx = (nxt * (xs[None] - xs[central][:, None])).sum(-1).mean().item()
            steps.append(math.hypot(dy, dx))
        return sum(steps) / len(steps)

    q, k, _ = motion_qkv(1, 2, GRID, HEAD_DIM, speed=(1.5, 2.0))
    still_q, still_k, _ = family_qkv("video_like", 1, 2, GRID, HEAD_DIM)
    assert all(mean_step(q, k, head) > 1.0 for head in range(2))
    assert all(mean_step(still_q, still_k, head) < 0.7 for head in range(2))


def test_sink_tokens_take_a_large_share_of_every_querys_attention():
    q, k, _ = sinks_qkv(1, 2, GRID, HEAD_DIM, sinks=16)
    plain_q, plain_k, _ = family_qkv("video_like", 1, 2, GRID, HEAD_DIM)
    for head in range(2):
        w = weights(q, k, head)
        top16 = w.mean(0).topk(16).values.sum().item()  # the share the 16 most attended tokens hold
        assert top16 > 0.2
        assert weights(plain_q, plain_k, head).mean(0).topk(16).values.sum().item() < 0.05


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_default_selection_is_no_worse_than_top_k_on_any_family(family):
    """At the same density, on two draws: the benchmark's acceptance bound (benchmarks/attention.py
    --sweep holds the figures at L 8192 and 16384)."""
    for seed in range(2):
        q, k, v = family_qkv(family, 1, HEADS, GRID, HEAD_DIM, seed=seed)
        dense = dense_attention(q, k, v)
        default = cosine(sparse_attention(q, k, v, GRID), dense)
        topk = cosine(sparse_attention(q, k, v, GRID, selection="topk"), dense)
        assert default >= topk - 0.002, (seed, default, topk)
