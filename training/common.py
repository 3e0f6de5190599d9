"""What every training script shares: its command line's common flags and its JSON log."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def parser(doc: str, folder: Path) -> argparse.ArgumentParser:
    """A script's parser with --seed, --out (default `folder`) and --threads already on it."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(folder))
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    return p


def parse(p: argparse.ArgumentParser) -> argparse.Namespace:
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    return args


def write_log(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
