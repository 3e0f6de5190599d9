"""Tests of vidserve.kernels: tile layout, top-k and mass selection, the torch and Triton
block-sparse paths against the masked-dense reference, dense equivalence and dispatch.

The Triton kernel is checked on CPU under TRITON_INTERPRET=1. The variable has to be set
before the kernel is defined, and another test module may already have imported
vidserve.kernels, so those checks run in a fresh interpreter: this file, run as a script,
is that worker.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

from vidserve.kernels import dense_attention, sparse_attention
from vidserve.kernels.reference import block_sparse_attention_reference, selection_token_mask
from vidserve.kernels.selection import TileSelection, always_kept, select_key_tiles
from vidserve.kernels.sparse_torch import block_sparse_attention_torch
from vidserve.kernels.synthetic import video_like_qkv
from vidserve.kernels.tiles import tile_layout

# (grid, key tile, query tile): exact multiples, partial edge tiles on every axis, a
# query tile that is not a multiple of the key tile, and a grid smaller than a tile.
LAYOUT_CASES = [
    ((4, 8, 8), (4, 4, 4), (4, 8, 4)),
    ((3, 5, 7), (2, 2, 2), (2, 4, 2)),
    ((5, 6, 9), (4, 4, 4), (4, 4, 4)),
    ((2, 3, 5), (2, 2, 2), (1, 3, 2)),
    ((1, 3, 3), (4, 4, 4), (4, 8, 4)),
]

# (grid, key tile, query tile, head_dim, neighbours) with room for "mass" budgets to differ
# between heads: exact multiples, and partial edge tiles with a head_dim not a power of 2.
MASS_CASES = [
    ((4, 8, 8), (2, 2, 2), (2, 4, 2), 32, 0),
    ((3, 7, 9), (2, 2, 2), (2, 4, 2), 24, 1),
]


def random_qkv(grid, batch=2, heads=3, head_dim=32, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    n = math.prod(grid)
    return tuple(torch.randn(batch, heads, n, head_dim, generator=generator).to(dtype) for _ in range(3))


def three_head_qkv(grid, head_dim=32, seed=0):
    """Video-like q, k, v [1, 3, L, d] whose heads attend sharply, moderately and diffusely,
    so that "mass" selection gives them different budgets. v is scaled to keep |output| < 1,
    where rounding to fp16 costs at most 2.5e-4."""
    heads = [video_like_qkv(1, 1, grid, head_dim, peak_logit=peak, seed=seed) for peak in (16.0, 4.0, 0.5)]
    q, k, v = (torch.cat(parts, dim=1) for parts in zip(*heads))
    return q, k, v / 4


def sparse_inputs(q, k, v, grid, tile, query_tile, density=0.3, neighbours=0, sink=False, **select):
    """Layouts, tiled tensors and selection, as `sparse_attention` builds them; `select`:
    the selection and its options (default: "topk")."""
    q_layout, k_layout = tile_layout(grid, query_tile), tile_layout(grid, tile)
    q_tiles, k_tiles, v_tiles = q_layout.to_tiles(q), k_layout.to_tiles(k), k_layout.to_tiles(v)
    select = {"selection": "topk", **select}
    selection = select_key_tiles(q_tiles, k_tiles, q_layout, k_layout, density, neighbours=neighbours, sink=sink,
                                 **select)
    return q_layout, k_layout, q_tiles, k_tiles, v_tiles, selection


# --- tile layout ---------------------------------------------------------------------


@pytest.mark.parametrize("grid, tile, query_tile", LAYOUT_CASES)
def test_tiles_round_trip_and_real_tokens_first(grid, tile, query_tile):
    x = 1 + torch.rand(2, 3, math.prod(grid), 8)  # never 0, unlike padding
    for shape in (tile, query_tile):
        layout = tile_layout(grid, shape)
        tiled = layout.to_tiles(x)
        assert tiled.shape == (2, 3, layout.n_tiles, layout.tile_size, 8)
        assert torch.equal(layout.from_tiles(tiled), x)
        assert int(layout.counts.sum()) == math.prod(grid)
        is_real = torch.arange(layout.tile_size)[None] < layout.counts[:, None]
        assert (tiled[:, :, ~is_real] == 0).all(), "padded slots must be zero"
        assert (tiled[:, :, is_real] != 0).all(), "a tile's first `count` slots must be its real tokens"


def test_tile_holds_its_box_of_tokens():
    grid, tile = (3, 5, 7), (2, 2, 4)
    layout = tile_layout(grid, tile)
    coords = torch.stack(torch.meshgrid(*(torch.arange(g) for g in grid), indexing="ij"), -1).reshape(1, 1, -1, 3)
    tiled = layout.to_tiles(coords.float())[0, 0]
    for t in range(layout.n_tiles):
        real = tiled[t, : layout.counts[t]].long()
        lo, hi = layout.tile_start[t], layout.tile_stop[t]
        assert ((real >= lo) & (real < hi)).all()
        assert len(real) == int((hi - lo).prod())
        # row-major order inside the tile
        flat = (real[:, 0] * 100 + real[:, 1]) * 100 + real[:, 2]
        assert (flat.diff() > 0).all()


# --- selection -----------------------------------------------------------------------


def test_selection_budget_self_and_sorted_ids():
    grid, tile, query_tile = (4, 8, 8), (2, 2, 2), (2, 4, 2)
    q, k, v = random_qkv(grid)
    q_layout, k_layout, *_, selection = sparse_inputs(q, k, v, grid, tile, query_tile, density=0.2)
    assert selection.max_kept == math.ceil(0.2 * k_layout.n_tiles)
    assert (selection.counts == selection.max_kept).all()
    assert (selection.key_tiles.diff(dim=-1) > 0).all(), "ids are unique and ascending"
    # A (2, 4, 2) query tile covers exactly two (2, 2, 2) key tiles; both are always kept.
    own = always_kept(q_layout, k_layout, neighbours=0, sink=False)
    assert (own.sum(-1) == 2).all()
    kept = torch.zeros(*selection.key_tiles.shape[:3], k_layout.n_tiles, dtype=torch.bool)
    kept.scatter_(-1, selection.key_tiles, True)
    assert (kept | ~own).all()


def test_selection_keeps_top_scoring_tiles():
    grid, tile = (2, 4, 8), (2, 2, 2)
    q, k, v = random_qkv(grid, batch=1, heads=1)
    q_layout, k_layout, q_tiles, k_tiles, _, selection = sparse_inputs(q, k, v, grid, tile, tile, density=0.25)
    pooled_q = q_tiles.mean(-2)[0, 0]
    pooled_k = k_tiles.mean(-2)[0, 0]
    scores = pooled_q @ pooled_k.T
    for t in range(q_layout.n_tiles):
        chosen = set(selection.key_tiles[0, 0, t].tolist())
        others = [j for j in range(k_layout.n_tiles) if j not in chosen]
        scored = chosen - {t}  # the query tile's own key tile is kept regardless of score
        assert min(scores[t, sorted(scored)]) >= max(scores[t, others]) - 1e-6


def test_neighbours_and_sink_are_always_kept():
    grid, tile = (6, 8, 8), (2, 2, 2)
    layout = tile_layout(grid, tile)  # 3 x 4 x 4 tiles
    radius1 = always_kept(layout, layout, neighbours=1, sink=False)
    centre = (1 * 4 + 1) * 4 + 1
    assert radius1[centre].sum() == 27
    assert radius1[0].sum() == 8  # a corner tile has 2 x 2 x 2 tiles within radius 1
    with_sink = always_kept(layout, layout, neighbours=0, sink=True)
    assert with_sink[centre, :16].all() and with_sink[centre].sum() == 17  # first frame: 4 x 4 tiles
    q, k, v = random_qkv(grid, heads=1)
    *_, selection = sparse_inputs(q, k, v, grid, tile, tile, density=0.05, neighbours=1)
    assert selection.max_kept == 27, "always-kept tiles count toward the budget and may exceed it"


def pooled_mass(q_tiles, k_tiles, q_layout, k_layout) -> torch.Tensor:
    """[B, heads, nq, nk]: the softmax over pooled scores plus log(real tokens) that "mass" ranks by."""
    pooled_q = q_tiles.sum(-2) / q_layout.counts[:, None]
    pooled_k = k_tiles.sum(-2) / k_layout.counts[:, None]
    logits = pooled_q @ pooled_k.transpose(-1, -2) / math.sqrt(q_tiles.shape[-1]) + k_layout.counts.log()
    return torch.softmax(logits, dim=-1)


def used_tiles(selection: TileSelection, n_key_tiles: int) -> torch.Tensor:
    """[B, heads, nq, nk] bool: the key tiles within each list's count."""
    used = torch.arange(selection.max_kept) < selection.counts[..., None]
    kept = torch.zeros(*selection.key_tiles.shape[:3], n_key_tiles + 1, dtype=torch.bool)
    return kept.scatter_(-1, selection.key_tiles.masked_fill(~used, n_key_tiles), True)[..., :n_key_tiles]


