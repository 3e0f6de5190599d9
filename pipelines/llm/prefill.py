"""Chunked prefill: prompts enter the KV cache a bounded number of tokens per step.

Each engine step computes, beside one token of every decoding sequence, at most `budget`
prompt tokens. So a long prompt, or a burst of new ones, delays the running sequences' next
token by one budget's worth of compute at most, never by whole prompts. When at least as many
prompts wait as sequences decode, the step takes up to BURST budgets instead, so that a burst
of requests starts decoding together rather than one budget at a time. Prompts go in arrival
order, packed end to end in the step's row; the last one may be cut, and continues from its
cached part at the next step. A prompt whose cached prefix another sequence has just finished
computing takes those blocks rather than computing them again (blocks.py `extend_prefix`), and
one whose next block a prompt ahead of it is computing waits for it rather than compute it too:
a burst of prompts with one system prompt computes it once.

A sequence recomputed after preemption comes through here too, its answer so far with its
prompt: its last token's logits give its next token, as a decode step's would.
"""

from __future__ import annotations

from collections import deque

import torch

from vidserve.errors import InvalidRequest

from .blocks import BlockPool
from .sequence import Piece, Sequence

# Budgets in a burst step. Packed in one row, prompts share the matrix multiplies while each
# attends only to itself: a row's attention grows with its prompts' own lengths, not the row's.
BURST = 8


class PackedPrefill:
    def __init__(self, blocks: BlockPool, budget: int):
        if budget < 1:
            raise ValueError(f"the prefill budget must be at least 1 token, got {budget}")
        self.blocks, self.budget = blocks, budget
        self.queue: deque[Sequence] = deque()  # admitted, tokens not yet all cached
        self.features: dict[int, dict[int, torch.Tensor]] = {}  # seq id -> image index -> features

    def __len__(self) -> int:
        return len(self.queue)

    def add(self, seq: Sequence, features: dict[int, torch.Tensor]) -> None:
        """Queue a sequence with the features of its images still to prefill (encoding.py); a
        prompt whose features do not fit its placeholders fails here, alone."""
        for i, tensor in features.items():
            span = seq.prompt.image_spans[i]
            if tensor.shape[0] != span.stop - span.start:
                raise InvalidRequest(f"image {i + 1} gave {tensor.shape[0]} features for {span.stop - span.start} "
                                     "image placeholders in the prompt", param="messages")
        self.features[seq.id] = features
        self.queue.append(seq)

    def discard(self, seqs: list[Sequence]) -> None:
        """Forget these sequences (finished, aborted, failed or preempted)."""
        gone = {s.id for s in seqs}
        self.queue = deque(s for s in self.queue if s.id not in gone)
        for seq_id in gone:
            self.features.pop(seq_id, None)

    def plan(self, decoding: int) -> list[Piece]:
        """This step's pieces: queued prompts in order, up to `budget` tokens (BURST budgets when
        no more sequences are `decoding` than prompts are queued)."""
        room = self.budget * (BURST if len(self.queue) >= decoding else 1)
        pieces, coming = [], set()  # the prefix keys of blocks that prompts ahead are computing
        for seq in self.queue:
            self.blocks.extend_prefix(seq)
            keys = self.blocks.upcoming_keys(seq)
            if keys and keys[0] in coming and seq.computed % self.blocks.block_size == 0:
                continue  # a prompt ahead computes the same next block: wait, and take it from the cache
            coming.update(keys)
            take = min(seq.num_tokens - seq.computed, room)
            pieces.append(Piece(seq, seq.computed, seq.computed + take))
            room -= take
            if room == 0:
                break
        return pieces
