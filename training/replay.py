"""Retrain wan-shapes from scratch as the committed weights were trained: `python -m training.replay --out DIR`.

Retraining with the committed scripts should reproduce the committed figures. The committed
weights come from many runs, some on a GPU and some stopped by a deadline (--max-seconds),
so no single command remakes them; their logs (training/vae.json and
training/transformer.json in the model folder) keep the arguments of every run, in order, and
where a deadline stopped each. This replays those runs into --out, each with --stop-at the step
its deadline stopped it at, so a replay takes the same steps on any machine. The VAE's runs go
first: after the first they train the decoder alone, while the transformer learns from the
encoder's latents, so the two models' runs need not interleave.

On 2 CPU cores the whole recipe takes most of a day (the first run of each model was an H200's:
--device cuda there); --dry-run prints the commands, --first N starts at the Nth command (1-based)
in a folder that holds the replay's result up to it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from .wan_shapes import FOLDER

NOT_FLAGS = {"out", "max_seconds", "stop_at", "started", "device"}


def runs(log_file: Path) -> list[tuple[dict, int]]:
    """(args, the step a deadline stopped it at or 0) of every run in a training log, in order.
    A resumed run's entries follow a {"resumed": k} marker."""
    record = json.loads(log_file.read_text())
    every = [*record.get("earlier_args", []), record["args"]]
    stops, run = [0] * len(every), 0
    for entry in record["log"]:
        run = entry.get("resumed", run)
        if "stopped_early_at_step" in entry and not stops[run]:  # a later phase's stop at step 0 is the same stop
            stops[run] = entry["stopped_early_at_step"]
    return list(zip(every, stops))


def flags(args: dict) -> list[str]:
    """A run's logged arguments as its command line's flags (a True one bare, a list spread)."""
    out = []
    for key, value in args.items():
        if key in NOT_FLAGS or value is False or value == "":
            continue
        out.append("--" + key.replace("_", "-"))
        if value is not True:
            out += map(str, value) if isinstance(value, list) else [str(value)]
    return out


def commands(folder: Path, out: Path, device: str | None) -> list[list[str]]:
    """Every run of the model in `folder`, as commands that write into `out`."""
    todo = [("training.train_vae", *run) for run in runs(folder / "training" / "vae.json")]
    todo += [("training.train_wan", *run) for run in runs(folder / "training" / "transformer.json")]
    return [[sys.executable, "-m", module, *flags(args), "--out", str(out), "--device", device or args["device"],
             *(["--stop-at", str(stop)] if stop else [])] for module, args, stop in todo]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="an empty folder (or one a --first N replay left)")
    parser.add_argument("--logs", default=str(FOLDER), help="the model folder whose training logs to replay")
    parser.add_argument("--device", default=None, help="every run on this device (default: each run's own)")
    parser.add_argument("--first", type=int, default=1)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    todo = commands(Path(args.logs), out, args.device)
    if not args.dry_run:
        out.mkdir(parents=True, exist_ok=True)
    for number, command in enumerate(todo[args.first - 1:], args.first):
        print(f"[{number}/{len(todo)}] {' '.join(command[1:])}", flush=True)
        if not args.dry_run:
            subprocess.run(command, check=True, cwd=Path(__file__).resolve().parents[1])


if __name__ == "__main__":
    main()