@pytest.mark.parametrize("grid, tile, query_tile", LAYOUT_CASES[:3])
@pytest.mark.parametrize(
    "mass, min_density, max_density, neighbours, sink",
    [(0.5, 0.1, 0.4, 0, False), (0.9, 0.05, 0.6, 1, True), (1.0, 0.2, 0.2, 0, False), (0.3, 0.25, 1.0, 0, True)],
)
def test_mass_selection_respects_its_bounds(grid, tile, query_tile, mass, min_density, max_density, neighbours, sink):
    q, k, v = random_qkv(grid, heads=4)
    density = 0.3
    q_layout, k_layout, *_, selection = sparse_inputs(
        q, k, v, grid, tile, query_tile, density, neighbours, sink,
        selection="mass", mass=mass, min_density=min_density, max_density=max_density,
    )
    n_key, (batch, heads, n_query) = k_layout.n_tiles, selection.counts.shape
    always = always_kept(q_layout, k_layout, neighbours, sink)
    n_always = always.sum(-1)
    least = n_always.clamp(min=min(n_key, math.ceil(min_density * n_key)))
    most = n_always.clamp(min=min(n_key, math.ceil(max_density * n_key)))
    assert ((selection.counts >= least) & (selection.counts <= most)).all()
    topk_budget = min(n_key, max(math.ceil(density * n_key), int(n_always.max())))
    total_bound = max(topk_budget * heads * n_query, int(least.sum()) * heads)
    assert (selection.counts.sum((1, 2)) <= total_bound).all()

    ids = selection.key_tiles
    assert ((ids >= 0) & (ids < n_key)).all(), "entries past the count must still be valid ids"
    used = torch.arange(selection.max_kept) < selection.counts[..., None]
    assert (ids.diff(dim=-1)[used[..., 1:]] > 0).all(), "the used prefix is unique and ascending"
    assert (used_tiles(selection, n_key) | ~always).all(), "always-kept tiles are kept"


