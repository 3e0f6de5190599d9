"""Top-k key-tile selection: which key tiles each query tile attends to.

Every query tile scores every key tile with its mean-pooled q against the key tile's
mean-pooled k (q·kᵀ/√d) and keeps the best ones, plus tiles it always keeps: the key tiles
it overlaps (itself), its spatio-temporal neighbours, and optionally the first-frame
"sink" tiles. The result is a compact list of key-tile ids per query tile, not a mask.

Budget: the always-kept tiles count toward the budget. A query tile keeps
`max(ceil(density * n_key_tiles), n_always_kept)` tiles: the always-kept ones first, the
rest of the budget by score. So the cost is `density` unless the always-kept set alone is
larger, and every query tile keeps the same number of tiles, which lets the CPU path batch
query tiles into one gather and one matmul per chunk.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .tiles import TileLayout, tile_layout


@dataclass(frozen=True)
class TileSelection:
    key_tiles: torch.Tensor  # [B, heads, n_query_tiles, max_kept] int64 key-tile ids, ascending
    # [B, heads, n_query_tiles] int32, >= 1: valid entries of each key_tiles row. Kernels ignore
    # the entries past it (which must still be valid ids). select_key_tiles fills every row.
    counts: torch.Tensor

    @property
    def max_kept(self) -> int:
        return self.key_tiles.shape[-1]


def select_key_tiles(
    q_tiles: torch.Tensor,
    k_tiles: torch.Tensor,
    q_layout: TileLayout,
    k_layout: TileLayout,
    density: float,
    *,
    neighbours: int,
    sink: bool,
) -> TileSelection:
    """Pick key tiles per query tile from tiled q [B, heads, nq, Tq, d] and k [B, heads, nk, Tk, d]."""
    if not density > 0:
        raise ValueError(f"density must be > 0, got {density}")
    if neighbours < 0:
        raise ValueError(f"neighbours must be >= 0, got {neighbours}")
    n_key_tiles = k_layout.n_tiles
    always = always_kept(q_layout, k_layout, neighbours, sink)
    budget = min(n_key_tiles, max(math.ceil(density * n_key_tiles), int(always.sum(-1).max())))

    b, h = q_tiles.shape[:2]
    if budget == n_key_tiles:
        key_tiles = torch.arange(n_key_tiles, device=q_tiles.device).expand(b, h, q_layout.n_tiles, -1)
    else:
        scores = _pooled(q_tiles, q_layout) @ _pooled(k_tiles, k_layout).transpose(-1, -2)
        scores.mul_(q_tiles.shape[-1] ** -0.5).masked_fill_(always, math.inf)
        key_tiles = scores.topk(budget, dim=-1, sorted=False).indices.sort(dim=-1).values
    counts = torch.full((b, h, q_layout.n_tiles), budget, dtype=torch.int32, device=q_tiles.device)
    return TileSelection(key_tiles=key_tiles, counts=counts)


def _pooled(tiles: torch.Tensor, layout: TileLayout) -> torch.Tensor:
    """Mean over each tile's real tokens (padded slots are zero), as fp32.

    The sum accumulates in fp32 internally and rounds once to the input dtype; asking for
    an fp32 result directly is ~10x slower for bf16 on CPU, and one rounding does not
    matter for ranking tiles."""
    return tiles.sum(dim=-2).float() / layout.counts[:, None].float()


def always_kept(q_layout: TileLayout, k_layout: TileLayout, neighbours: int, sink: bool) -> torch.Tensor:
    """[nq, nk] bool: key tiles a query tile keeps regardless of score.

    A key tile is a neighbour of a query tile when, on every axis, it lies within
    `neighbours` key tiles of the key tiles the query tile overlaps (Chebyshev distance in
    key-tile units; 0 = only the overlapped tiles, i.e. the query tile itself). Sink tiles
    are the key tiles of the first frame.
    """
    return _always_kept(q_layout.grid, q_layout.tile, k_layout.tile, neighbours, sink, q_layout.counts.device)


@functools.lru_cache(maxsize=64)
def _always_kept(grid, q_tile, k_tile, neighbours: int, sink: bool, device: torch.device) -> torch.Tensor:
    q_layout, k_layout = tile_layout(grid, q_tile), tile_layout(grid, k_tile)
    k_tile_t = torch.tensor(k_tile)
    first = torch.div(q_layout.tile_start, k_tile_t, rounding_mode="floor")  # [nq, 3] overlapped key tiles
    last = torch.div(q_layout.tile_stop - 1, k_tile_t, rounding_mode="floor")
    key = torch.div(k_layout.tile_start, k_tile_t, rounding_mode="floor")  # [nk, 3]
    gap = torch.maximum(first[:, None] - key[None], key[None] - last[:, None]).clamp(min=0)
    kept = gap.amax(dim=-1) <= neighbours
    if sink:
        kept |= (key[:, 0] == 0)[None]
    return kept.to(device)
