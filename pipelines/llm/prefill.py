"""Chunked, packed prefill: prompts enter the KV cache a bounded number of tokens per step.

Each engine step runs at most one prefill forward pass beside its decode step, of one row
of at most `budget` prompt tokens. So a long prompt, or a burst of new ones, delays the
running sequences' next token by one budget's worth of compute at most, never by whole
prompts. When at least as many prompts wait as sequences decode, the pass takes up to
BURST_ROWS rows instead: it delays few to start many, so a burst of prompts is prefilled
at once and decodes in full batches (and with nothing decoding, nothing is delayed).

Prompts are packed into a row end to end: a block-diagonal causal mask keeps each to its
own tokens, and each token gets its own prompt's position. Rows are short (the budget), so
the mask costs little attention, while a whole pass gives the matmuls many tokens at once;
only the ends of rows are padding. A prompt that fits no row whole is cut where the pass
ends: its cached part waits, and the next pass starts with its remaining tokens (the mask
lets them see the part already cached). So at most one sequence is ever part-prefilled,
and every prompt token is computed exactly once.

A prompt whose last token is in the pass is done: its logits there give its first token,
and its slice of the pass's cache joins the running batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from .model import ChatModel
from .sequence import Sequence

# Rows in a burst pass. A pass of several 256-token rows prefills faster per token than one row
# of 256 or one long packed row, whose attention grows with the square of its length (measured
# in benchmarks/RESULTS.md, "Chat: continuous batching vs sequential generate").
BURST_ROWS = 8

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [1, kv heads, tokens, head dim]


@dataclass(frozen=True)
class Piece:
    """Prompt tokens [start, stop) of one sequence, in one pass: in `row`, from column `at`."""

    seq: Sequence
    start: int
    stop: int
    row: int
    at: int

    @property
    def end(self) -> int:
        """The row column after its last token."""
        return self.at + self.stop - self.start

    @property
    def done(self) -> bool:
        return self.stop == self.seq.prompt_len


class PackedPrefill:
    def __init__(self, model: ChatModel, budget: int):
        if budget < 1:
            raise ValueError(f"the prefill budget must be at least 1 token, got {budget}")
        self.model, self.budget = model, budget
        self.queue: deque[Sequence] = deque()  # admitted, prompt not fully cached; only [0] may be cut
        self._embeds: dict[int, torch.Tensor] = {}  # seq id -> [prompt tokens, hidden]
        self._cut: tuple[int, DynamicCache] | None = None  # queue[0]'s cached tokens and their cache

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, seq: Sequence, features: list[torch.Tensor] | None = None) -> None:
        """Queue a sequence, with its images' features (encoding.py) if it has images; its
        embeddings are computed now, so a prompt the model cannot take fails here, alone."""
        self._embeds[seq.id] = self.model.prompt_embeddings(seq.prompt, features)
        self.queue.append(seq)

    def discard(self, seqs: list[Sequence]) -> None:
        """Forget these sequences (aborted, or failed with their pass)."""
        gone = {s.id for s in seqs}
        if self.queue and self.queue[0].id in gone:
            self._cut = None
        self.queue = deque(s for s in self.queue if s.id not in gone)
        for seq_id in gone:
            self._embeds.pop(seq_id, None)

    def plan(self, decoding: int) -> list[Piece]:
        """The next pass: queued prompts in order, the cut one first, in one row (or, with
        no more sequences `decoding` than prompts queued, BURST_ROWS rows) of at most
        `budget` tokens each."""
        rows = BURST_ROWS if len(self.queue) >= decoding else 1
        pieces, row, used = [], 0, 0
        for i, seq in enumerate(self.queue):
            start = self._cut[0] if self._cut is not None and i == 0 else 0
            need = seq.prompt_len - start
            if used and used + need > self.budget and row + 1 < rows:
                row, used = row + 1, 0  # a fresh row rather than a cut
            take = min(need, self.budget - used)
            if take == 0:
                break
            pieces.append(Piece(seq, start, start + take, row, used))
            used += take
            if take < need:  # cut: its rest needs these tokens' cache, so it ends the pass
                break
        return pieces

    @torch.inference_mode()
    def run(self, pieces: list[Piece]) -> tuple[list[Sequence], torch.Tensor, list[KV]]:
        """One forward pass: the finished prompts, their last-token logits [n, vocab] and
        their caches, in queue order."""
        cached = pieces[0].start  # only the first piece (row 0, column 0) can continue a cut prompt
        rows, width = pieces[-1].row + 1, max(p.end for p in pieces)
        cache = self._past(rows) if cached else DynamicCache()
        sample = self._embeds[pieces[0].seq.id]
        embeds = sample.new_zeros(rows, width, sample.shape[-1])  # padding slots stay zero
        for p in pieces:
            embeds[p.row, p.at:p.end] = self._embeds[p.seq.id][p.start:p.stop]
        done = [p for p in pieces if p.done]
        logits_at = (torch.tensor([p.row for p in done], dtype=torch.long),
                     torch.tensor([p.end - 1 for p in done], dtype=torch.long))
        logits = self.model.forward(cache, self._mask(pieces, rows, width, cached), self._positions(pieces, rows, width),
                                    inputs_embeds=embeds, logits_at=logits_at)

        layers = [(layer.keys, layer.values) for layer in cache.layers]
        finished, caches = [], []
        for p in pieces:
            first = 0 if p is pieces[0] else cached + p.at  # the first piece with its cached part
            kv = [(k[p.row:p.row + 1, :, first:cached + p.end], v[p.row:p.row + 1, :, first:cached + p.end])
                  for k, v in layers]
            if p.done:
                finished.append(p.seq)
                caches.append(kv)
            else:  # the pass ended inside this prompt: it goes first next time
                self._cut = (p.stop, DynamicCache(ddp_cache_data=kv))
        if pieces[-1].done:
            self._cut = None
        for seq in finished:
            self.queue.popleft()
            del self._embeds[seq.id]
        return finished, logits, caches

    def _past(self, rows: int) -> DynamicCache:
        """The cut prompt's cache, as row 0 of `rows` (the other rows' part is masked out)."""
        return DynamicCache(ddp_cache_data=[
            (F.pad(layer.keys, (0, 0, 0, 0, 0, 0, 0, rows - 1)), F.pad(layer.values, (0, 0, 0, 0, 0, 0, 0, rows - 1)))
            for layer in self._cut[1].layers])

    def _mask(self, pieces: list[Piece], rows: int, width: int, cached: int) -> torch.Tensor:
        """[rows, 1, width, cached + width] bool: a token sees the earlier tokens of its own
        prompt (a padding slot only itself, so that no row of the softmax is empty)."""
        owner = torch.full((rows, width), -1)
        for i, p in enumerate(pieces):
            owner[p.row, p.at:p.end] = i
        past = torch.full((rows, cached), -2)
        past[0] = 0  # the cached part is the first piece's
        key_owner = torch.cat([past, owner], dim=1)
        keys, queries = torch.arange(cached + width), cached + torch.arange(width)
        same = (owner[:, :, None] == key_owner[:, None, :]) & (keys[None, None] <= queries[None, :, None])
        mask = same | ((owner[:, :, None] == -1) & (keys[None, None] == queries[None, :, None]))
        return mask[:, None].to(self.model.device)

    def _positions(self, pieces: list[Piece], rows: int, width: int) -> torch.Tensor:
        """[rows, width] positions, each prompt's own; [3, rows, width] for M-RoPE models."""
        positions = torch.zeros(3 if self.model.mrope else 1, rows, width, dtype=torch.long, device=self.model.device)
        for p in pieces:
            if self.model.mrope:
                positions[:, p.row, p.at:p.end] = self.model.rope_positions(p.seq.prompt)[:, p.start:p.stop]
            else:
                positions[0, p.row, p.at:p.end] = torch.arange(p.start, p.stop)
        return positions if self.model.mrope else positions[0]
