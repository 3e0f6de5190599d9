"""`vidserve check --gpu`: the GPU kernels run here, verified in seconds before any long job
(benchmarks/gpu.sh calls it first), one line each and stopping at the first failure: a CUDA
device, a trivial Triton kernel (Triton builds its launcher with a C compiler at first use
and finds libcuda through ldconfig), then the block-sparse kernel on a tiny bf16 case
against an fp32 reference."""

from __future__ import annotations

import os
import tempfile

from vidserve.check import Result, attempt
from vidserve.errors import VidserveError

# bf16 rounds q, k, v and the softmax weights (8 bits of mantissa): about 1.6e-2 at most on
# outputs of this size, where a wrong kernel is off by the outputs themselves (~0.1-1).
TOLERANCE = 3e-2


def run_gpu_checks(device: str = "cuda") -> list[Result]:
    # Compiled kernels go somewhere writable even where $HOME is not (a bare image).
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="vidserve-triton-"))
    results = []
    for name, check in (("gpu", lambda: _gpu(device)), ("triton", lambda: _triton(device)),
                        ("sparse attention", lambda: _sparse_attention(device))):
        results.append(attempt(name, check))
        if not results[-1].ok:
            break
    return results


def _gpu(device: str) -> str:
    import torch

    if not torch.cuda.is_available():
        raise VidserveError(f"no CUDA GPU visible to torch {torch.__version__} (CUDA build: {torch.version.cuda}); "
                            "the GPU kernels cannot run here")
    return f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"


def _triton(device: str) -> str:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(X, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(X + offsets, tl.load(X + offsets, mask=offsets < n) + 1, mask=offsets < n)

    x = torch.arange(1000, dtype=torch.float32, device=device)
    with torch.cuda.device(x.device):
        add_one[(triton.cdiv(1000, 256),)](x, 1000, BLOCK=256)
    if not torch.equal(x.cpu(), torch.arange(1, 1001, dtype=torch.float32)):
        raise VidserveError("a trivial Triton kernel ran but computed wrong values")
    return f"triton {triton.__version__} compiles and runs (cache {os.environ['TRITON_CACHE_DIR']})"


def _sparse_attention(device: str) -> str:
    import torch

    from vidserve.kernels.dispatch import default_query_tile
    from vidserve.kernels.reference import block_sparse_attention_reference
    from vidserve.kernels.selection import select_key_tiles
    from vidserve.kernels.sparse_triton import block_sparse_attention_triton
    from vidserve.kernels.tiles import tile_layout

    grid, tile = (4, 8, 8), (4, 4, 4)  # the production tiles, 4 key tiles: 256 tokens
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 128, generator=generator).to(device) for _ in range(3))
    v = v / 4
    q_layout, k_layout = tile_layout(grid, default_query_tile(tile), device), tile_layout(grid, tile, device)
    # One selection (from fp32) for both, so only the kernel's arithmetic differs.
    selection = select_key_tiles(q_layout.to_tiles(q), k_layout.to_tiles(k), q_layout, k_layout, 0.5,
                                 neighbours=0, sink=False)
    q16, k16, v16 = (x.bfloat16() for x in (q, k, v))
    out = q_layout.from_tiles(block_sparse_attention_triton(
        q_layout.to_tiles(q16), k_layout.to_tiles(k16), k_layout.to_tiles(v16), selection, k_layout)).float()
    expected = block_sparse_attention_reference(q, k, v, selection, q_layout, k_layout)
    if not out.isfinite().all():
        raise VidserveError("the block-sparse Triton kernel returned NaN or inf on a tiny bf16 case")
    error = (out - expected).abs().max().item()
    if error > TOLERANCE:
        raise VidserveError(f"the block-sparse Triton kernel is off by {error:.2e} from the fp32 reference "
                            f"(tolerance {TOLERANCE:.0e})")
    return f"bf16 block-sparse kernel within {error:.1e} of the fp32 reference (tolerance {TOLERANCE:.0e})"
