"""Attention kernels for video DiTs: dense attention and top-k block-sparse attention
over 3D token tiles (Triton on CUDA, a PyTorch path on CPU, a masked-dense reference)."""

from .dense import dense_attention
from .dispatch import sparse_attention

__all__ = ["dense_attention", "sparse_attention"]
