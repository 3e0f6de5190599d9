"""One engine step's forward pass: a single row of tokens, one per decoding sequence followed
by the prompt pieces being prefilled, with their embeddings (image features at the image
placeholders), positions (each sequence its own; M-RoPE's three rows for Qwen2-VL), the KV
slots they write, what their attention reads (paged_attention.py), and where logits are wanted.

Sequences share the step's matrix multiplies and nothing else: each token's position and
attention are its own sequence's, so a seeded answer is the same whatever it runs beside.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .kv_cache import KVCache
from .model import ChatModel
from .paged_attention import PagedStep
from .sequence import Piece, Sequence

# Shared blocks worth a cascade: below this, reading them with each sequence's own costs less than
# the second attention call (benchmarks/RESULTS.md, "Chat: paged attention on CPU").
CASCADE_BLOCKS = 8


@dataclass(frozen=True)
class StepInputs:
    embeds: torch.Tensor  # [1, tokens, hidden]
    positions: torch.Tensor  # [1, tokens], or [3, 1, tokens] for M-RoPE
    step: PagedStep
    logits_at: torch.Tensor  # columns: every decoding token's, then each finished piece's last


def build_step(model: ChatModel, cache: KVCache, decoding: list[Sequence], pieces: list[Piece],
               features: dict[int, dict[int, torch.Tensor]], cascade: bool = False) -> StepInputs:
    """`features`: per sequence id, the image features its pieces need, by image index; `cascade`:
    decoding sequences that begin with the same blocks read them once (paged_attention.py)."""
    device, size = model.device, cache.block_size
    row = [Piece(seq, seq.computed, seq.computed + 1) for seq in decoding] + pieces
    ids = [token for p in row for token in p.seq.token_ids(p.start, p.stop)]
    embeds = model.embed(ids)
    prefill, at = [], len(decoding)
    for p in pieces:
        prefill.append(_laid_out(p, at, size, device))
        at += p.length
    for p in prefill:
        _place_images(embeds[p.at:p.at + p.length], p, features.get(p.seq.id, {}))

    positions = torch.cat([_positions(model, p) for p in row], dim=-1)
    slots = torch.cat([_slots(p, size) for p in row]).to(device)
    decode_blocks = decode_mask = shared = None
    if decoding:
        first = _shared_blocks(decoding, size) if cascade else 0
        if first:
            shared = torch.tensor(decoding[0].block_table[:first], device=device)
        lengths = torch.tensor([s.computed + 1 - first * size for s in decoding])
        most = -(-int(lengths.max()) // size)
        decode_blocks = torch.tensor([_padded(s.block_table[first:first + most], most) for s in decoding],
                                     device=device)
        decode_mask = (torch.arange(most * size)[None] < lengths[:, None])[:, None, None].to(device)
        if first:  # the log-sum-exp kernel takes an additive mask of the query's dtype
            dtype = cache.keys[0].dtype
            decode_mask = torch.zeros(decode_mask.shape, dtype=dtype, device=device).masked_fill_(
                ~decode_mask, float("-inf"))
    logits_at = list(range(len(decoding))) + [p.at + p.length - 1 for p in prefill if p.done]
    step = PagedStep(cache, slots, len(decoding), decode_blocks, decode_mask, tuple(prefill), shared)
    return StepInputs(embeds[None], positions.unsqueeze(-2).to(device), step,
                      torch.tensor(logits_at, dtype=torch.long, device=device))


def _shared_blocks(decoding: list[Sequence], size: int) -> int:
    """How many blocks all decoding sequences begin with (0 below CASCADE_BLOCKS, or for one)."""
    if len(decoding) < 2:
        return 0
    tables = [s.block_table for s in decoding]
    limit = min(s.computed // size for s in decoding)  # full before this step's token, never written again
    shared = 0
    while shared < limit and all(t[shared] == tables[0][shared] for t in tables):
        shared += 1
    return shared if shared >= CASCADE_BLOCKS else 0


def _padded(blocks: list[int], length: int) -> list[int]:
    return blocks + [0] * (length - len(blocks))  # block 0 stands in: masked


def _place_images(embeds: torch.Tensor, p: Piece, features: dict[int, torch.Tensor]) -> None:
    """Image features replace the placeholders of the piece's images, one for one."""
    for i, span in enumerate(p.seq.prompt.image_spans):
        first, last = max(span.start, p.start), min(span.stop, p.stop)
        if first < last:
            embeds[first - p.start:last - p.start] = features[i][first - span.start:last - span.start]


def _positions(model: ChatModel, p: Piece) -> torch.Tensor:
    """[tokens], or [3, tokens] for M-RoPE: a prompt's own positions, then (generated tokens)
    the token's index plus the prompt's rope delta in all three rows."""
    if not model.mrope:
        return torch.arange(p.start, p.stop)
    prompt_len, parts = p.seq.prompt_len, []
    if p.start < prompt_len:
        parts.append(model.rope_positions(p.seq.prompt)[:, p.start:min(p.stop, prompt_len)].cpu())
    if p.stop > prompt_len:
        generated = torch.arange(max(p.start, prompt_len), p.stop) + p.seq.prompt.rope_delta
        parts.append(generated.expand(3, -1))
    return torch.cat(parts, dim=-1)


def _slots(p: Piece, size: int) -> torch.Tensor:
    index = torch.arange(p.start, p.stop)
    return torch.tensor(p.seq.block_table)[index // size] * size + index % size


def _laid_out(p: Piece, column: int, size: int, device) -> Piece:
    """A prompt piece at its column of the row, with the blocks and mask of its past if it has one."""
    if p.start == 0:
        return replace(p, at=column)
    blocks = torch.tensor(p.seq.block_table[:-(-p.stop // size)], device=device)
    mask = torch.arange(p.stop)[None] <= (p.start + torch.arange(p.length))[:, None]  # its past, itself, not after
    return replace(p, at=column, blocks=blocks, mask=mask.to(device))
