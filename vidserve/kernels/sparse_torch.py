"""Block-sparse attention in plain PyTorch: the CPU path and the fallback everywhere.

On a CPU, many tiny attention problems are slow; a few large ones run near the machine's
matmul speed. So instead of looping over tiles, a chunk of query tiles is processed at
once: one `index_select` gathers every kept key/value tile of every query tile in the
chunk, then bmm -> softmax -> bmm runs over the chunk as one batch. Plain bmm/softmax/bmm
beats SDPA on these gathered blocks on CPU (most clearly in bf16). Chunks are small enough
for the gathered K/V to stay in cache, and every chunk reuses the same buffers.

Query tiles may keep different numbers of key tiles ("mass" selection). Rows (batch, head,
query tile) are ordered by their count and chunked among rows of the same count, so each
chunk gathers and multiplies exactly the tiles its rows keep and no work goes to padding.

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

    # Rows by descending count (the longest lists first, so the threads finish together);
    # the chunk plan needs the counts on the host, the one device-to-host copy of this path.
    counts = selection.counts.reshape(n_rows)
    order = counts.argsort(descending=True, stable=True)
    rows_per_count = torch.bincount(counts, minlength=kept + 1).tolist()
    if chunk_bytes is None:
        chunk_bytes = CPU_CHUNK_BYTES if on_cpu else GPU_CHUNK_BYTES
    tile_bytes = 2 * t_k * d * k_tiles.element_size()  # one gathered key + value tile
    chunks, stop = [], 0  # (start, stop, count) in `order`
    for count in range(kept, 0, -1):
        start, stop = stop, stop + rows_per_count[count]
        step = max(1, chunk_bytes // (count * tile_bytes))
        chunks += [(i, min(i + step, stop), count) for i in range(start, stop, step)]

    # One flat batch of (batch, head, tile) rows; a kept key tile's row is bh * n_k + id.
    kv_rows = selection.key_tiles + torch.arange(b * h, device=q_tiles.device).view(b, h, 1, 1) * n_k
    attend = _ChunkAttention(
        q_rows=q_tiles.reshape(n_rows, t_q, d),
        k_rows=k_tiles.reshape(b * h * n_k, t_k, d),
        v_rows=v_tiles.reshape(b * h * n_k, t_k, d),
        order=order,
        kv_rows=kv_rows.reshape(n_rows, kept)[order],
        key_tiles=selection.key_tiles.reshape(n_rows, kept)[order],
        k_layout=k_layout,
        most_rows=max(stop - start for start, stop, _ in chunks),
        most_tiles=max((stop - start) * count for start, stop, count in chunks),
    )
    queue = iter(chunks)
    intra_op_threads = torch.get_num_threads()
    threads = min(intra_op_threads, len(chunks)) if on_cpu else 1
    if threads == 1:
        attend.run(queue)
        return attend.out.view(b, h, n_q, t_q, d)

    claim = threading.Lock()

    def next_chunk():
        with claim:
            return next(queue, None)

    # Autograd and inference mode are thread-local: the workers take the caller's, so
    # inference tensors (a pipeline runs under torch.inference_mode) can be written.
    inference, grad = torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    def worker():
        # Sets this thread's OpenMP/MKL thread count (thread-local), and also the default
        # for threads created later, which the caller restores below.
        torch.set_num_threads(1)
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            attend.run(iter(next_chunk, None))

    try:
        with ThreadPoolExecutor(threads) as pool:
            for done in [pool.submit(worker) for _ in range(threads)]:
                done.result()
    finally:
        torch.set_num_threads(intra_op_threads)
    return attend.out.view(b, h, n_q, t_q, d)


class _ChunkAttention:
    """Attention of chunks of query rows over their gathered key/value tiles, into `out`.

    Row lists (`kv_rows`, `key_tiles`) are in `order`, so a chunk is a slice of them."""

    def __init__(self, q_rows, k_rows, v_rows, order, kv_rows, key_tiles, k_layout: TileLayout,
                 most_rows: int, most_tiles: int):
        self.q_rows, self.k_rows, self.v_rows = q_rows, k_rows, v_rows
        self.order, self.kv_rows, self.key_tiles = order, kv_rows, key_tiles
        self.out = torch.empty_like(q_rows)
        self.scale = q_rows.shape[-1] ** -0.5
        # Padded slots of edge key tiles get -inf added to their scores; usually there are none.
        self.padding_bias = _padding_bias(k_layout, q_rows.dtype)
        self.most_rows, self.most_tiles = most_rows, most_tiles

    def run(self, chunks) -> None:
        """Attend every chunk (start, stop, count): rows order[start:stop], each over its
        first `count` key tiles."""
        (_, t_q, d), (_, t_k, _) = self.q_rows.shape, self.k_rows.shape
        # Buffers reused by every chunk: fresh multi-MiB tensors per chunk come straight from
        # the OS, and their page faults cost as much as the matmuls.
        k_buffer = self.q_rows.new_empty(self.most_tiles * t_k * d)
        v_buffer = self.q_rows.new_empty(self.most_tiles * t_k * d)
        q_buffer = self.q_rows.new_empty(self.most_rows * t_q * d)
        out_buffer = self.q_rows.new_empty(self.most_rows * t_q * d)
        scores_buffer = self.q_rows.new_empty(self.most_tiles * t_q * t_k)
        for start, stop, count in chunks:
            rows, width = stop - start, count * t_k
            kv_ids = self.kv_rows[start:stop, :count].flatten()
            row_ids = self.order[start:stop]
            k = torch.index_select(self.k_rows, 0, kv_ids, out=k_buffer[: rows * width * d].view(-1, t_k, d))
            v = torch.index_select(self.v_rows, 0, kv_ids, out=v_buffer[: rows * width * d].view(-1, t_k, d))
            k, v = k.view(rows, width, d), v.view(rows, width, d)
            q = torch.index_select(self.q_rows, 0, row_ids, out=q_buffer[: rows * t_q * d].view(rows, t_q, d))
            scores = scores_buffer[: rows * t_q * width].view(rows, t_q, width)
            # The softmax scale is the matmul's alpha: free, unlike a pass over q or the scores.
            if self.padding_bias is None:
                torch.baddbmm(scores, q, k.transpose(1, 2), beta=0, alpha=self.scale, out=scores)
            else:
                bias = self.padding_bias.index_select(0, self.key_tiles[start:stop, :count].flatten())
                torch.baddbmm(bias.view(rows, 1, width), q, k.transpose(1, 2), alpha=self.scale, out=scores)
            out = out_buffer[: rows * t_q * d].view(rows, t_q, d)
            torch.bmm(torch.softmax(scores, dim=-1, out=scores), v, out=out)
            self.out.index_copy_(0, row_ids, out)


def _padding_bias(k_layout: TileLayout, dtype: torch.dtype) -> torch.Tensor | None:
    """[n_key_tiles, Tk]: 0 for real key slots, -inf for padded ones; None without padding."""
    if not k_layout.has_padding:
        return None
    slot = torch.arange(k_layout.tile_size, device=k_layout.counts.device)
    bias = torch.zeros(k_layout.n_tiles, k_layout.tile_size, dtype=dtype, device=slot.device)
    return bias.masked_fill_(slot >= k_layout.counts[:, None], float("-inf"))
