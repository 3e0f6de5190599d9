"""The first job on a fresh server against the second, identical one: what warm-up buys.

A fresh `vidserve serve` (embedded, the default models) is started, waited for until /readyz
answers 200, then given the same job twice in a row (wan-shapes, its native 64x64, one chunk of
17 frames, 20 steps, seed 7); each is timed from POST to `completed` (polled every 20 ms), and the
video object's own timings (load, denoise, decode, encode) are kept. With `--warmup both`, once with
the server's warm-up (VIDSERVE_WARMUP=1) and once without.

    python benchmarks/first_job.py [--warmup on|off|both] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

from api_overhead import start_server

JOB = {"model": "wan-shapes", "prompt": "a red circle moving left on a black background", "seed": 7}
POLL_S = 0.02
JOB_TIMEOUT_S = 600


def timed_job(client: httpx.Client, url: str) -> dict:
    start = time.perf_counter()
    video = client.post(f"{url}/v1/videos", json=JOB).raise_for_status().json()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while video["status"] != "completed":
        if video["status"] in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"job {video['id']} ended {video['status']}: {video.get('error')}")
        time.sleep(POLL_S)
        video = client.get(f"{url}/v1/videos/{video['id']}").raise_for_status().json()
    return {"seconds": round(time.perf_counter() - start, 3),
            "timings": {k: round(v, 3) for k, v in video["timings"].items() if not k.startswith("encode.")}}


def measure(tmp: Path, warmup: bool) -> dict:
    with ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=30))
        started = time.perf_counter()
        url = start_server(stack, tmp, {"VIDSERVE_WARMUP": "1" if warmup else "0"}, [])
        ready = time.perf_counter() - started
        first, second = timed_job(client, url), timed_job(client, url)
    return {"warmup": warmup, "ready_seconds": round(ready, 2), "first": first, "second": second,
            "ratio": round(first["seconds"] / second["seconds"], 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", choices=["on", "off", "both"], default="both")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "first_job.json")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so the servers are stopped
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.warmup]
    results = []
    for warmup in modes:
        with tempfile.TemporaryDirectory(prefix="vidserve-first-job-") as tmp:
            results.append(measure(Path(tmp), warmup))
        r = results[-1]
        print(f"warm-up {'on ' if warmup else 'off'}: ready after {r['ready_seconds']} s; first job "
              f"{r['first']['seconds']} s {r['first']['timings']}, second {r['second']['seconds']} s "
              f"{r['second']['timings']}; first/second {r['ratio']}x", flush=True)
    import torch

    machine = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "cpus": os.cpu_count(), "load_1min": round(os.getloadavg()[0], 2)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"job": JOB, "machine": machine, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