@pytest.mark.parametrize("grid, tile, query_tile", [((4, 8, 8), (2, 2, 2), (2, 4, 2)), *LAYOUT_CASES[1:3]])
def test_mass_selection_spends_a_binding_budget_on_the_most_pooled_mass(grid, tile, query_tile):
    # mass 1.0: every row wants its maximum, so the top-k total binds, and the tiles beyond
    # each row's minimum compete across heads and query tiles by pooled mass.
    q, k, v = random_qkv(grid, heads=4, seed=3)
    q_layout, k_layout, q_tiles, k_tiles, _, selection = sparse_inputs(
        q, k, v, grid, tile, query_tile, 0.2, selection="mass", mass=1.0, min_density=0.1, max_density=0.5
    )
    n_key, (batch, heads, n_query) = k_layout.n_tiles, selection.counts.shape
    topk_budget = math.ceil(0.2 * n_key)
    assert (selection.counts.sum((1, 2)) == topk_budget * heads * n_query).all()

    probs = pooled_mass(q_tiles, k_tiles, q_layout, k_layout)
    kept = used_tiles(selection, n_key)
    always = always_kept(q_layout, k_layout, 0, False)
    least = always.sum(-1).clamp(min=math.ceil(0.1 * n_key))
    worst_kept = probs.masked_fill(~kept | always, math.inf).amin(-1)  # beyond the always-kept
    best_left = probs.masked_fill(kept, -math.inf).amax(-1)
    assert (worst_kept >= best_left - 1e-6).all(), "within a row, by descending pooled mass"
    for b in range(batch):
        # Across rows: a row above its minimum kept no tile with less pooled mass than one
        # that a row below its maximum left out.
        above, below = selection.counts[b] > least, selection.counts[b] < math.ceil(0.5 * n_key)
        assert above.any() and below.any()
        assert worst_kept[b][above].min() >= best_left[b][below].max() - 1e-6


