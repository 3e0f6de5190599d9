"""The KV cache's memory: per decoder layer, keys and values for a pool of fixed-size blocks,
allocated once at start. blocks.py decides which blocks hold what.

Its size is a token budget (`VIDSERVE_CHAT_KV_TOKENS`); by default the smaller of what
`max_running` sequences at full context would use and half the memory free at start (the
device's on CUDA, the host's otherwise).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psutil
import torch

if TYPE_CHECKING:
    from .model import ChatModel

log = logging.getLogger("vidserve.chat")

BLOCK_SIZE = 16  # tokens per block: the unit of sharing, and of padding in a decode step's attention
FREE_MEMORY_SHARE = 0.5


class KVCache:
    def __init__(self, model: ChatModel, tokens: int, block_size: int = BLOCK_SIZE):
        config = model.text_config
        self.block_size = block_size
        self.num_blocks = max(1, tokens // block_size)
        self.kv_heads, self.head_dim = kv_shape(config)
        shape = (self.num_blocks, block_size, self.kv_heads, self.head_dim)
        dtype = model.model.dtype
        self.keys = [torch.zeros(shape, dtype=dtype, device=model.device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=model.device) for _ in range(config.num_hidden_layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values)


def kv_shape(config) -> tuple[int, int]:
    """(KV heads, head dim) of a decoder config."""
    heads = config.num_attention_heads
    return (getattr(config, "num_key_value_heads", None) or heads,
            getattr(config, "head_dim", None) or config.hidden_size // heads)


def bytes_per_token(model: ChatModel) -> int:
    config = model.text_config
    kv_heads, head_dim = kv_shape(config)
    return 2 * config.num_hidden_layers * kv_heads * head_dim * model.model.dtype.itemsize


def kv_budget(model: ChatModel, max_running: int, configured: int | None) -> int:
    """The budget: `configured`, or the default from free memory; logged either way."""
    per_token = bytes_per_token(model)
    if configured is not None:
        tokens, why = configured, "VIDSERVE_CHAT_KV_TOKENS"
    else:
        free = _free_bytes(model.device)
        tokens = min(max_running * model.max_context, int(free * FREE_MEMORY_SHARE) // per_token)
        why = (f"the smaller of {max_running} full contexts and {FREE_MEMORY_SHARE:.0%} of "
               f"{free / 2**30:.1f} GiB free")
    tokens -= tokens % BLOCK_SIZE
    log.info("chat KV cache: %d tokens in %d blocks of %d, %.0f MiB (%s)", tokens, tokens // BLOCK_SIZE, BLOCK_SIZE,
             tokens * per_token / 2**20, why)
    return max(tokens, BLOCK_SIZE)


def _free_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available
