"""Key-tile selection: which key tiles each query tile attends to.

Every query tile scores every key tile with its mean-pooled q against the key tile's
mean-pooled k (q·kᵀ/√d), and keeps some of them plus tiles it always keeps: the key tiles
it overlaps (itself), its spatio-temporal neighbours, and optionally the first-frame
"sink" tiles. The result is a compact list of key-tile ids per query tile, not a mask.
Two ways to choose how many:

"topk": every query tile of every head keeps `max(ceil(density * n_key_tiles),
n_always_kept)` tiles: the always-kept ones first, the rest of the budget by score. So the
cost is `density` unless the always-kept set alone is larger.

"mass": a budget per query tile and head, from how concentrated its attention is. The
pooled scores plus log(real tokens of the key tile) are the logits of a softmax over all
key tiles: the pooled mass, an estimate of the share of the query tile's attention each
key tile holds (a tile's weight is its summed tokens' weight, hence the token count). A
row keeps its always-kept tiles, then tiles in descending pooled mass until the kept mass
reaches `mass`, and keeps at least `ceil(min_density * n)` and at most
`ceil(max_density * n)` of the n key tiles (always-kept tiles count toward both and are
never dropped). So a head whose attention is diffuse keeps more tiles than a local one.
The total cost is bounded by top-k's: per batch element, the tiles kept over all heads
and query tiles never exceed what "topk" at `density` keeps; where the rows want more,
the tiles with the least pooled mass beyond each row's minimum are dropped first, across
all heads and query tiles (the most estimated mass for the cost). Only minimums above that
total (`min_density` above `density`) can exceed it. "topk" is the default: over the input
families of benchmarks/attention.py no mass setting beats it on every family, and a low
`mass` target stops rows early where attention is spread evenly, losing fidelity top-k keeps
(benchmarks/RESULTS.md, "Defaults by the worst case over input families").

In either mode, `density` >= 1 keeps every key tile (exact dense attention).

Lists hold ascending key-tile ids in their used prefix. In "mass" they are all as wide
as the widest possible row (`max_density` or the always-kept set), so selecting needs no
device-to-host copy; the entries past a row's count repeat its first id.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

from .tiles import TileLayout, tile_layout

Selection = Literal["topk", "mass"]


@dataclass(frozen=True)
class TileSelection:
    key_tiles: torch.Tensor  # [B, heads, n_query_tiles, max_kept] int64 key-tile ids, ascending
    # [B, heads, n_query_tiles] int32, >= 1: valid entries of each key_tiles row. Kernels ignore
    # the entries past it (which must still be valid ids).
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
    selection: Selection = "topk",
    mass: float = 0.6,
    min_density: float = 0.08,
    max_density: float = 0.25,
) -> TileSelection:
    """Pick key tiles per query tile from tiled q [B, heads, nq, Tq, d] and k [B, heads, nk, Tk, d]."""
    if not density > 0:
        raise ValueError(f"density must be > 0, got {density}")
    if neighbours < 0:
        raise ValueError(f"neighbours must be >= 0, got {neighbours}")
    if selection not in ("topk", "mass"):
        raise ValueError(f"selection must be 'topk' or 'mass', got {selection!r}")
    if selection == "mass" and not (0 < mass <= 1 and 0 < min_density <= max_density <= 1):
        raise ValueError(f"need 0 < mass <= 1 and 0 < min_density <= max_density <= 1, "
                         f"got {mass}, {min_density}, {max_density}")
    n_key_tiles = k_layout.n_tiles
    always, always_counts, most_always = always_kept_counts(q_layout, k_layout, neighbours, sink)
    budget = min(n_key_tiles, max(math.ceil(density * n_key_tiles), most_always))
    widest = min(n_key_tiles, max(math.ceil(max_density * n_key_tiles), most_always))
    if budget == n_key_tiles and (selection == "topk" or density >= 1):
        b, h = q_tiles.shape[:2]
        key_tiles = torch.arange(n_key_tiles, device=q_tiles.device).expand(b, h, q_layout.n_tiles, -1)
        return TileSelection(key_tiles, torch.full((b, h, q_layout.n_tiles), n_key_tiles, dtype=torch.int32,
                                                   device=q_tiles.device))

    scores = _pooled(q_tiles, q_layout) @ _pooled(k_tiles, k_layout).transpose(-1, -2)
    scores.mul_(q_tiles.shape[-1] ** -0.5)
    if selection == "topk":
        key_tiles = scores.masked_fill_(always, math.inf).topk(budget, dim=-1, sorted=False).indices
        counts = torch.full(key_tiles.shape[:3], budget, dtype=torch.int32, device=key_tiles.device)
        return TileSelection(key_tiles.sort(dim=-1).values, counts)

    probs = torch.softmax(scores.add_(k_layout.counts.float().log()), dim=-1)
    # Always-kept tiles first (pooled mass is at most 1), then by descending mass.
    ranked = (probs + always).topk(widest, dim=-1).indices
    ranked_probs = probs.gather(-1, ranked)
    mass_before = ranked_probs.cumsum(-1) - ranked_probs
    least = always_counts.clamp(min=min(n_key_tiles, math.ceil(min_density * n_key_tiles)))
    most = always_counts.clamp(min=min(n_key_tiles, math.ceil(max_density * n_key_tiles)))
    wanted = torch.clamp((mass_before < mass).sum(-1), least, most)
    counts = wanted - _over_budget(ranked_probs, least, wanted, budget * q_layout.n_tiles * q_tiles.shape[1])
    return TileSelection(_ascending_prefix(ranked, counts), counts.to(torch.int32))


def _over_budget(ranked_probs: torch.Tensor, least: torch.Tensor, wanted: torch.Tensor, total: int) -> torch.Tensor:
    """[B, heads, nq]: how many tiles each row drops so that every batch element keeps at most
    `total`: the ones with the least pooled mass among the ranks in [least, wanted) of all
    rows (a row's ranks there have descending mass, so it drops a suffix of its list)."""
    b, h, n_q, width = ranked_probs.shape
    rank = torch.arange(width, device=ranked_probs.device)
    optional = (rank >= least[:, None]) & (rank < wanted[..., None])
    excess = (wanted.sum((1, 2)) - total).clamp_(min=0)  # [B]
    cheapest_first = ranked_probs.masked_fill(~optional, math.inf).view(b, -1).argsort(dim=-1)
    dropped = torch.zeros(b, h * n_q * width, dtype=torch.int64, device=ranked_probs.device)
    dropped.scatter_(1, cheapest_first, (torch.arange(h * n_q * width, device=rank.device) < excess[:, None]).long())
    return dropped.view(b, h, n_q, width).sum(-1)


def _ascending_prefix(ranked: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The first `counts` ids of each row in ascending order, followed by copies of the first."""
    width = ranked.shape[-1]
    unused = torch.arange(width, device=ranked.device) >= counts[..., None]
    # Unused entries sort last (the sentinel exceeds every id), then copy the first id.
    ids = ranked.masked_fill(unused, torch.iinfo(ranked.dtype).max).sort(dim=-1).values
    return torch.where(unused, ids[..., :1], ids)


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
    return always_kept_counts(q_layout, k_layout, neighbours, sink)[0]


def always_kept_counts(q_layout: TileLayout, k_layout: TileLayout, neighbours: int, sink: bool):
    """(`always_kept`, its row sums [nq] int64, their maximum as an int)."""
    return _always_kept(q_layout.grid, q_layout.tile, k_layout.tile, neighbours, sink, q_layout.counts.device)


@functools.lru_cache(maxsize=64)
def _always_kept(grid, q_tile, k_tile, neighbours: int, sink: bool, device: torch.device):
    q_layout, k_layout = tile_layout(grid, q_tile), tile_layout(grid, k_tile)
    k_tile_t = torch.tensor(k_tile)
    first = torch.div(q_layout.tile_start, k_tile_t, rounding_mode="floor")  # [nq, 3] overlapped key tiles
    last = torch.div(q_layout.tile_stop - 1, k_tile_t, rounding_mode="floor")
    key = torch.div(k_layout.tile_start, k_tile_t, rounding_mode="floor")  # [nk, 3]
    gap = torch.maximum(first[:, None] - key[None], key[None] - last[:, None]).clamp(min=0)
    kept = gap.amax(dim=-1) <= neighbours
    if sink:
        kept |= (key[:, 0] == 0)[None]
    counts = kept.sum(-1)
    return kept.to(device), counts.to(device), int(counts.max())
