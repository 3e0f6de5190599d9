"""What the HTTP API and the queue add on top of the model.

One tiny job (wan-tiny, 64x64, 33 frames, 4 steps, fixed seed), timed end to end three ways:
  direct    pipe.generate + encode_mp4 in this process, model already loaded;
  embedded  `vidserve serve`: POST /v1/videos, poll GET until completed, download the MP4;
  celery    the same against `vidserve serve --queue celery` + one worker + redis-server.

    python benchmarks/api_overhead.py [--runs 10] [--skip-celery] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

JOB = {"model": "wan-tiny", "prompt": "a red fox", "size": "64x64", "num_frames": 33, "num_inference_steps": 4, "seed": 1}
WARMUP = 2  # the first jobs load the model and warm caches in whichever process runs them
POLL_S = 0.01
JOB_TIMEOUT_S = 300
START_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, proc: subprocess.Popen, log: Path, what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{what} did not come up:\n{tail}")
        time.sleep(0.1)


def spawn(stack: ExitStack, cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a process logging to a file (a pipe nobody drains would block it); stopped when the stack closes."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    return stopped_with(stack, proc)


def stopped_with(stack: ExitStack, proc: subprocess.Popen) -> subprocess.Popen:
    """`proc`, terminated when the stack closes (killed if it takes over 15 s)."""
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    stack.callback(stop)
    return proc


def vidserve(*args: str) -> list[str]:
    return [sys.executable, "-m", "vidserve.cli", *args, "--device", "cpu", "--dtype", "float32"]


def start_server(stack: ExitStack, tmp: Path, env: dict[str, str], extra: list[str]) -> str:
    return server_process(stack, tmp, env, extra)[0]


def server_process(stack: ExitStack, tmp: Path, env: dict[str, str],
                   extra: list[str]) -> tuple[str, subprocess.Popen]:
    """A `vidserve serve` in `tmp`, once ready: its URL and process (stopped when the stack closes)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # --log-level warning: no access-log line per 10 ms poll, which would cost this 2-core box more than the API does.
    log = tmp / "server.log"
    proc = spawn(stack, vidserve("serve", "--port", str(port), "--data-dir", str(tmp / "data"),
                                 "--log-level", "warning", *extra), log, env)

    def ready() -> bool:
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(ready, proc, log, "vidserve serve")
    return url, proc


def start_redis(stack: ExitStack, tmp: Path, exe: str) -> str:
    port, log = free_port(), tmp / "redis.log"
    proc = spawn(stack, [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                         "--dir", str(tmp)], log)

    def pongs() -> bool:  # raw RESP, so the benchmark needs no redis client
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    wait_until(pongs, proc, log, "redis-server", timeout=10)
    return f"redis://127.0.0.1:{port}/0"


def completed_video(client: httpx.Client, url: str, job: dict, poll_s: float = POLL_S) -> dict:
    """POST `job`, then poll it every `poll_s` until it is completed: its video object."""
    video = client.post(f"{url}/v1/videos", json=job).raise_for_status().json()
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while video["status"] != "completed":
        if video["status"] in ("failed", "cancelled") or time.monotonic() > deadline:
            raise RuntimeError(f"job {video['id']} ended {video['status']}: {video.get('error')}")
        time.sleep(poll_s)
        video = client.get(f"{url}/v1/videos/{video['id']}").raise_for_status().json()
    return video


def api_job(client: httpx.Client, url: str) -> None:
    """POST, poll until completed, download the MP4: what a client waits for."""
    video = completed_video(client, url, JOB)
    mp4 = client.get(f"{url}/v1/videos/{video['id']}/content").raise_for_status().content
    assert len(mp4) > 0, "empty MP4"


def direct_job_fn(tmp: Path):
    from vidserve.config import Settings
    from vidserve.media import encode_mp4
    from vidserve.pipelines.video import get_pipeline
    from vidserve.registry import resolve
    from vidserve.options import GenerationOptions
    from vidserve.video_request import build_request

    spec = resolve(JOB["model"])
    pipe = get_pipeline(spec, "cpu", "float32")  # loaded once, outside the timings, as a server holds it
    req = build_request(spec, Settings(), JOB["prompt"],
                        GenerationOptions(steps=JOB["num_inference_steps"], seed=JOB["seed"]), size=JOB["size"],
                        num_frames=JOB["num_frames"])
    return lambda: encode_mp4(pipe.generate(req).frames, tmp / "direct.mp4", fps=req.fps)


