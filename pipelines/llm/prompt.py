"""A prompt as the engine runs it: its token ids, its images and where their placeholders are,
and, for M-RoPE models, its positions (`ChatModel.encode` makes one)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from vidserve.chat import ChatImage

from .prefix import ImageSpan


@dataclass
class Prompt:
    token_ids: list[int]
    images: list[ChatImage] = field(default_factory=list)
    # M-RoPE models only. An image's tokens take (t, h, w) grid positions, so the text
    # after it continues from the grid's largest position + 1, not from its token count:
    # `positions` are the prompt's [3, tokens] (None: a text-only prompt, 0..n-1 in all
    # three rows), and the position of generated token i is prompt tokens + i + `rope_delta`.
    positions: torch.Tensor | None = None
    rope_delta: int = 0
    image_spans: list[ImageSpan] = field(default_factory=list)  # each image's placeholders, in order
