"""`sparse_attention`: the public entry point, and the choice of backend.

    q, k, v [B, heads, L, d], tokens in row-major (f, h, w) order over grid (F, H, W)
      -> tile order (one copy each)            tiles.py
      -> key tiles per query tile              selection.py
      -> block-sparse attention over them      sparse_triton.py | sparse_torch.py | reference.py
      -> token order (one copy)                tiles.py

Queries and keys are tiled differently. Keys use `tile` (64 tokens by default). Queries use
`query_tile`, by default `tile` with its height doubled (128 tokens): all queries of a
query tile share one selection. Twice as many queries per gathered key block halves the
gather work and gives the matmuls a better shape: on CPU, sparse attention runs faster than
with 64-token query tiles, in fp32 and more so in bf16, for slightly less cosine similarity
to dense (measured in benchmarks/RESULTS.md, "Block-sparse attention on CPU", "Top-k
selection and its options").
On a GPU, 128 query rows per program is also the usual flash-attention block. Height rather
than width is doubled because Wan latent widths (52 at 480p) are not multiples of 8 while
the tile-padded heights (30 -> 32) are, so no extra padding is computed.
"""

from __future__ import annotations

import math

import torch

from .dense import dense_attention
from .reference import block_sparse_attention_reference
from .selection import Selection, select_key_tiles
from .sparse_torch import block_sparse_attention_torch
from .sparse_triton import block_sparse_attention_triton, triton_available
from .support import UnsupportedTile, launch_config
from .tiles import Triple, tile_layout

BACKENDS = ("triton", "torch", "reference")


def _triton_runs(q: torch.Tensor, query_tile: Triple, tile: Triple) -> bool:
    """Whether the Triton kernel supports these tiles in q's dtype on a GPU (fp32 it does not)."""
    try:
        launch_config(math.prod(query_tile), math.prod(tile), q.shape[-1], q.dtype)
    except UnsupportedTile:
        return False
    return True


def default_query_tile(tile: Triple) -> Triple:
    """The query tile used when none is given: `tile` with its height doubled."""
    return (tile[0], 2 * tile[1], tile[2])


def sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: Triple,
    density: float = 0.125,
    tile: Triple = (4, 4, 4),
    *,
    neighbours: int = 0,
    sink: bool = False,
    backend: str | None = None,
    query_tile: Triple | None = None,
    selection: Selection = "topk",
    mass: float = 0.6,
    min_density: float = 0.08,
    max_density: float = 0.25,
) -> torch.Tensor:
    """Block-sparse self-attention over a (F, H, W) video token grid.

    q, k, v: [B, heads, L, d] with L = F*H*W tokens in row-major (f, h, w) order.
    Returns [B, heads, L, d] in the same order, like `scaled_dot_product_attention`.

    density: fraction of key tiles each query tile keeps (k = ceil(density * n_key_tiles));
        with selection "mass", the bound on the average over query tiles and heads instead.
        >= 1.0 is exact dense attention.
    tile: key tile shape in tokens (tf, th, tw); any grid size works, edge tiles are padded.
    neighbours: also always keep the key tiles within this many tiles (on every axis) of
        the query tile; 0 (default) keeps only the key tiles the query tile itself covers.
        Default 0 because a radius-1 neighbourhood (up to 27-36 key tiles) outgrows the
        whole budget at density 0.125 up to L=16k (16-32 tiles), so it raises the cost for
        about the fidelity that spending the same larger budget by score gives (measured in
        benchmarks/RESULTS.md, "Top-k selection and its options"); top-k keeps the
        neighbours that matter anyway, since they score high when content is local.
    sink: also always keep the key tiles of the first frame.
    backend: "triton" (CUDA), "torch", "reference" (masked dense, slow) or None: triton on
        CUDA when installed and its kernel supports the tiles and dtype (support.py: bf16,
        fp16), torch otherwise.
    query_tile: query tile shape; None = `tile` with its height doubled.
    selection: "topk" keeps k tiles per query tile; "mass" keeps, per query tile and head,
        tiles until their pooled attention mass reaches `mass`, between `min_density` and
        `max_density` of the key tiles, at most k per query tile on average (selection.py).

    Always-kept tiles count toward the budget: with "topk" each query tile keeps
    max(k, number of always-kept tiles) key tiles, the always-kept ones first.
    """
    if q.dim() != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v must all be [batch, heads, L, head_dim], got {q.shape}, {k.shape}, {v.shape}")
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS} or None, got {backend!r}")
    if query_tile is None:
        query_tile = default_query_tile(tile)
    if backend is None:
        if density >= 1.0:
            return dense_attention(q, k, v)
        backend = "triton" if q.is_cuda and triton_available() and _triton_runs(q, query_tile, tile) else "torch"

    q_layout = tile_layout(grid, query_tile, q.device)
    k_layout = tile_layout(grid, tile, q.device)
    q_tiles, k_tiles = q_layout.to_tiles(q), k_layout.to_tiles(k)
    kept = select_key_tiles(q_tiles, k_tiles, q_layout, k_layout, density, neighbours=neighbours, sink=sink,
                            selection=selection, mass=mass, min_density=min_density, max_density=max_density)

    if backend == "reference":
        return block_sparse_attention_reference(q, k, v, kept, q_layout, k_layout)
    v_tiles = k_layout.to_tiles(v)
    if backend == "triton":
        out_tiles = block_sparse_attention_triton(q_tiles, k_tiles, v_tiles, kept, k_layout)
    else:
        out_tiles = block_sparse_attention_torch(q_tiles, k_tiles, v_tiles, kept, k_layout)
    return q_layout.from_tiles(out_tiles)