def test_mass_selection_weights_tiles_by_their_real_tokens():
    # Identical keys: every pooled score is equal, so a tile's pooled mass is its share of
    # the real tokens. Width 10 in tiles of 4: per row two full tiles (16 tokens) and one
    # half tile (8). With mass 0.55 a full query tile keeps itself and two full tiles
    # (0.2 + 0.2 + 0.2 of the mass), a half one itself and three (0.1 + 3 x 0.2).
    grid, tile = (2, 4, 10), (2, 2, 4)
    layout = tile_layout(grid, tile)
    q = torch.ones(1, 1, math.prod(grid), 8)
    _, _, _, _, _, selection = sparse_inputs(
        q, q, q, grid, tile, tile, 0.99, selection="mass", mass=0.55, min_density=0.01, max_density=1.0
    )
    full = layout.counts == 16
    counts = selection.counts[0, 0]
    assert counts[full].tolist() == [3] * 4 and counts[~full].tolist() == [4] * 2
    kept = used_tiles(selection, layout.n_tiles)[0, 0]
    assert not (kept & ~full & ~torch.eye(layout.n_tiles, dtype=torch.bool)).any(), "half tiles only as themselves"


def test_mass_selection_gives_a_diffuse_head_more_tiles_than_a_local_one():
    grid = (4, 32, 32)
    local = video_like_qkv(1, 1, grid, 64, peak_logit=16.0, seed=0)
    diffuse = video_like_qkv(1, 1, grid, 64, peak_logit=1.0, seed=1)
    q, k, v = (torch.cat(pair, dim=1) for pair in zip(local, diffuse))
    _, k_layout, *_, selection = sparse_inputs(
        q, k, v, grid, (4, 4, 4), (4, 8, 4), 0.125, selection="mass", mass=0.6, min_density=0.08, max_density=0.25
    )
    local_tiles, diffuse_tiles = selection.counts[0].float().mean(-1).tolist()
    assert diffuse_tiles > 1.5 * local_tiles
    # ...within the same total as top-k at density 0.125.
    assert int(selection.counts.sum()) <= math.ceil(0.125 * k_layout.n_tiles) * selection.counts[0].numel()


def ragged(selection: TileSelection, seed: int = 0) -> TileSelection:
    """The same lists cut to random lengths >= 1, with junk (valid) ids past each count."""
    generator = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, selection.max_kept + 1, selection.counts.shape, generator=generator, dtype=torch.int32)
    unused = torch.arange(selection.max_kept) >= counts[..., None]
    return TileSelection(key_tiles=selection.key_tiles.masked_fill(unused, 0), counts=counts)


# --- torch path and dense equivalence --------------------------------------------------


