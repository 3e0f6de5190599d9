"""Block-sparse flash attention forward in Triton (the CUDA path).

One program handles one query tile of one (batch, head): it loads the query tile once,
then walks that tile's list of kept key tiles, and for each one loads the key/value tile,
computes the scores and folds them into an online softmax (running max `m`, running sum
`l`, rescaled accumulator), as in FlashAttention. Only kept tiles are ever read, and each
program walks only its own list's count, so lists of different lengths per query tile and
head ("mass" selection) cost what they keep.

Inputs are in tile order (see tiles.py): every tile is a contiguous block of `tile_size`
tokens, real tokens first, so a key tile's padded slots are exactly the slots at or past
its real-token count and are masked to -inf. The dtype follows the inputs (fp16/bf16 on
CUDA; fp32 too, computed with IEEE dots so it can be checked against the reference).

Triton is optional: without it, `triton_available()` is False and the dispatcher never
picks this path. Under TRITON_INTERPRET=1 the same kernel runs on CPU tensors (fp32/fp16,
small shapes), which is how the tests check it on machines without a GPU.
"""

from __future__ import annotations

import contextlib

import torch

from .selection import TileSelection
from .support import LaunchConfig, block, launch_config
from .tiles import TileLayout

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is an optional (GPU) dependency
    triton = None


def triton_available() -> bool:
    return triton is not None


def dot_precision(dtype: torch.dtype) -> str:
    # IEEE fp32 dots keep fp32 checkable against the reference; tf32 only applies to fp32 inputs.
    return "ieee" if dtype == torch.float32 else "tf32"


def _device_guard(device: torch.device):
    """A Triton launch runs on the current CUDA device, whatever device its tensors are on:
    without this, tensors on cuda:1 are read through their pointers from cuda:0."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


if triton is not None:

    @triton.jit
    def _block_sparse_attention_kernel(
        Q, K, V, Out,  # [B*heads, n_tiles, tile_size, head_dim], contiguous
        KeyTiles,  # [B*heads, n_query_tiles, max_kept] int32
        KeptCounts,  # [B*heads, n_query_tiles] int32
        KeyRealCounts,  # [n_key_tiles] int32: real tokens per key tile
        n_query_tiles, n_key_tiles, max_kept,
        scale_log2e,  # softmax scale * log2(e): the softmax runs in base 2 (exp2 is cheaper)
        QUERY_TILE: tl.constexpr, KEY_TILE: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        query_tile = tl.program_id(0)
        bh = tl.program_id(1).to(tl.int64)  # int64: offsets of long videos overflow int32
        rows = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        dim_ok = dims[None, :] < HEAD_DIM

        q_offset = (bh * n_query_tiles + query_tile) * QUERY_TILE * HEAD_DIM
        q_tile_ptrs = rows[:, None] * HEAD_DIM + dims[None, :]
        q_mask = (rows[:, None] < QUERY_TILE) & dim_ok
        q = tl.load(Q + q_offset + q_tile_ptrs, mask=q_mask, other=0.0)

        running_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

        list_offset = bh * n_query_tiles + query_tile
        n_kept = tl.load(KeptCounts + list_offset)
        kv_tile_ptrs = cols[:, None] * HEAD_DIM + dims[None, :]
        tile_ids = KeyTiles + list_offset * max_kept
        # The next tile id is loaded one iteration early: read at the top of the loop, it is a
        # blocking scalar load the K/V copies depend on, and the software pipeliner then has to
        # wait for every outstanding copy each iteration instead of keeping tiles in flight.
        next_tile = tl.load(tile_ids)  # lists are never empty: counts >= 1
        for i in range(0, n_kept):
            key_tile = next_tile
            next_tile = tl.load(tile_ids + i + 1, mask=i + 1 < n_kept, other=0)
            n_real = tl.load(KeyRealCounts + key_tile)
            kv_offset = (bh * n_key_tiles + key_tile) * KEY_TILE * HEAD_DIM
            kv_mask = (cols[:, None] < n_real) & dim_ok
            k = tl.load(K + kv_offset + kv_tile_ptrs, mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
            scores = tl.where(cols[None, :] < n_real, scores, float("-inf"))

            new_max = tl.maximum(running_max, tl.max(scores, axis=1))
            # Until a row has seen a real key its max stays -inf (a key tile with no real
            # token first in its list), and -inf - -inf would make the whole row NaN.
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
            weights = tl.exp2(scores - shift[:, None])
            rescale = tl.exp2(running_max - shift)
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            v = tl.load(V + kv_offset + kv_tile_ptrs, mask=kv_mask, other=0.0)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=DOT_PRECISION)
            running_max = new_max

        # A query tile that keeps no key tile outputs zeros instead of 0/0.
        acc = acc / tl.where(running_sum > 0, running_sum, 1.0)[:, None]
        tl.store(Out + q_offset + q_tile_ptrs, acc.to(Out.dtype.element_ty), mask=q_mask)


def block_sparse_attention_triton(
    q_tiles: torch.Tensor,
    k_tiles: torch.Tensor,
    v_tiles: torch.Tensor,
    selection: TileSelection,
    k_layout: TileLayout,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Tiled q [B, heads, nq, Tq, d], k/v [B, heads, nk, Tk, d] -> output [B, heads, nq, Tq, d].

    num_stages: K/V buffers on a GPU; None takes support.py's (benchmarks time others)."""
    if triton is None:
        raise RuntimeError("the triton backend needs the `triton` package (pip install triton)")
    if not q_tiles.is_cuda and q_tiles.dtype == torch.bfloat16:
        # The CPU interpreter computes bf16 wrongly without any error.
        raise ValueError("the Triton interpreter (CPU tensors) supports fp32 and fp16, not bf16")
    b, h, n_q, t_q, d = q_tiles.shape
    n_k, t_k = k_tiles.shape[2:4]
    q, k, v = (x.contiguous() for x in (q_tiles, k_tiles, v_tiles))
    key_tiles = selection.key_tiles.to(torch.int32).contiguous()
    kept_counts = selection.counts.to(torch.int32).contiguous()
    key_real_counts = k_layout.counts.to(device=q.device, dtype=torch.int32)
    out = torch.empty_like(q)

    if q.is_cuda:
        config = launch_config(t_q, t_k, d, q.dtype)  # UnsupportedTile past what compiles and fits
    else:  # the interpreter has no shared memory or registers to run out of
        config = LaunchConfig(block(t_q), block(t_k), block(d), num_warps=4, num_stages=1)
    with _device_guard(q.device):
        _block_sparse_attention_kernel[(n_q, b * h)](
            q, k, v, out, key_tiles, kept_counts, key_real_counts,
            n_q, n_k, selection.max_kept,
            d**-0.5 * 1.4426950408889634,
            QUERY_TILE=t_q, KEY_TILE=t_k, HEAD_DIM=d,
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_D=config.block_d,
            DOT_PRECISION=dot_precision(q.dtype),
            num_warps=config.num_warps,
            num_stages=num_stages or config.num_stages,
        )
    return out
