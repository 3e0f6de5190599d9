"""The first job on a fresh server against the second, identical one: what warm-up buys.

A fresh `vidserve serve` (embedded, the default models) is started, waited for until /readyz
answers 200, then given the same job twice in a row (wan-shapes, its native 64x64, one chunk of
17 frames, 20 steps, seed 7); each is timed from POST to `completed` (polled every 20 ms), with
the server's CPU seconds over the same span (its threads and the ffmpeg it runs, from /proc: on a
shared box the steadier measure, as other work stretches wall time but not this), and the video
object's own timings (load, denoise, decode, encode). With `--warmup both`, with the
server's warm-up (VIDSERVE_WARMUP=1) and without, alternately, `--repeats` fresh servers each.

    python benchmarks/first_job.py [--warmup on|off|both] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from api_overhead import completed_video, server_process

JOB = {"model": "wan-shapes", "prompt": "a red circle moving left on a black background", "seed": 7}
POLL_S = 0.02


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, its waited-for children's included (utime, stime, cutime, cstime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(ticks) for ticks in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def timed_job(client: httpx.Client, url: str, pid: int) -> dict:
    start, cpu = time.perf_counter(), cpu_seconds(pid)
    video = completed_video(client, url, JOB, POLL_S)
    return {"seconds": round(time.perf_counter() - start, 3), "cpu_seconds": round(cpu_seconds(pid) - cpu, 2),
            "timings": {k: round(v, 3) for k, v in video["timings"].items() if not k.startswith("encode.")}}


def measure(tmp: Path, warmup: bool) -> dict:
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=30))
        started = time.perf_counter()
        url, proc = server_process(stack, tmp, {"VIDSERVE_WARMUP": "1" if warmup else "0"}, [])
        ready = time.perf_counter() - started
        first, second = timed_job(client, url, proc.pid), timed_job(client, url, proc.pid)
    return {"warmup": warmup, "ready_seconds": round(ready, 2), "first": first, "second": second,
            "ratio": round(first["seconds"] / second["seconds"], 2),
            "cpu_ratio": round(first["cpu_seconds"] / second["cpu_seconds"], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", choices=["on", "off", "both"], default="both")
    parser.add_argument("--repeats", type=int, default=3, help="fresh servers per mode")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "first_job.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so the servers are stopped
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.warmup] * args.repeats
    results = []
    for warmup in modes:
        with tempfile.TemporaryDirectory(prefix="vidserve-first-job-") as tmp:
            results.append(measure(Path(tmp), warmup))
        r = results[-1]
        print(f"warm-up {'on ' if warmup else 'off'}: ready after {r['ready_seconds']} s; first job "
              f"{r['first']['seconds']} s ({r['first']['cpu_seconds']} CPU s) {r['first']['timings']}, second "
              f"{r['second']['seconds']} s ({r['second']['cpu_seconds']} CPU s); first/second {r['ratio']}x "
              f"(CPU {r['cpu_ratio']}x)", flush=True)
    medians = {mode: {key: statistics.median(r[key] for r in results if r["warmup"] == mode)
                      for key in ("ratio", "cpu_ratio", "ready_seconds")} for mode in set(modes)}
    for mode, median in sorted(medians.items()):
        print(f"warm-up {'on' if mode else 'off'}, medians over {args.repeats} servers: first/second "
              f"{median['ratio']}x, CPU {median['cpu_ratio']}x; ready after {median['ready_seconds']} s")
    import torch

    machine = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"job": JOB, "machine": machine, "results": results,
                                     "medians": {"on" if k else "off": v for k, v in medians.items()}},
                                    indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