@pytest.mark.parametrize("grid, tile, query_tile", LAYOUT_CASES)
@pytest.mark.parametrize("neighbours, sink", [(0, False), (1, True)])
@pytest.mark.parametrize("selection", ["topk", "mass"])
def test_torch_path_matches_reference(grid, tile, query_tile, neighbours, sink, selection):
    q, k, v = random_qkv(grid)
    options = dict(density=0.3, tile=tile, query_tile=query_tile, neighbours=neighbours, sink=sink, selection=selection)
    expected = sparse_attention(q, k, v, grid, backend="reference", **options)
    got = sparse_attention(q, k, v, grid, backend="torch", **options)
    assert (got - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("grid, tile, query_tile", LAYOUT_CASES[:3])
def test_torch_path_honours_list_counts(grid, tile, query_tile):
    q, k, v = random_qkv(grid)
    q_layout, k_layout, q_tiles, k_tiles, v_tiles, selection = sparse_inputs(q, k, v, grid, tile, query_tile, 0.5)
    selection = ragged(selection)
    got = q_layout.from_tiles(block_sparse_attention_torch(q_tiles, k_tiles, v_tiles, selection, k_layout))
    expected = block_sparse_attention_reference(q, k, v, selection, q_layout, k_layout)
    assert (got - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("grid, tile, query_tile, head_dim, neighbours", MASS_CASES)
def test_torch_path_matches_reference_with_per_head_budgets(grid, tile, query_tile, head_dim, neighbours):
    q, k, v = three_head_qkv(grid, head_dim)
    q_layout, k_layout, q_tiles, k_tiles, v_tiles, selection = sparse_inputs(
        q, k, v, grid, tile, query_tile, 0.25, neighbours, selection="mass", mass=0.7, min_density=0.1, max_density=0.9
    )
    sharp, _, diffuse = selection.counts.float().mean((0, 2)).tolist()
    assert diffuse > sharp + 1
    got = q_layout.from_tiles(block_sparse_attention_torch(q_tiles, k_tiles, v_tiles, selection, k_layout))
    expected = block_sparse_attention_reference(q, k, v, selection, q_layout, k_layout)
    assert (got - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("mode", ["topk", "mass"])
def test_torch_path_chunking_does_not_change_the_result(mode):
    grid, tile, query_tile = (3, 7, 9), (2, 2, 2), (2, 4, 2)
    q, k, v = three_head_qkv(grid)
    _, k_layout, q_tiles, k_tiles, v_tiles, selection = sparse_inputs(
        q, k, v, grid, tile, query_tile, selection=mode, mass=0.7, min_density=0.1, max_density=0.9
    )
    threads = torch.get_num_threads()
    one_chunk = block_sparse_attention_torch(q_tiles, k_tiles, v_tiles, selection, k_layout, chunk_bytes=1 << 30)
    # One query tile per chunk, spread over worker threads when there are several.
    small_chunks = block_sparse_attention_torch(q_tiles, k_tiles, v_tiles, selection, k_layout, chunk_bytes=1)
    assert (one_chunk - small_chunks).abs().max() <= 1e-6
    assert torch.get_num_threads() == threads, "the worker threads' setting must not leak"
    seen = []
    later = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    later.start()
    later.join()
    assert seen == [threads], "nor reach threads started later"


@pytest.mark.parametrize("grid, tile, query_tile", LAYOUT_CASES)
@pytest.mark.parametrize("backend", [None, "torch", "reference"])
def test_full_density_equals_dense_attention(grid, tile, query_tile, backend):
    q, k, v = random_qkv(grid)
    expected = F.scaled_dot_product_attention(q, k, v)
    got = sparse_attention(q, k, v, grid, density=1.0, tile=tile, query_tile=query_tile, backend=backend)
    assert got.shape == q.shape
    assert (got - expected).abs().max() <= 1e-5


def test_reference_mask_follows_the_selection():
    grid, tile = (2, 4, 4), (2, 2, 2)
    q, k, v = random_qkv(grid, batch=1, heads=1)
    q_layout, k_layout, *_, selection = sparse_inputs(q, k, v, grid, tile, tile, density=0.25)
    mask = selection_token_mask(selection, q_layout, k_layout)[0, 0]
    q_tile_of, k_tile_of = q_layout.tile_of_token(), k_layout.tile_of_token()
    for i in range(0, math.prod(grid), 5):
        kept = set(selection.key_tiles[0, 0, q_tile_of[i]].tolist())
        assert mask[i].tolist() == [int(k_tile_of[j]) in kept for j in range(math.prod(grid))]


def test_sparse_attention_keeps_dtype_and_shape():
    grid = (3, 5, 7)
    q, k, v = random_qkv(grid, dtype=torch.bfloat16)
    out = sparse_attention(q, k, v, grid, density=0.5, tile=(2, 2, 2))
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    expected = sparse_attention(q, k, v, grid, density=0.5, tile=(2, 2, 2), backend="reference")
    assert (out.float() - expected.float()).abs().max() <= 2e-2


def test_rejects_bad_arguments():
    grid = (2, 4, 4)
    q, k, v = random_qkv(grid)
    with pytest.raises(ValueError, match="backend"):
        sparse_attention(q, k, v, grid, backend="cuda")
    with pytest.raises(ValueError, match="grid"):
        sparse_attention(q, k, v, (2, 4, 5))
    with pytest.raises(ValueError, match="density"):
        sparse_attention(q, k, v, grid, density=0.0)
    with pytest.raises(ValueError, match="selection"):
        sparse_attention(q, k, v, grid, selection="top-p")
    with pytest.raises(ValueError, match="min_density <= max_density"):
        sparse_attention(q, k, v, grid, selection="mass", min_density=0.5, max_density=0.25)
    with pytest.raises(ValueError, match="mass"):
        sparse_attention(q, k, v, grid, selection="mass", mass=0.0)


def test_dense_attention_is_sdpa_on_cpu():
    q, k, v = random_qkv((2, 4, 4))
    assert torch.equal(dense_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("selection", ["topk", "mass"])
def test_fidelity_on_locality_structured_inputs(selection):
    grid = (4, 32, 32)
    q, k, v = video_like_qkv(1, 2, grid, 128, seed=1)
    out = sparse_attention(q, k, v, grid, density=0.125, selection=selection)
    cosine = F.cosine_similarity(out.double().flatten(), dense_attention(q, k, v).double().flatten(), dim=0)
    assert cosine >= 0.99


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def test_kernels_import_without_triton_and_without_diffusers():
    code = (
        "import sys; sys.modules['triton'] = None\n"  # makes `import triton` raise ImportError
        "import torch\n"
        "from vidserve.kernels import sparse_attention\n"
        "q = torch.randn(1, 2, 32, 16)\n"
        "out = sparse_attention(q, q, q, (2, 4, 4), density=0.5, tile=(2, 2, 2))\n"
        "assert out.shape == q.shape\n"
        "try:\n"
        "    sparse_attention(q, q, q, (2, 4, 4), backend='triton')\n"
        "except RuntimeError as e:\n"
        "    assert 'triton' in str(e)\n"
        "else:\n"
        "    raise AssertionError('the triton backend must fail clearly without triton')\n"
        "assert 'diffusers' not in sys.modules\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr


# --- Triton kernel under the interpreter ------------------------------------------------

TRITON_CASES = [
    # (grid, key tile, query tile, head_dim, neighbours, sink)
    ((2, 4, 8), (2, 2, 4), (2, 4, 4), 32, 0, False),  # exact multiples, 16/32-token tiles
    ((3, 5, 7), (2, 2, 2), (2, 4, 2), 16, 1, True),  # partial edge tiles on every axis
    ((2, 3, 5), (2, 2, 2), (1, 3, 2), 24, 0, True),  # head_dim and tile sizes not powers of 2
]


def triton_interpreter_errors() -> list[dict]:
    """Worker (runs with TRITON_INTERPRET=1): max abs error of the Triton kernel vs the
    reference for every case in fp32 and fp16, in fp16 with lists cut short, with "mass"
    selection (per-head budgets) in fp32 and fp16, and vs dense attention at density 1."""
    from vidserve.kernels.sparse_triton import block_sparse_attention_triton

    def error_vs_reference(q, k, v, q_layout, k_layout, selection) -> float:
        q_tiles, k_tiles, v_tiles = q_layout.to_tiles(q), k_layout.to_tiles(k), k_layout.to_tiles(v)
        out = q_layout.from_tiles(block_sparse_attention_triton(q_tiles, k_tiles, v_tiles, selection, k_layout))
        # The reference runs in fp64 on the same (rounded) inputs and is not rounded back.
        expected = block_sparse_attention_reference(q.double(), k.double(), v.double(), selection, q_layout, k_layout)
        return (out.double() - expected).abs().max().item()

    results = []
    for case, (grid, tile, query_tile, head_dim, neighbours, sink) in enumerate(TRITON_CASES):
        q, k, v = random_qkv(grid, head_dim=head_dim, seed=case)
        v = v / 4  # keeps |output| < 1, where rounding to fp16 costs at most 2.5e-4
        half = tuple(x.half() for x in (q, k, v))
        for name, inputs in (("fp32", (q, k, v)), ("fp16", half)):
            q_layout, k_layout, *_, selection = sparse_inputs(
                *inputs, grid, tile, query_tile, density=0.3, neighbours=neighbours, sink=sink
            )
            error = error_vs_reference(*inputs, q_layout, k_layout, selection)
            results.append(dict(case=case, check=name, error=error))
        # `selection` is the fp16 one from the last pass of the loop.
        error = error_vs_reference(*half, q_layout, k_layout, ragged(selection, seed=case))
        results.append(dict(case=case, check="fp16 ragged", error=error))
        dense = sparse_attention(q, k, v, grid, density=1.0, tile=tile, query_tile=query_tile, backend="triton")
        error = (dense - F.scaled_dot_product_attention(q, k, v)).abs().max().item()
        results.append(dict(case=case, check="fp32 density 1 vs dense", error=error))
    for case, (grid, tile, query_tile, head_dim, neighbours) in enumerate(MASS_CASES):
        q, k, v = three_head_qkv(grid, head_dim, seed=case)
        for name, dtype in (("fp32 mass", torch.float32), ("fp16 mass", torch.float16)):
            inputs = tuple(x.to(dtype) for x in (q, k, v))
            q_layout, k_layout, *_, selection = sparse_inputs(
                *inputs, grid, tile, query_tile, density=0.25, neighbours=neighbours,
                selection="mass", mass=0.7, min_density=0.1, max_density=0.9,
            )
            error = error_vs_reference(*inputs, q_layout, k_layout, selection)
            head_tiles = selection.counts.float().mean((0, 2)).tolist()
            results.append(dict(case=case, check=name, error=error, head_tiles=head_tiles))
    return results


@pytest.fixture(scope="module")
def triton_errors() -> list[dict]:
    pytest.importorskip("triton")
    result = subprocess.run(
        [sys.executable, __file__],
        capture_output=True, text=True, timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", range(len(TRITON_CASES)))
@pytest.mark.parametrize(
    "check, tolerance",
    [("fp32", 1e-3), ("fp16", 1e-3), ("fp16 ragged", 1e-3), ("fp32 density 1 vs dense", 1e-5)],
)
def test_triton_kernel_matches_reference_in_interpreter(triton_errors, case, check, tolerance):
    (error,) = [r["error"] for r in triton_errors if r["case"] == case and r["check"] == check]
    assert error <= tolerance


@pytest.mark.parametrize("case", range(len(MASS_CASES)))
@pytest.mark.parametrize("check", ["fp32 mass", "fp16 mass"])
def test_triton_kernel_matches_reference_with_per_head_budgets(triton_errors, case, check):
    (result,) = [r for r in triton_errors if r["case"] == case and r["check"] == check]
    assert result["error"] <= 1e-3
    sharp, _, diffuse = result["head_tiles"]
    assert diffuse > sharp + 1, "the diffuse head keeps more key tiles than the sharp one"


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(triton_interpreter_errors()))


def test_cpu_workers_run_under_the_callers_inference_mode():
    # Pipelines call attention under torch.inference_mode; the CPU path's worker threads must
    # be able to write its inference tensors (regression: they ran outside inference mode).
    grid = (8, 32, 32)  # big enough that the work is split into many chunks over 2 threads
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8 * 32 * 32, 128, generator=generator) for _ in range(3))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        expected = sparse_attention(q, k, v, grid, density=0.25, backend="torch")
        with torch.inference_mode():
            got = sparse_attention(q, k, v, grid, density=0.25, backend="torch")
    finally:
        torch.set_num_threads(threads)
    assert torch.allclose(got, expected)
