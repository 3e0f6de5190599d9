"""Attention over a paged KV cache on CPU: which way of reading the blocks is fastest.

One layer's attention call at the chat benchmark model's shapes (16 query heads, 4 KV heads,
head dim 64, float32; benchmarks/chat.py), its keys and values in a pool of 16-token blocks
handed out in shuffled order, as a busy server's are. Each variant writes the step's new keys
and values into their blocks and attends:

  contiguous      no pages: the cache as transformers' DynamicCache keeps it, each step
                  concatenating the new token (torch.cat copies it all) and SDPA; the reference;
  gathered-folded whole blocks gathered (`index_select`) into SDPA; for decoding, the query
                  heads sharing a KV head folded into the query axis (what vidserve runs);
  gathered-gqa    the same gather, SDPA with `enable_gqa`;
  per-sequence    the same gather, one SDPA call per sequence, no padding;
  cascade         decoding sequences that begin with the same blocks (a shared system prompt): those
                  gathered once and attended by every query in one call, each sequence's own blocks
                  as gathered-folded, the two joined by their log-sum-exps (what vidserve runs when
                  at least 8 blocks are shared);
  flex            `torch.compile`d flex_attention reading the pool itself through a block mask
                  made from the block tables (compiled once per shape, not timed).

Shapes: decode (16 sequences, one new token each, contexts of 100-256 tokens as in the
throughput workload, then 1,500-1,756 with the first 1,504 shared, as in the multi-turn one)
and one prefill piece (100 new tokens over a cached 1,600-token prefix).

    python benchmarks/paged_attention.py [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, DIM, BLOCK = 16, 4, 64, 16
REPEATS = 30


class Case:
    """Sequences' contexts (tokens before the new ones) and new tokens, their blocks shuffled in a pool."""

    def __init__(self, contexts: list[int], new: int, shared: int = 0, seed: int = 0):
        """`shared`: the first tokens of every sequence, in blocks they all hold (a common system prompt)."""
        gen = torch.Generator().manual_seed(seed)
        self.contexts, self.new, self.shared = contexts, new, shared // BLOCK
        self.lengths = [c + new for c in contexts]
        counts = [-(-n // BLOCK) - self.shared for n in self.lengths]
        order = torch.randperm(self.shared + sum(counts) + 8, generator=gen)
        common, at = order[:self.shared], self.shared
        self.tables = []
        for n in counts:
            self.tables.append(torch.cat([common, order[at:at + n]]))
            at += n
        blocks = len(order)
        self.keys = torch.randn(blocks, BLOCK, KV_HEADS, DIM, generator=gen)
        self.values = torch.randn(blocks, BLOCK, KV_HEADS, DIM, generator=gen)
        self.query = torch.randn(len(contexts), HEADS, new, DIM, generator=gen)
        self.new_keys = torch.randn(len(contexts), KV_HEADS, new, DIM, generator=gen)
        self.new_values = torch.randn(len(contexts), KV_HEADS, new, DIM, generator=gen)
        self.slots = torch.cat([table[torch.arange(c, c + new) // BLOCK] * BLOCK + torch.arange(c, c + new) % BLOCK
                                for table, c in zip(self.tables, contexts)])
        most = max(len(t) for t in self.tables)
        self.padded = torch.stack([F.pad(t, (0, most - len(t))) for t in self.tables])
        positions = torch.arange(most * BLOCK)
        # [seqs, 1, new, most*BLOCK]: each query sees its own sequence's keys up to itself
        last = torch.tensor(contexts)[:, None] + torch.arange(new)  # [seqs, new]: each query's own position
        self.mask = (positions[None, None] <= last[:, :, None])[:, None]
        longest = max(contexts)
        self.padded_keys = torch.randn(len(contexts), KV_HEADS, longest, DIM, generator=gen)
        self.padded_values = torch.randn(len(contexts), KV_HEADS, longest, DIM, generator=gen)
        left = torch.arange(longest + new)[None] >= (longest - torch.tensor(contexts))[:, None]  # [seqs, keys]
        causal = torch.arange(longest + new)[None] <= (longest + torch.arange(new))[:, None]  # [new, keys]
        self.left_mask = (left[:, None] & causal[None])[:, None]

    def write(self) -> None:
        flat_k, flat_v = self.keys.view(-1, KV_HEADS, DIM), self.values.view(-1, KV_HEADS, DIM)
        flat_k.index_copy_(0, self.slots, self.new_keys.transpose(1, 2).reshape(-1, KV_HEADS, DIM))
        flat_v.index_copy_(0, self.slots, self.new_values.transpose(1, 2).reshape(-1, KV_HEADS, DIM))

    def gather(self, pool: torch.Tensor, table: torch.Tensor, rows: int) -> torch.Tensor:
        return pool.index_select(0, table.reshape(-1)).view(rows, -1, KV_HEADS, DIM).transpose(1, 2)


def contiguous(case: Case) -> None:
    """DynamicCache as the engine kept it before pages: one left-padded cache, cat the new keys."""
    k = torch.cat([case.padded_keys, case.new_keys], dim=2)
    v = torch.cat([case.padded_values, case.new_values], dim=2)
    F.scaled_dot_product_attention(case.query, k, v, attn_mask=case.left_mask, enable_gqa=True)


def gathered_folded(case: Case) -> None:
    case.write()
    n = len(case.contexts)
    k, v = case.gather(case.keys, case.padded, n), case.gather(case.values, case.padded, n)
    if case.new == 1:
        q = case.query[:, :, 0].reshape(n, KV_HEADS, HEADS // KV_HEADS, DIM)
        F.scaled_dot_product_attention(q, k, v, attn_mask=case.mask[:, :, :1])
    else:
        F.scaled_dot_product_attention(case.query, k, v, attn_mask=case.mask, enable_gqa=True)


def gathered_gqa(case: Case) -> None:
    case.write()
    n = len(case.contexts)
    k, v = case.gather(case.keys, case.padded, n), case.gather(case.values, case.padded, n)
    F.scaled_dot_product_attention(case.query, k, v, attn_mask=case.mask, enable_gqa=True)


def per_sequence(case: Case) -> None:
    case.write()
    for i, (table, length) in enumerate(zip(case.tables, case.lengths)):
        k = case.gather(case.keys, table, 1)[:, :, :length]
        v = case.gather(case.values, table, 1)[:, :, :length]
        mask = case.mask[i:i + 1, :, :, :length]
        F.scaled_dot_product_attention(case.query[i:i + 1], k, v, attn_mask=mask, enable_gqa=True)


def cascade(case: Case) -> None:
    """The shared blocks read once for all queries, each sequence's own apart, joined by log-sum-exp."""
    case.write()
    n, own = len(case.contexts), case.padded[:, case.shared:]
    q = case.query[:, :, 0].reshape(n, KV_HEADS, HEADS // KV_HEADS, DIM)
    mask = torch.zeros(n, 1, 1, own.shape[1] * BLOCK).masked_fill_(~case.mask[:, :, :1, case.shared * BLOCK:],
                                                                  float("-inf"))
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    o, lse = flash(q, case.gather(case.keys, own, n), case.gather(case.values, own, n), 0.0, False, attn_mask=mask)
    common = case.tables[0][:case.shared]
    shared, shared_lse = flash(q.transpose(0, 1).reshape(1, KV_HEADS, -1, DIM), case.gather(case.keys, common, 1),
                               case.gather(case.values, common, 1), 0.0, False)
    shared = shared.view(KV_HEADS, n, -1, DIM).transpose(0, 1)
    shared_lse = shared_lse.view(KV_HEADS, n, -1).transpose(0, 1)
    top = torch.maximum(lse, shared_lse)
    w, ws = (lse - top).exp()[..., None], (shared_lse - top).exp()[..., None]
    (o * w + shared * ws) / (w + ws)


def flex(case: Case):
    """flex_attention over the whole pool, the block tables turned into a block mask."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, slots = len(case.contexts), case.keys.shape[0] * BLOCK
    owner = torch.full((slots,), -1)
    logical = torch.zeros(slots, dtype=torch.long)
    for i, table in enumerate(case.tables):
        for j, block in enumerate(table.tolist()):
            owner[block * BLOCK:(block + 1) * BLOCK] = i
            logical[block * BLOCK:(block + 1) * BLOCK] = torch.arange(j * BLOCK, (j + 1) * BLOCK)
    contexts = torch.tensor(case.contexts)

    def visible(b, h, q, kv):
        return (owner[kv] == b) & (logical[kv] <= contexts[b] + q)

    block_mask = create_block_mask(visible, n, None, case.new, slots, device="cpu", BLOCK_SIZE=64)
    attend = torch.compile(flex_attention, dynamic=False)

    def run() -> None:
        case.write()
        k = case.keys.view(1, -1, KV_HEADS, DIM).transpose(1, 2).expand(n, -1, -1, -1)
        v = case.values.view(1, -1, KV_HEADS, DIM).transpose(1, 2).expand(n, -1, -1, -1)
        attend(case.query, k, v, block_mask=block_mask, enable_gqa=True)

    return run


def timed(runs: dict) -> dict:
    """Median ms of each run, the runs taken in turn, round after round, so that a change in the
    machine's load falls on all of them alike."""
    for run in runs.values():
        run()  # warm-up
    times = {name: [] for name in runs}
    for _ in range(REPEATS):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: round(statistics.median(t) * 1000, 3) for name, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "paged_attention.json")
    args = parser.parse_args()
    spread = torch.linspace(0, 1, 16)
    cases = {
        "decode 16 x 100-256": Case([int(100 + 156 * s) for s in spread], 1),
        "decode 16 x 1500-1756, 1,504 shared": Case([int(1500 + 256 * s) for s in spread], 1, shared=1504),
        "prefill 100 over 1600": Case([1600], 100),
    }
    variants = {"contiguous": contiguous, "gathered-folded": gathered_folded, "gathered-gqa": gathered_gqa,
                "per-sequence": per_sequence, "cascade": cascade}
    rows = []
    load = os.getloadavg()[0]
    with torch.inference_mode():
        for name, case in cases.items():
            row = {"shape": name}
            runs = {variant: (lambda fn=fn: fn(case)) for variant, fn in variants.items()
                    if not (variant == "gathered-gqa" and case.new > 1)  # one query row per head: the same
                    and not (variant == "cascade" and not case.shared)}
            start = time.perf_counter()
            try:
                runs["flex"] = flex(case)
                runs["flex"]()
                row["flex_compile_s"] = round(time.perf_counter() - start, 1)
            except Exception as exc:  # noqa: BLE001 - reported, not hidden
                row["flex"] = f"failed: {type(exc).__name__}: {str(exc)[:120]}"
            row.update(timed(runs))
            rows.append(row)
            print(row, file=sys.stderr)
    machine = {"cpu_count": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
               "python": platform.python_version(), "loadavg_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"machine": machine, "ms_per_layer_call": rows}, indent=2) + "\n")
    names = ["contiguous", "gathered-folded", "gathered-gqa", "per-sequence", "cascade", "flex"]
    print("\n| shape | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for row in rows:
        cells = [row.get(n, "") for n in names]
        print(f"| {row['shape']} | " + " | ".join(f"{c:.2f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    print(f"\nms per layer call, median of {REPEATS} rounds; machine {machine}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
