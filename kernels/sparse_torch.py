"""Block-sparse attention in plain PyTorch: the CPU path and the fallback everywhere.

On a CPU, many tiny attention problems are slow; a few large ones run near the machine's
matmul speed. So instead of looping over tiles, a chunk of query tiles is processed at
once: one `index_select` gathers every kept key/value tile of every query tile in the
chunk, then bmm -> softmax -> bmm runs over the chunk as one batch. Chunks are sized so
that the gathered K/V of a chunk stay in cache between the gather and the two bmms.
Plain bmm/softmax/bmm beats SDPA on these gathered blocks on CPU (most clearly in bf16).
"""

from __future__ import annotations

import torch

from .selection import TileSelection
from .tiles import TileLayout

# Bytes of gathered K+V per chunk (about one MiB-sized L2 per core); larger chunks fall out
# of cache and smaller ones pay per-call overhead. Measured on the 2-core reference CPU:
# 2-4 MiB run the same, 8 MiB runs fp32 ~1.5x slower.
CHUNK_BYTES = 4 << 20


def block_sparse_attention_torch(
    q_tiles: torch.Tensor,
    k_tiles: torch.Tensor,
    v_tiles: torch.Tensor,
    selection: TileSelection,
    k_layout: TileLayout,
    chunk_bytes: int = CHUNK_BYTES,
) -> torch.Tensor:
    """Tiled q [B, heads, nq, Tq, d], k/v [B, heads, nk, Tk, d] -> output [B, heads, nq, Tq, d]."""
    b, h, n_q, t_q, d = q_tiles.shape
    n_k, t_k = k_tiles.shape[2:4]
    kept = selection.max_kept
    scale = d**-0.5

    # One flat batch of (batch, head, tile) rows; a kept key tile's row is bh * n_k + id.
    q_rows = q_tiles.reshape(b * h * n_q, t_q, d)
    k_rows = k_tiles.reshape(b * h * n_k, t_k, d)
    v_rows = v_tiles.reshape(b * h * n_k, t_k, d)
    bh_offset = torch.arange(b * h, device=q_tiles.device).view(b, h, 1, 1) * n_k
    kv_rows = (selection.key_tiles + bh_offset).reshape(b * h * n_q, kept)

    # Key slots that must get no weight get -inf added to their scores: padded slots of edge
    # tiles, and list entries past a query tile's count. Usually there are neither.
    padding_bias = _padding_bias(k_layout, q_tiles.dtype)
    unused = torch.arange(kept, device=q_tiles.device) >= selection.counts.reshape(b * h * n_q, 1)
    if not unused.any():
        unused = None
    key_tiles = selection.key_tiles.reshape(b * h * n_q, kept)

    out = torch.empty_like(q_rows)
    # Whole multiples of the thread count: bmm splits its batch across threads.
    threads = torch.get_num_threads()
    chunk = max(1, chunk_bytes // (2 * kept * t_k * d * k_tiles.element_size()) // threads) * threads
    chunk = min(chunk, q_rows.shape[0])
    # Buffers reused by every chunk: fresh multi-MiB tensors per chunk come straight from the
    # OS, and their page faults cost as much as the matmuls.
    k_buffer = q_rows.new_empty(chunk * kept, t_k, d)
    v_buffer = q_rows.new_empty(chunk * kept, t_k, d)
    q_buffer = q_rows.new_empty(chunk, t_q, d)
    scores_buffer = q_rows.new_empty(chunk, t_q, kept * t_k)
    for start in range(0, q_rows.shape[0], chunk):
        stop = min(start + chunk, q_rows.shape[0])
        rows = stop - start
        kv_ids = kv_rows[start:stop].flatten()
        k_chunk = torch.index_select(k_rows, 0, kv_ids, out=k_buffer[: rows * kept]).view(rows, kept * t_k, d)
        v_chunk = torch.index_select(v_rows, 0, kv_ids, out=v_buffer[: rows * kept]).view(rows, kept * t_k, d)
        # q has d columns, the scores kept * t_k: scaling q is the cheaper place for the softmax scale.
        q_chunk = torch.mul(q_rows[start:stop], scale, out=q_buffer[:rows])
        scores = scores_buffer[:rows]
        if padding_bias is None and unused is None:
            torch.bmm(q_chunk, k_chunk.transpose(1, 2), out=scores)
        else:
            bias = _chunk_bias(padding_bias, unused, key_tiles, start, stop, t_k, q_tiles.dtype)
            torch.baddbmm(bias, q_chunk, k_chunk.transpose(1, 2), out=scores)
        torch.bmm(torch.softmax(scores, dim=-1, out=scores), v_chunk, out=out[start:stop])
    return out.view(b, h, n_q, t_q, d)


def _padding_bias(k_layout: TileLayout, dtype: torch.dtype) -> torch.Tensor | None:
    """[n_key_tiles, Tk]: 0 for real key slots, -inf for padded ones; None without padding."""
    if not k_layout.has_padding:
        return None
    slot = torch.arange(k_layout.tile_size, device=k_layout.counts.device)
    bias = torch.zeros(k_layout.n_tiles, k_layout.tile_size, dtype=dtype, device=slot.device)
    return bias.masked_fill_(slot >= k_layout.counts[:, None], float("-inf"))


def _chunk_bias(padding_bias, unused, key_tiles, start, stop, t_k, dtype) -> torch.Tensor:
    """[rows, 1, kept * Tk] additive bias of the gathered key slots of query rows start:stop."""
    rows, kept = stop - start, key_tiles.shape[1]
    if padding_bias is None:
        bias = torch.zeros(rows, kept, t_k, dtype=dtype, device=key_tiles.device)
    else:
        bias = padding_bias.index_select(0, key_tiles[start:stop].flatten()).view(rows, kept, t_k)
    if unused is not None:
        bias.masked_fill_(unused[start:stop, :, None], float("-inf"))
    return bias.view(rows, 1, kept * t_k)
