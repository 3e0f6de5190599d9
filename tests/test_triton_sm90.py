"""The Triton kernel compiled for Hopper (sm_90) and Ampere (sm_80) on this CPU: every
supported tile fits in a block's shared memory, and the production configuration neither
spills nor loses the software pipeline it was designed for. A kernel that an H100 would
refuse to launch fails here, without a GPU.

Compiled kernels are cached per module in a temporary TRITON_CACHE_DIR (about 2 s each).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from vidserve.kernels.dispatch import default_query_tile  # noqa: E402
from vidserve.kernels.resources import MAX_SHARED, compile_kernel, resources  # noqa: E402
from vidserve.kernels.support import SUPPORTED, UnsupportedTile, launch_config, tile_problem  # noqa: E402

PRODUCTION_TILE = (4, 4, 4)  # key tile; the query tile is (4, 8, 4): 128 rows
PRODUCTION = (128, 64, 128, torch.bfloat16)  # query rows, key rows, head_dim, dtype


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(query rows, key rows, head_dim, dtype, arch) -> Resources, compiling each once."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRITON_CACHE_DIR", str(tmp_path_factory.mktemp("triton-cache")))
        figures = {}

        def get(query_rows, key_rows, head_dim, dtype, arch):
            key = (query_rows, key_rows, head_dim, dtype, arch)
            if key not in figures:
                config = launch_config(query_rows, key_rows, head_dim, dtype)
                figures[key] = resources(compile_kernel(arch, config, dtype), arch)
            return figures[key]

        yield get


@pytest.mark.parametrize("arch", sorted(MAX_SHARED))
@pytest.mark.parametrize("row", SUPPORTED, ids=lambda r: f"{r.query_block}x{r.key_block}x{r.head_block}-{r.dtype}")
def test_every_supported_tile_fits_in_shared_memory(compiled, row, arch):
    figures = compiled(row.query_block, row.key_block, row.head_block, row.dtype, arch)
    assert figures.shared <= MAX_SHARED[arch]


# (K/V buffers, copy groups outstanding at the loop's wait) at num_stages 3. With the tile id
# read at the top of the loop instead of an iteration early, the copies cannot be issued ahead:
# (2, 0) on sm_90 and (1, 0) on sm_80, every iteration waiting for all its copies.
DESIGNED_PIPELINE = {90: (3, 2), 80: (2, 2)}


@pytest.mark.parametrize("arch", sorted(MAX_SHARED))
def test_the_production_configuration_overlaps_copies_without_spilling(compiled, arch):
    figures = compiled(*PRODUCTION, arch)
    assert figures.spilled == 0
    assert (figures.kv_buffers, figures.in_flight) == DESIGNED_PIPELINE[arch]


def test_the_production_tiles_are_the_production_configuration():
    query_rows = torch.Size(default_query_tile(PRODUCTION_TILE)).numel()
    key_rows = torch.Size(PRODUCTION_TILE).numel()
    assert (query_rows, key_rows) == PRODUCTION[:2]
    assert tile_problem(default_query_tile(PRODUCTION_TILE), PRODUCTION_TILE) is None


@pytest.mark.parametrize("tile", [(4, 8, 8), (16, 16, 16), (4, 8, 4)])  # 256-row query tiles and up
def test_larger_tiles_are_refused_with_the_reason(tile):
    problem = tile_problem(default_query_tile(tile), tile)
    assert problem is not None and "not supported by the Triton kernel" in problem


def test_fp32_is_refused_on_a_gpu():
    with pytest.raises(UnsupportedTile, match="float32"):
        launch_config(128, 64, 128, torch.float32)
