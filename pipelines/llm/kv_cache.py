"""The KV cache's memory: per decoder layer, keys and values for a pool of fixed-size blocks,
allocated once at start. blocks.py decides which blocks hold what.

Its size is a token budget (`VIDSERVE_CHAT_KV_TOKENS`); by default the smaller of what
`max_running` sequences at full context would use and half the memory free at start (the
device's on CUDA, the host's otherwise).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psutil
import torch

log = logging.getLogger("vidserve.chat")

BLOCK_SIZE = 16  # tokens per block: the unit of sharing, and of padding in a decode step's attention
FREE_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class KVShape:
    """What one token's keys and values are: per decoder layer, KV heads of head_dim, in a dtype
    (`ChatModel.kv_shape`)."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, config, dtype: torch.dtype) -> KVShape:
        """From a decoder config."""
        heads = config.num_attention_heads
        return cls(config.num_hidden_layers, getattr(config, "num_key_value_heads", None) or heads,
                   getattr(config, "head_dim", None) or config.hidden_size // heads, dtype)

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize


class KVCache:
    def __init__(self, shape: KVShape, tokens: int, device: torch.device, block_size: int = BLOCK_SIZE):
        self.block_size = block_size
        self.num_blocks = max(1, tokens // block_size)
        pool = (self.num_blocks, block_size, shape.kv_heads, shape.head_dim)
        self.keys = [torch.zeros(pool, dtype=shape.dtype, device=device) for _ in range(shape.layers)]
        self.values = [torch.zeros(pool, dtype=shape.dtype, device=device) for _ in range(shape.layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values)


def kv_budget(shape: KVShape, device: torch.device, max_context: int, max_running: int, configured: int | None
              ) -> int:
    """The budget: `configured`, or the default from free memory; logged either way."""
    per_token = shape.bytes_per_token
    if configured is not None:
        tokens, why = configured, "VIDSERVE_CHAT_KV_TOKENS"
    else:
        free = _free_bytes(device)
        tokens = min(max_running * max_context, int(free * FREE_MEMORY_SHARE) // per_token)
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
