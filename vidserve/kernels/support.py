"""The tile shapes the Triton kernel supports on a GPU, and how each is launched.

The kernel pads a query tile, a key tile and the head dimension to blocks (powers of two,
at least 16: what `tl.dot` needs). Shared memory grows with every block and with the
pipeline depth (`num_stages` K/V buffers), registers with the query and head blocks, so
past some size a tile compiles to a kernel that spills or that a GPU refuses to launch
(more shared memory than a block may have). The interpreter runs any size, so the limits
come from compiling for sm_90 and sm_80 on a CPU: tests/test_triton_sm90.py compiles
every row below and fails when one no longer fits; `python -m vidserve.kernels.resources`
prints the figures.

A launch is supported when its blocks are each at most those of a row of its dtype: a
smaller block needs less shared memory than the row that bounds it, so the row's pipeline
depth fits it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vidserve.options import MAX_TILE_TOKENS

Triple = tuple[int, int, int]


@dataclass(frozen=True)
class Supported:
    query_block: int  # query rows per program
    key_block: int  # key rows per loaded K/V tile
    head_block: int  # padded head dimension
    dtype: torch.dtype
    # K/V buffers: 3 keeps two key tiles in flight while one is computed on. Deeper fits
    # sm_90 too, but the lists are short (tens of tiles) and each stage costs shared memory.
    num_stages: int


SUPPORTED = (
    # Production (Wan: 4x8x4 query tiles, 4x4x4 key tiles, head_dim 128).
    Supported(2 * MAX_TILE_TOKENS, MAX_TILE_TOKENS, 128, torch.bfloat16, 3),
    Supported(2 * MAX_TILE_TOKENS, MAX_TILE_TOKENS, 128, torch.float16, 3),
    # No fp32 row: IEEE fp32 dots (kept so fp32 matches the reference) do not use tensor cores
    # and spill at every size measured, down to 64/32 tokens at head_dim 64 (208 B on sm_90).
)


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int


class UnsupportedTile(ValueError):
    pass


def block(n: int) -> int:
    """The block a size is padded to: a power of two, at least 16."""
    return max(16, 1 << (n - 1).bit_length())


def launch_config(query_rows: int, key_rows: int, head_dim: int, dtype: torch.dtype) -> LaunchConfig:
    """How to launch the kernel for these sizes on a GPU; UnsupportedTile if no row covers them."""
    block_m, block_n, block_d = block(query_rows), block(key_rows), block(head_dim)
    for row in SUPPORTED:
        if row.dtype == dtype and block_m <= row.query_block and block_n <= row.key_block and block_d <= row.head_block:
            # 8 warps once the fp32 accumulator (block_m x block_d) would take over 64 registers a thread.
            num_warps = 4 if block_m * block_d <= 64 * 128 else 8
            return LaunchConfig(block_m, block_n, block_d, num_warps, row.num_stages)
    raise UnsupportedTile(
        f"{query_rows}-token query tiles with {key_rows}-token key tiles at head_dim {head_dim} in "
        f"{str(dtype).removeprefix('torch.')} are not supported by the Triton kernel: at most "
        + ", ".join(f"{r.query_block}/{r.key_block} tokens at head_dim {r.head_block} in "
                    f"{str(r.dtype).removeprefix('torch.')}" for r in SUPPORTED))


def tile_problem(query_tile: Triple, key_tile: Triple, head_dim: int = 128,
                 dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)) -> str | None:
    """Why these tiles cannot run on a GPU at `head_dim` in any of `dtypes` (the served models'),
    or None when they can."""
    for dtype in dtypes:
        try:
            launch_config(math.prod(query_tile), math.prod(key_tile), head_dim, dtype)
        except UnsupportedTile as exc:
            return str(exc)
    return None
