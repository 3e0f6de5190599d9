"""3D tile layout: regroup a (F, H, W) token grid into tiles of (tf, th, tw) tokens.

Tokens arrive in row-major (f, h, w) order. Block-sparse attention wants every tile's
tokens contiguous, so `TileLayout.to_tiles` copies q/k/v once into *tile order* and
`TileLayout.from_tiles` copies the output back once.

Grids need not be multiples of the tile. An edge tile is padded to the full tile size,
and inside every tile the real tokens come first (in row-major order within the tile),
padding last. A tile's real tokens are therefore exactly its first `counts[tile]` slots,
which is all a kernel needs to know to keep padded keys at zero weight. Padded slots are
zero-filled so they never perturb mean pooling or produce NaNs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

Triple = tuple[int, int, int]


@dataclass(frozen=True)
class TileLayout:
    grid: Triple  # (F, H, W) tokens
    tile: Triple  # (tf, th, tw) tokens per tile
    tiles_per_axis: Triple  # ceil(grid / tile) per axis
    slot_token: torch.Tensor  # [n_tiles * tile_size] source token of each slot (0 for padding)
    token_slot: torch.Tensor  # [L] slot of each token: the inverse permutation
    padded_slots: torch.Tensor  # [n_padded] slots that hold no token
    counts: torch.Tensor  # [n_tiles] int32, real tokens per tile
    tile_start: torch.Tensor  # [n_tiles, 3] first token coordinate of each tile
    tile_stop: torch.Tensor  # [n_tiles, 3] one past the last real token coordinate

    @property
    def n_tokens(self) -> int:
        return math.prod(self.grid)

    @property
    def n_tiles(self) -> int:
        return math.prod(self.tiles_per_axis)

    @property
    def tile_size(self) -> int:
        return math.prod(self.tile)

    @property
    def has_padding(self) -> bool:
        return self.padded_slots.numel() > 0

    def to_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """[B, heads, L, d] in token order -> [B, heads, n_tiles, tile_size, d] in tile order."""
        b, h, n, d = x.shape
        if n != self.n_tokens:
            raise ValueError(f"sequence length {n} does not match grid {self.grid} ({self.n_tokens} tokens)")
        tiled = x.index_select(2, self.slot_token)
        if self.has_padding:
            tiled.index_fill_(2, self.padded_slots, 0)
        return tiled.view(b, h, self.n_tiles, self.tile_size, d)

    def from_tiles(self, x: torch.Tensor) -> torch.Tensor:
        """[B, heads, n_tiles, tile_size, d] in tile order -> [B, heads, L, d] in token order."""
        b, h = x.shape[:2]
        return x.reshape(b, h, self.n_tiles * self.tile_size, x.shape[-1]).index_select(2, self.token_slot)

    def tile_of_token(self) -> torch.Tensor:
        """[L] tile index of every token (in token order)."""
        return torch.div(self.token_slot, self.tile_size, rounding_mode="floor")


def tile_layout(grid: Triple, tile: Triple, device: torch.device | str = "cpu") -> TileLayout:
    """The layout of `grid` in tiles of `tile`, cached per (grid, tile, device)."""
    grid, tile = _triple(grid, "grid"), _triple(tile, "tile")
    return _cached_layout(grid, tile, torch.device(device))


def _triple(value, name: str) -> Triple:
    value = tuple(int(v) for v in value)
    if len(value) != 3 or min(value) < 1:
        raise ValueError(f"{name} must be three positive ints (F, H, W), got {value}")
    return value


@functools.lru_cache(maxsize=64)
def _cached_layout(grid: Triple, tile: Triple, device: torch.device) -> TileLayout:
    tiles_per_axis = tuple(-(-g // t) for g, t in zip(grid, tile))
    tile_size = math.prod(tile)

    # Per token: its tile coordinate, its offset inside the tile, and the extent of the
    # tile's real part (smaller than the tile only at the far edge of an axis).
    coords = torch.stack(torch.meshgrid(*(torch.arange(g) for g in grid), indexing="ij"), dim=-1).reshape(-1, 3)
    tile_size_t, grid_t = torch.tensor(tile), torch.tensor(grid)
    tile_coord = torch.div(coords, tile_size_t, rounding_mode="floor")
    offset = coords - tile_coord * tile_size_t
    extent = torch.minimum(tile_size_t, grid_t - tile_coord * tile_size_t)

    tile_id = (tile_coord[:, 0] * tiles_per_axis[1] + tile_coord[:, 1]) * tiles_per_axis[2] + tile_coord[:, 2]
    rank_in_tile = (offset[:, 0] * extent[:, 1] + offset[:, 1]) * extent[:, 2] + offset[:, 2]
    token_slot = tile_id * tile_size + rank_in_tile

    n_slots = math.prod(tiles_per_axis) * tile_size
    slot_token = torch.zeros(n_slots, dtype=torch.long)
    slot_token[token_slot] = torch.arange(coords.shape[0])
    is_real = torch.zeros(n_slots, dtype=torch.bool)
    is_real[token_slot] = True

    tile_grid = torch.stack(torch.meshgrid(*(torch.arange(n) for n in tiles_per_axis), indexing="ij"), dim=-1)
    tile_start = tile_grid.reshape(-1, 3) * tile_size_t
    tile_stop = torch.minimum(tile_start + tile_size_t, grid_t)
    counts = (tile_stop - tile_start).prod(dim=-1).to(torch.int32)

    return TileLayout(
        grid=grid,
        tile=tile,
        tiles_per_axis=tiles_per_axis,
        slot_token=slot_token.to(device),
        token_slot=token_slot.to(device),
        padded_slots=(~is_real).nonzero().flatten().to(device),
        counts=counts.to(device),
        tile_start=tile_start.to(device),
        tile_stop=tile_stop.to(device),
    )
