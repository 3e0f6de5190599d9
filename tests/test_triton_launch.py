"""The Triton kernel's launch and inner loop: the device it launches on, key tiles with no
real token, lists of every length (the next tile id is loaded one iteration early).

Numbers come from the kernel under TRITON_INTERPRET=1, which must be set before triton is
imported, so a worker process (this file run as a script) computes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from vidserve.kernels import sparse_triton
from vidserve.kernels.reference import block_sparse_attention_reference
from vidserve.kernels.selection import TileSelection
from vidserve.kernels.tiles import tile_layout

GRID, KEY_TILE, QUERY_TILE, HEAD_DIM = (2, 4, 6), (1, 2, 2), (2, 2, 3), 16  # 12 key tiles, 4 query tiles


def inputs(dtype: torch.dtype, seed: int):
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, 48, HEAD_DIM, generator=generator) for _ in range(3))
    # |output| < 1, where rounding to fp16 costs at most 2.5e-4.
    return q.to(dtype), k.to(dtype), (v / 4).to(dtype)


def ragged_selection(n_query_tiles: int, n_key_tiles: int, seed: int, first: int | None = None) -> TileSelection:
    """Lists of every length up to all key tiles (the full width), ascending, entries past the
    count repeating the first id; with `first`, every list starts with that tile and holds at
    least one other (a list of only a tile without real tokens attends to nothing)."""
    generator = torch.Generator().manual_seed(seed)
    rows, counts = [], []
    for i in range(2 * 3 * n_query_tiles):
        count = 2 + i % (n_key_tiles - 1) if first is not None else 1 + i % n_key_tiles
        others = [t for t in torch.randperm(n_key_tiles, generator=generator).tolist() if t != first]
        ids = sorted(others[: count - 1] + [first]) if first is not None else sorted(others[:count])
        rows.append(ids + [ids[0]] * (n_key_tiles - count))
        counts.append(count)
    key_tiles = torch.tensor(rows).view(2, 3, n_query_tiles, n_key_tiles)
    return TileSelection(key_tiles=key_tiles, counts=torch.tensor(counts, dtype=torch.int32).view(2, 3, n_query_tiles))


def triton_output(q, k, v, q_layout, k_layout, selection) -> torch.Tensor:
    tiled = sparse_triton.block_sparse_attention_triton(
        q_layout.to_tiles(q), k_layout.to_tiles(k), k_layout.to_tiles(v), selection, k_layout)
    return q_layout.from_tiles(tiled)


def interpreter_results() -> dict:
    """Worker (TRITON_INTERPRET=1): max abs error vs the fp64 reference, and whether all finite."""
    q_layout, k_layout = tile_layout(GRID, QUERY_TILE), tile_layout(GRID, KEY_TILE)
    results = {}
    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        q, k, v = inputs(dtype, seed=1)
        expected_of = lambda selection: block_sparse_attention_reference(  # noqa: E731
            q.double(), k.double(), v.double(), selection, q_layout, k_layout)

        selection = ragged_selection(q_layout.n_tiles, k_layout.n_tiles, seed=2)
        out = triton_output(q, k, v, q_layout, k_layout, selection)
        results[f"{name} ragged"] = dict(error=(out.double() - expected_of(selection)).abs().max().item(),
                                         finite=bool(out.isfinite().all()))

        # Key tile 0 holds no real token and comes first in every list: expected is attention
        # over the rest of the list.
        selection = ragged_selection(q_layout.n_tiles, k_layout.n_tiles, seed=3, first=0)
        empty_first = dataclasses.replace(k_layout, counts=k_layout.counts.clone().index_fill_(0, torch.tensor([0]), 0))
        out = triton_output(q, k, v, q_layout, empty_first, selection)
        without_first = dataclasses.replace(
            selection, key_tiles=torch.cat([selection.key_tiles[..., 1:2], selection.key_tiles[..., 1:]], dim=-1))
        results[f"{name} empty first"] = dict(error=(out.double() - expected_of(without_first)).abs().max().item(),
                                              finite=bool(out.isfinite().all()))
    return results


@pytest.fixture(scope="module")
def interpreted() -> dict:
    pytest.importorskip("triton")
    result = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype, tolerance", [("fp32", 1e-6), ("fp16", 1e-3)])
def test_lists_of_every_length_match_the_reference(interpreted, dtype, tolerance):
    result = interpreted[f"{dtype} ragged"]
    assert result["finite"]
    assert result["error"] <= tolerance


@pytest.mark.parametrize("dtype, tolerance", [("fp32", 1e-6), ("fp16", 1e-3)])
def test_a_key_tile_without_real_tokens_first_in_a_list_leaves_rows_finite(interpreted, dtype, tolerance):
    result = interpreted[f"{dtype} empty first"]
    assert result["finite"]
    assert result["error"] <= tolerance


def test_the_launch_runs_on_the_tensors_device(monkeypatch):
    # No second GPU here: the guard is recorded, and the launch must happen inside it.
    entered, launched_in = [], []

    @contextlib.contextmanager
    def guard(device):
        entered.append(device)
        yield

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched_in.append(list(entered))

    monkeypatch.setattr(sparse_triton, "_device_guard", guard)
    monkeypatch.setattr(sparse_triton, "_block_sparse_attention_kernel", Kernel(), raising=False)
    q_layout, k_layout = tile_layout(GRID, QUERY_TILE), tile_layout(GRID, KEY_TILE)
    q, k, v = inputs(torch.float32, seed=0)
    triton_output(q, k, v, q_layout, k_layout, ragged_selection(q_layout.n_tiles, k_layout.n_tiles, seed=0))
    assert launched_in == [[q.device]]


def test_the_guard_makes_the_tensors_cuda_device_current():
    guard = sparse_triton._device_guard(torch.device("cuda", 1))
    assert isinstance(guard, torch.cuda.device) and guard.idx == 1
    assert isinstance(sparse_triton._device_guard(torch.device("cpu")), contextlib.nullcontext)


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    print(json.dumps(interpreter_results()))
