"""Block-sparse attention in plain PyTorch: the CPU path and the fallback everywhere.

On a CPU, many tiny attention problems are slow; a few large ones run near the machine's
matmul speed. So instead of looping over tiles, a chunk of query tiles is processed at
once: one `index_select` gathers every kept key/value tile of every query tile in the
chunk, then bmm -> softmax -> bmm runs over the chunk as one batch. Plain bmm/softmax/bmm
beats SDPA on these gathered blocks on CPU (most clearly in bf16). Chunks are small enough
for the gathered K/V to stay in cache, and every chunk reuses the same buffers.

Threads: on CPU, each of `torch.get_num_threads()` Python threads takes chunks from a
shared queue and runs its ops single-threaded, instead of every op splitting across all
threads. Same speed on an idle machine, but no barrier after each of the ~1000 ops per
call: when another process competes for the cores, intra-op threading made this path up
to 12x slower (each op waits for its slowest thread), while chunk-level threads just slow
down by the share of CPU they lose, like dense SDPA does.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from .selection import TileSelection
from .tiles import TileLayout

# Bytes of gathered K+V per chunk and thread. On the 2-core reference CPU (1 MiB L2 per
# core, 32 MiB L3), 1-4 MiB run within a few % of each other; 2 MiB was best for bf16.
CPU_CHUNK_BYTES = 2 << 20
# On a GPU, chunks only bound the memory of the gathered K/V.
GPU_CHUNK_BYTES = 1 << 30


def block_sparse_attention_torch(
    q_tiles: torch.Tensor,
    k_tiles: torch.Tensor,
    v_tiles: torch.Tensor,
    selection: TileSelection,
    k_layout: TileLayout,
    chunk_bytes: int | None = None,
) -> torch.Tensor:
    """Tiled q [B, heads, nq, Tq, d], k/v [B, heads, nk, Tk, d] -> output [B, heads, nq, Tq, d]."""
    b, h, n_q, t_q, d = q_tiles.shape
    n_k, t_k = k_tiles.shape[2:4]
    kept = selection.max_kept
    n_rows = b * h * n_q
    on_cpu = q_tiles.device.type == "cpu"

    # One flat batch of (batch, head, tile) rows; a kept key tile's row is bh * n_k + id.
    attend = _ChunkAttention(
        q_rows=q_tiles.reshape(n_rows, t_q, d),
        k_rows=k_tiles.reshape(b * h * n_k, t_k, d),
        v_rows=v_tiles.reshape(b * h * n_k, t_k, d),
        kv_rows=(selection.key_tiles + torch.arange(b * h, device=q_tiles.device).view(b, h, 1, 1) * n_k).reshape(
            n_rows, kept
        ),
        key_tiles=selection.key_tiles.reshape(n_rows, kept),
        counts=selection.counts.reshape(n_rows),
        k_layout=k_layout,
    )

    if chunk_bytes is None:
        chunk_bytes = CPU_CHUNK_BYTES if on_cpu else GPU_CHUNK_BYTES
    chunk = max(1, min(n_rows, chunk_bytes // (2 * kept * t_k * d * k_tiles.element_size())))
    starts = iter(range(0, n_rows, chunk))
    intra_op_threads = torch.get_num_threads()
    threads = min(intra_op_threads, -(-n_rows // chunk)) if on_cpu else 1
    if threads == 1:
        attend.run(starts, chunk)
        return attend.out.view(b, h, n_q, t_q, d)

    claim = threading.Lock()

    def next_start():
        with claim:
            return next(starts, None)

    # Autograd and inference mode are thread-local: the workers take the caller's, so
    # inference tensors (a pipeline runs under torch.inference_mode) can be written.
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def worker():
        # Sets this thread's OpenMP/MKL thread count (thread-local), and also the default
        # for threads created later, which the caller restores below.
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            attend.run(iter(next_start, None), chunk)

    try:
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(worker) for _ in range(threads)]:
                done.result()
    finally:
        torch.set_num_threads(intra_op_threads)
    return attend.out.view(b, h, n_q, t_q, d)


class _ChunkAttention:
    """Attention of chunks of query rows over their gathered key/value tiles, into `out`."""

    def __init__(self, q_rows, k_rows, v_rows, kv_rows, key_tiles, counts, k_layout: TileLayout):
        self.q_rows, self.k_rows, self.v_rows, self.kv_rows = q_rows, k_rows, v_rows, kv_rows
        self.key_tiles = key_tiles
        self.out = torch.empty_like(q_rows)
        self.scale = q_rows.shape[-1] ** -0.5
        # Key slots that must get no weight get -inf added to their scores: padded slots of
        # edge tiles, and list entries past a query tile's count. Usually there are neither.
        self.padding_bias = _padding_bias(k_layout, q_rows.dtype)
        unused = torch.arange(kv_rows.shape[1], device=counts.device) >= counts[:, None]
        self.unused = unused if bool(unused.any()) else None

    def run(self, starts, chunk: int) -> None:
        """Attend every chunk of rows [start, start + chunk) for start in `starts`."""
        (_, t_q, d), (_, t_k, _), kept = self.q_rows.shape, self.k_rows.shape, self.kv_rows.shape[1]
        n_rows = self.q_rows.shape[0]
        # Buffers reused by every chunk: fresh multi-MiB tensors per chunk come straight from
        # the OS, and their page faults cost as much as the matmuls.
        k_buffer = self.q_rows.new_empty(chunk * kept, t_k, d)
        v_buffer = self.q_rows.new_empty(chunk * kept, t_k, d)
        q_buffer = self.q_rows.new_empty(chunk, t_q, d)
        scores_buffer = self.q_rows.new_empty(chunk, t_q, kept * t_k)
        for start in starts:
            stop = min(start + chunk, n_rows)
            rows = stop - start
            kv_ids = self.kv_rows[start:stop].flatten()
            k = torch.index_select(self.k_rows, 0, kv_ids, out=k_buffer[: rows * kept]).view(rows, kept * t_k, d)
            v = torch.index_select(self.v_rows, 0, kv_ids, out=v_buffer[: rows * kept]).view(rows, kept * t_k, d)
            # q has d columns, the scores kept * t_k: q is the cheaper place for the softmax scale.
            q = torch.mul(self.q_rows[start:stop], self.scale, out=q_buffer[:rows])
            scores = scores_buffer[:rows]
            if self.padding_bias is None and self.unused is None:
                torch.bmm(q, k.transpose(1, 2), out=scores)
            else:
                torch.baddbmm(self._bias(start, stop, t_k), q, k.transpose(1, 2), out=scores)
            torch.bmm(torch.softmax(scores, dim=-1, out=scores), v, out=self.out[start:stop])

    def _bias(self, start: int, stop: int, t_k: int) -> torch.Tensor:
        """[rows, 1, kept * Tk] additive bias of the gathered key slots of rows start:stop."""
        rows, kept = stop - start, self.key_tiles.shape[1]
        if self.padding_bias is None:
            bias = self.q_rows.new_zeros(rows, kept, t_k)
        else:
            bias = self.padding_bias.index_select(0, self.key_tiles[start:stop].flatten()).view(rows, kept, t_k)
        if self.unused is not None:
            bias.masked_fill_(self.unused[start:stop, :, None], float("-inf"))
        return bias.view(rows, 1, kept * t_k)


def _padding_bias(k_layout: TileLayout, dtype: torch.dtype) -> torch.Tensor | None:
    """[n_key_tiles, Tk]: 0 for real key slots, -inf for padded ones; None without padding."""
    if not k_layout.has_padding:
        return None
    slot = torch.arange(k_layout.tile_size, device=k_layout.counts.device)
    bias = torch.zeros(k_layout.n_tiles, k_layout.tile_size, dtype=dtype, device=slot.device)
    return bias.masked_fill_(slot >= k_layout.counts[:, None], float("-inf"))
