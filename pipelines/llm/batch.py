"""The running batch: the KV cache of every running sequence, left-padded to one length.

Continuous batching on an ordinary transformers model: sequences join between decode
steps (each prompt's cache is padded on the left and concatenated) and leave between
steps (their rows are dropped, and columns that became all padding are trimmed). The
attention mask hides the padding; each row's position ids count only its real tokens,
so a sequence computes the same thing whatever it is batched with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from .sequence import Sequence


class RunningBatch:
    def __init__(self) -> None:
        self.seqs: list[Sequence] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [batch, cached length], 1 = real token

    def __len__(self) -> int:
        return len(self.seqs)

    def join(self, seqs: list[Sequence], caches: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
        """Add sequences, each with its prompt's cache (per layer: keys, values [1, heads, tokens, d])."""
        if not seqs:
            return
        parts = ([[(layer.keys, layer.values) for layer in self.cache.layers]] if self.seqs else []) + caches
        masks = ([self.mask] if self.seqs else []) + [
            torch.ones(1, kv[0][0].shape[2], dtype=torch.long, device=kv[0][0].device) for kv in caches]
        length = max(m.shape[1] for m in masks)
        self.cache = DynamicCache(ddp_cache_data=[
            (torch.cat([_pad_left(part[i][0], length) for part in parts]),
             torch.cat([_pad_left(part[i][1], length) for part in parts]))
            for i in range(len(parts[0]))
        ])
        self.mask = torch.cat([_pad_left(m, length) for m in masks])
        self.seqs += seqs

    def keep(self, rows: list[int]) -> None:
        """Keep these rows (in order); drop the rest and the padding only they needed."""
        if len(rows) == len(self.seqs):
            return
        self.seqs = [self.seqs[i] for i in rows]
        if not rows:
            self.cache = self.mask = None
            return
        index = torch.tensor(rows, device=self.mask.device)
        self.mask = self.mask[index]
        start = int(self.mask.any(0).to(torch.int8).argmax())  # first column someone still uses
        self.mask = self.mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[index, :, start:]
            layer.values = layer.values[index, :, start:]

    def decode_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids [B,1], attention_mask [B,L+1], position_ids [B,1]) for the next step."""
        device = self.mask.device
        ids = torch.tensor([[s.last_token] for s in self.seqs], device=device)
        positions = self.mask.sum(1, keepdim=True)
        self.mask = torch.cat([self.mask, torch.ones_like(positions)], dim=1)
        return ids, self.mask, positions


def _pad_left(t: torch.Tensor, length: int) -> torch.Tensor:
    """Pad dim 2 of a [B,H,L,D] cache tensor (or dim 1 of a [B,L] mask) on the left with zeros."""
    missing = length - (t.shape[2] if t.dim() == 4 else t.shape[1])
    if missing == 0:
        return t
    pad = (0, 0, missing, 0) if t.dim() == 4 else (missing, 0)
    return F.pad(t, pad)
