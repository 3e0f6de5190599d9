"""Reference block-sparse attention: dense attention under the selection's token mask.

Slow (it builds the full L x L mask) and meant for tests on small shapes. It works in
token order straight from the tile ids of every token, so it shares no permutation code
with the fast paths and checks their tile layout too.
"""

from __future__ import annotations

import torch

from .selection import TileSelection
from .tiles import TileLayout


def selection_token_mask(selection: TileSelection, q_layout: TileLayout, k_layout: TileLayout) -> torch.Tensor:
    """[B, heads, L, L] bool: query token i may attend to key token j."""
    b, h, n_q, max_kept = selection.key_tiles.shape
    valid = torch.arange(max_kept, device=selection.counts.device) < selection.counts[..., None]
    tile_mask = torch.zeros(b, h, n_q, k_layout.n_tiles + 1, dtype=torch.bool, device=valid.device)
    # Invalid entries are sent to a spare column that is dropped afterwards.
    tile_mask.scatter_(-1, selection.key_tiles.masked_fill(~valid, k_layout.n_tiles), True)
    tile_mask = tile_mask[..., : k_layout.n_tiles]
    rows, cols = q_layout.tile_of_token(), k_layout.tile_of_token()
    return tile_mask[:, :, rows][:, :, :, cols]


def block_sparse_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    selection: TileSelection,
    q_layout: TileLayout,
    k_layout: TileLayout,
) -> torch.Tensor:
    """q, k, v [B, heads, L, d] in token order -> output in token order, computed in fp64."""
    mask = selection_token_mask(selection, q_layout, k_layout)
    scores = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return (weights @ v.double()).to(q.dtype)
