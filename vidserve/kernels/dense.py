"""Dense attention: xformers on CUDA when it is installed, PyTorch SDPA otherwise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

try:
    import xformers.ops as xformers_ops
except ImportError:  # xformers is optional and CUDA-only here
    xformers_ops = None


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Softmax attention over all keys; q, k, v [B, heads, L, d] -> [B, heads, L, d]."""
    if xformers_ops is not None and q.is_cuda:
        # xformers takes [B, L, heads, d].
        out = xformers_ops.memory_efficient_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v)
