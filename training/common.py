"""What every training script shares: its command line's common flags, the device, a
deadline, a pool that renders clips ahead of the step, and its JSON log."""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import multiprocessing
import time
from pathlib import Path

import torch


def parser(doc: str, folder: Path) -> argparse.ArgumentParser:
    """A script's parser with --seed, --out (default `folder`), --threads, --device, --workers
    and --max-seconds already on it."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(folder))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu or cuda: the same recipe runs on either")
    p.add_argument("--workers", type=int, default=0,
                   help="processes rendering training clips ahead of the step (0: render inline)")
    p.add_argument("--max-seconds", type=float, default=0,
                   help="stop training early after this long, saving what there is (0: no limit); "
                        "the log records it, and such a run is not the recipe's result")
    return p


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device.startswith("cuda"):
        # TF32 for the convolutions and matrix products: the models are float32 on disk either way.
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    args.started = time.time()
    return args


def out_of_time(args: argparse.Namespace) -> bool:
    return bool(args.max_seconds) and time.time() - args.started > args.max_seconds


def prefetch(fn, items, workers: int):
    """fn over items, in order; with workers, computed in that many forked processes at most
    2 x workers items ahead (fn must be a module-level function of numpy work)."""
    if not workers:
        yield from map(fn, items)
        return
    items = iter(items)
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        pending = collections.deque(pool.apply_async(fn, (i,)) for i in itertools.islice(items, 2 * workers))
        while pending:
            result = pending.popleft().get()
            pending.extend(pool.apply_async(fn, (i,)) for i in itertools.islice(items, 1))
            yield result


def write_log(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**record, "args": {k: v for k, v in record.get("args", {}).items() if k != "started"}}
    path.write_text(json.dumps(record, indent=1) + "\n")
