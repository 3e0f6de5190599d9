"""Sampling the next token of every running sequence from one batch of logits.

Temperature and top-p are applied per row; each sequence draws from its own seeded
generator, so a seeded request gets the same tokens whatever it is batched with.
"""

from __future__ import annotations

import torch

from .sequence import Sequence


def sample(logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
    """logits [B, V] float32 (already grammar-masked) -> one token id per sequence."""
    temperature = torch.tensor([s.params.temperature for s in seqs], device=logits.device)
    greedy = temperature == 0
    tokens = logits.argmax(dim=-1)
    if not bool(greedy.all()):
        probs = torch.softmax(logits / temperature.clamp_min(1e-5).unsqueeze(1), dim=-1)
        probs = _top_p(probs, torch.tensor([s.params.top_p for s in seqs], device=logits.device))
        for row, seq in enumerate(seqs):
            if not greedy[row]:
                tokens[row] = torch.multinomial(probs[row], 1, generator=seq.generator)[0]
    return tokens.tolist()


def _top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero the tail outside each row's nucleus (the smallest set with mass >= top_p)."""
    if bool((top_p >= 1).all()):
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p.unsqueeze(1)
    outside[:, 0] = False  # the likeliest token always stays, however small top_p (or its float32) is
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