def summarize(name: str, times: list[float]) -> dict:
    ordered = sorted(times)
    p90 = ordered[math.ceil(0.9 * len(ordered)) - 1]  # nearest rank: an observed time, fine for small N
    return {"name": name, "median_ms": round(statistics.median(times), 1), "p90_ms": round(p90, 1),
            # min: the least-disturbed run, the best guess at the intrinsic cost when the box is shared
            "min_ms": round(ordered[0], 1), "runs": len(times), "samples_ms": [round(t, 1) for t in times]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="timed runs per mode, after %d warm-ups" % WARMUP)
    parser.add_argument("--skip-celery", action="store_true", help="skip the Celery + Redis mode")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "api_overhead.json")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    # SIGTERM would end Python without unwinding; as SystemExit, the ExitStack below still stops the servers.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    redis_exe = shutil.which("redis-server")
    if not args.skip_celery and redis_exe is None:
        print("redis-server not on PATH: skipping the celery mode", file=sys.stderr)
        args.skip_celery = True

    with ExitStack() as stack:  # closing it stops every process and removes the temp dir, on errors and Ctrl-C too
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vidserve-bench-")))
        client = stack.enter_context(httpx.Client(timeout=30))
        print("loading the model in-process and starting the servers ...", file=sys.stderr)
        jobs = {"direct": direct_job_fn(tmp)}
        (tmp / "embedded").mkdir()
        embedded_url = start_server(stack, tmp / "embedded", {}, [])
        jobs["embedded"] = lambda: api_job(client, embedded_url)
        if not args.skip_celery:
            (tmp / "celery").mkdir()
            env = {"VIDSERVE_REDIS_URL": start_redis(stack, tmp / "celery", redis_exe)}
            celery_url = start_server(stack, tmp / "celery", env, ["--queue", "celery"])
            log = tmp / "celery" / "worker.log"
            worker = spawn(stack, vidserve("worker", "--model", "wan-tiny", "--data-dir",
                                           str(tmp / "celery" / "data")), log, env)
            wait_until(lambda: "ready." in log.read_text(errors="replace"), worker, log, "vidserve worker")
            jobs["celery"] = lambda: api_job(client, celery_url)

        for name, job in jobs.items():
            for _ in range(WARMUP):
                job()
        # Round-robin, not one mode after another: on a shared 2-core box, background load that comes
        # and goes then hits every mode alike instead of skewing one. Idle servers cost next to nothing.
        times = {name: [] for name in jobs}
        load_before = os.getloadavg()[0]
        for i in range(args.runs):
            for name, job in jobs.items():
                start = time.perf_counter()
                job()
                times[name].append((time.perf_counter() - start) * 1000)
                print(f"  run {i + 1}/{args.runs} {name}: {times[name][-1]:.0f} ms", file=sys.stderr)
        load_after = os.getloadavg()[0]
    results = [summarize(name, t) for name, t in times.items()]

    import torch

    config = {**JOB, "runs": args.runs, "warmup": WARMUP, "poll_interval_ms": POLL_S * 1000, "device": "cpu",
              "dtype": "float32", "cpu_count": os.cpu_count(), "torch": torch.__version__,
              "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
              "loadavg_1m_before_after": [round(load_before, 2), round(load_after, 2)], "order": "round-robin"}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")

    direct = results[0]["median_ms"]
    print("\n| mode | median ms | p90 ms | min ms | overhead vs direct (median) | ratio |\n|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['name']} | {r['median_ms']:.0f} | {r['p90_ms']:.0f} | {r['min_ms']:.0f} | "
              f"{r['median_ms'] - direct:+.0f} ms | {r['median_ms'] / direct:.2f}x |")
    print(f"\n{args.runs} runs each, round-robin, after {WARMUP} warm-ups; 1-min load {load_before:.1f} -> "
          f"{load_after:.1f}; JSON in {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
