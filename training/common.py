"""What every training script shares: its command line's common flags, the device, a
deadline, a pool that renders clips ahead of the step, the optimizer and its schedule, the
update step, and the loss log."""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
import multiprocessing
import time
from collections.abc import Sequence
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
    p.add_argument("--stop-at", type=int, default=0,
                   help="stop the last phase at this step, as a deadline once stopped it (0: don't): how "
                        "training/replay.py repeats a run that --max-seconds cut short, on any machine")
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


def stopped_early(args: argparse.Namespace, log: list, step: int, last_phase: bool = True, **context) -> bool:
    """True once past --max-seconds, or at --stop-at in the run's last phase, with the step it
    stopped at recorded in the log."""
    if not (out_of_time(args) or last_phase and step == args.stop_at > 0):
        return False
    log.append({**context, "stopped_early_at_step": step})
    print(log[-1], flush=True)
    return True


def optimizer(params, lr: float, steps: int, warmup: int, floor: float, weight_decay: float = 0.0):
    """(AdamW, schedule): a linear warm-up over `warmup` steps, then cosine decay to floor x lr at `steps`."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * s / steps))))
    return opt, schedule


def update(opt, schedule, loss: torch.Tensor, params: list) -> None:
    """One optimizer step on `loss`, gradients clipped to norm 1."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    schedule.step()


def log_losses(log: list, losses: list, step: int, steps: int, started: float, every: int = 100) -> list:
    """Every `every` steps (and at the last) the mean of `losses` (tensors, so no sync each step)
    goes into the log and is printed; returns the losses still to be averaged."""
    if (step + 1) % every and step != steps - 1:
        return losses
    log.append({"step": step + 1, "loss": round(torch.stack(losses).mean().item(), 5),
                "seconds": round(time.time() - started, 1)})
    print(log[-1], flush=True)
    return []


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


def earlier_runs(path: Path) -> tuple[list, list]:
    """(log, args of every run so far) from the log at `path`, for a run that goes on from it."""
    earlier = json.loads(path.read_text())
    return earlier["log"], [*earlier.get("earlier_args", []), earlier["args"]]


def write_log(path: Path, record: dict, earlier_args: Sequence = ()) -> None:
    """The run's record (its args without the start time), with the args of the runs it went on from."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**record, "args": {k: v for k, v in record.get("args", {}).items() if k != "started"}}
    if earlier_args:
        record["earlier_args"] = list(earlier_args)
    path.write_text(json.dumps(record, indent=1) + "\n")
