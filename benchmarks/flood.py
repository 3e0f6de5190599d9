"""What one key's refused flood, or its held event streams, cost another key.

Key B polls GET /v1/videos (one request at a time, 5 ms apart) and its latencies are
timed while key A is quiet and while it loads the server, in three phases:
  flood      key A, over its requests_per_minute, sends POST /v1/videos from ten concurrent
             loops (an httpx client), each request answered 429;
  raw flood  the same from a client that writes raw HTTP/1.1 and so costs itself little per
             request: the server, not the client, bounds its rate;
  streams    key A holds as many GET /v1/videos/{id}/events streams as the server lets it,
             out of --streams tries at once.
Quiet and loaded windows alternate (--rounds of each, --seconds long), so load from other
work on a shared machine falls on both alike. Each phase has a fresh server: a subprocess on
loopback (this file's --serve mode: the app `vidserve serve` builds, its SQLite store, no
chat model, and a queue that runs nothing, so A's video stays queued and its streams stay
open) with a keys file of two keys; key A's load is another subprocess. Everything stops by
itself: the windows are timed, and every process has a deadline.

    python benchmarks/flood.py [--seconds 2] [--rounds 4] [--streams 200] [--json PATH]

Older code is measured by putting its tree first on PYTHONPATH (with vidserve/api,
vidserve/pipelines and vidserve/workers linked to its api/, pipelines/, workers/); the
output names the server's code.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from api_overhead import stopped_with

KEYS = {"a": "flood-key-a-0123456789", "b": "flood-key-b-0123456789"}
BODY = {"model": "wan-tiny", "prompt": "a red fox", "seconds": "1", "size": "64x64", "num_inference_steps": 1}
FLOOD_LOOPS = 10
POLL_GAP_S = 0.005
START_TIMEOUT_S = 120
MIN_REQUESTS_FOR_CPU = 2000


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def serve(port: int, data_dir: Path, keys_file: Path) -> None:
    """The server: the app as `vidserve serve` builds it, on a queue that runs nothing."""
    import uvicorn

    from vidserve.api.app import create_app
    from vidserve.api.services import Services
    from vidserve.config import Settings
    from vidserve.jobs.store_sqlite import SQLiteJobStore
    from vidserve.storage import LocalStorage
    from vidserve.telemetry import Metrics
    from vidserve.webhooks import WebhookSender, generate_secret

    class IdleQueue:
        alive = True

        def start(self) -> None: ...
        def stop(self) -> None: ...
        def submit(self, job) -> None: ...

    settings = Settings(data_dir=data_dir, chat_model="", keys_file=keys_file)
    store = SQLiteJobStore(data_dir / "jobs.sqlite")
    services = Services(settings, store, LocalStorage(data_dir / "files"), IdleQueue(), Metrics(),
                        WebhookSender(generate_secret()))
    services.metrics.watch(store)
    print(f"code: {sys.modules[create_app.__module__].__file__}", flush=True)
    uvicorn.run(create_app(settings, services), host="127.0.0.1", port=port, log_level="warning")


async def load(mode: str, url: str, video_id: str, tries: int, deadline: float) -> None:
    """Key A's load, switched by lines on stdin: `on` starts it and answers `ready N` (requests
    so far) once it runs, `off` stops it and answers its tally as JSON. Ends at EOF or the deadline."""
    loop, commands = asyncio.get_running_loop(), asyncio.Queue()

    def read_commands() -> None:  # a daemon thread: a read blocked in the loop's executor would keep us alive
        for line in sys.stdin:
            loop.call_soon_threadsafe(commands.put_nowait, line.strip())
        loop.call_soon_threadsafe(commands.put_nowait, "")

    threading.Thread(target=read_commands, daemon=True).start()
    limits = httpx.Limits(max_connections=max(tries, FLOOD_LOOPS) + 8)
    async with httpx.AsyncClient(base_url=url, headers=auth("a"), timeout=60, limits=limits) as http:
        statuses: dict[int, int] = {}
        held, loops = [], []

        async def flood_loop() -> None:
            while time.monotonic() < deadline:
                status = (await http.post("/v1/videos", json=BODY)).status_code
                statuses[status] = statuses.get(status, 0) + 1

        async def raw_flood_loop() -> None:  # raw HTTP/1.1 on one kept-alive connection
            host, port = httpx.URL(url).host, httpx.URL(url).port
            body = json.dumps(BODY).encode()
            request = (f"POST /v1/videos HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {KEYS['a']}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
            reader, writer = await asyncio.open_connection(host, port)
            try:
                while time.monotonic() < deadline:
                    writer.write(request)
                    head = (await reader.readuntil(b"\r\n\r\n")).lower()
                    status = int(head[9:12])
                    length = int(head.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                    await reader.readexactly(length)
                    statuses[status] = statuses.get(status, 0) + 1
            finally:
                writer.close()

        async def open_stream() -> None:
            response = await http.send(http.build_request("GET", f"/v1/videos/{video_id}/events"), stream=True)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            if response.status_code == 200:
                lines = response.aiter_lines()
                await anext(lines)  # the first event: the stream is open and being served
                held.append((response, lines))  # the iterator too: dropping a half-read one closes the stream
            else:
                await response.aread()
                await response.aclose()

        async def stop() -> None:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            for response, _ in held:
                await response.aclose()

        while True:
            try:
                command = await asyncio.wait_for(commands.get(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                command = ""
            if command == "on":
                statuses.clear()
                held.clear()
                if mode != "streams":
                    loop_fn = flood_loop if mode == "flood" else raw_flood_loop
                    loops[:] = [asyncio.create_task(loop_fn()) for _ in range(FLOOD_LOOPS)]
                    while sum(statuses.values()) < FLOOD_LOOPS:  # every loop is answered: all run
                        await asyncio.sleep(0.01)
                else:
                    await asyncio.gather(*(open_stream() for _ in range(tries)))
                print(f"ready {sum(statuses.values())}", flush=True)
            elif command == "off":
                await stop()
                print(json.dumps({"statuses": statuses, "held": len(held)}), flush=True)
            else:
                await stop()
                return


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(stack: ExitStack, args: list[str], log: Path | None = None) -> subprocess.Popen:
    out = log.open("wb") if log else subprocess.PIPE
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.PIPE, text=True, bufsize=1)
    return stopped_with(stack, proc)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(stack: ExitStack, tmp: Path, quotas: dict[str, str]) -> tuple[str, str, int]:
    """A server whose keys file gives key A `quotas`: its URL, the code it runs, its pid."""
    lines = []
    for name, key in KEYS.items():
        lines += ["[[keys]]", f'name = "key-{name}"', f'sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"']
        lines += [f"{quota} = {value}" for quota, value in (quotas if name == "a" else {}).items()]
    (tmp / "keys.toml").write_text("\n".join(lines) + "\n")
    port, log = free_port(), tmp / "server.log"
    proc = spawn(stack, ["--serve", str(port), str(tmp / "data"), str(tmp / "keys.toml")], log)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return url, log.read_text().split("code: ", 1)[1].split("\n", 1)[0], proc.pid
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)


class Window:
    """Key B's latencies and the server's CPU time, summed over the windows of one kind."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.cpu = self.wall = 0.0

    def poll(self, http: httpx.Client, seconds: float, server_pid: int) -> int:
        """B's GET /v1/videos, one at a time for `seconds`; returns how many."""
        cpu, began = cpu_seconds(server_pid), time.monotonic()
        count = 0
        while time.monotonic() < began + seconds:
            start = time.perf_counter()
            http.get("/v1/videos").raise_for_status()
            self.times.append((time.perf_counter() - start) * 1000)
            count += 1
            time.sleep(POLL_GAP_S)
        self.cpu += cpu_seconds(server_pid) - cpu
        self.wall += time.monotonic() - began
        return count

    def summary(self) -> dict:
        ordered = sorted(self.times)
        return {"requests": len(ordered), "p50_ms": round(ordered[len(ordered) // 2], 1),
                "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
                "server_cpu_s": round(self.cpu, 3), "server_cpu_share": round(self.cpu / self.wall, 3)}


def phase(stack: ExitStack, tmp: Path, mode: str, quotas: dict[str, str], args) -> dict:
    tmp.mkdir()
    url, code, pid = start_server(stack, tmp, quotas)
    # A's first request: its video, and (in the flood) the one request of its burst.
    video_id = httpx.post(f"{url}/v1/videos", json=BODY, headers=auth("a"), timeout=60).raise_for_status().json()["id"]
    loader = spawn(stack, ["--load", mode, url, video_id, str(args.streams),
                           str(args.rounds * (2 * args.seconds + 30) + 60)])
    quiet, loaded, statuses, held, a_in_windows = Window(), Window(), {}, [], 0
    with httpx.Client(base_url=url, headers=auth("b"), timeout=60) as http:
        for _ in range(20):  # warm: connection, caches
            http.get("/v1/videos").raise_for_status()
        for _ in range(args.rounds):
            quiet.poll(http, args.seconds, pid)
            loader.stdin.write("on\n")
            ready = loader.stdout.readline().split()
            if ready[:1] != ["ready"]:
                raise RuntimeError(f"key A's load did not start: {' '.join(ready)} {loader.stdout.read()[-3000:]}")
            loaded.poll(http, args.seconds, pid)
            loader.stdin.write("off\n")
            tally = json.loads(loader.stdout.readline())
            for status, count in tally["statuses"].items():
                statuses[status] = statuses.get(status, 0) + count
            held.append(tally["held"])
            a_in_windows += sum(tally["statuses"].values()) - int(ready[1])
    loader.stdin.close()
    quiet_s, loaded_s = quiet.summary(), loaded.summary()
    result = {"phase": mode, "code": code, "quiet": quiet_s, "loaded": loaded_s,
              "key_a": {"statuses": statuses, "held_per_round": held},
              "p99_ratio": round(loaded_s["p99_ms"] / quiet_s["p99_ms"], 2)}
    if mode != "streams":
        # Server CPU time per refused request: the loaded windows' CPU, less what B's own requests
        # cost in the quiet ones, over A's requests in those windows (those answered just after, few).
        # Over a few hundred requests that difference is noise, so none is given.
        per_b = quiet.cpu / len(quiet.times)
        result["cpu_ms_per_b_request"] = round(per_b * 1000, 3)
        result["cpu_ms_per_a_request"] = None if a_in_windows < MIN_REQUESTS_FOR_CPU else \
            round((loaded.cpu - len(loaded.times) * per_b) / a_in_windows * 1000, 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each quiet and each loaded window")
    parser.add_argument("--rounds", type=int, default=4, help="quiet + loaded windows per phase")
    parser.add_argument("--streams", type=int, default=200, help="event streams key A tries to hold at once")
    parser.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "flood.json")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), Path(args.serve[1]), Path(args.serve[2]))
        return 0
    if args.load:
        mode, url, video_id, tries, seconds = args.load
        asyncio.run(load(mode, url, video_id, int(tries), time.monotonic() + float(seconds)))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the ExitStack still stops the servers
    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vidserve-flood-")))
        results = [phase(stack, tmp / mode, mode, {"requests_per_minute": "1"}, args)
                   for mode in ("flood", "raw-flood")]
        results.append(phase(stack, tmp / "streams", "streams", {}, args))
    config = {"seconds": args.seconds, "rounds": args.rounds, "streams": args.streams, "flood_loops": FLOOD_LOOPS,
              "poll_gap_ms": POLL_GAP_S * 1000, "cpu_count": os.cpu_count(), "python": platform.python_version(),
              "loadavg_1m_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    print(f"server code: {results[0]['code']}; 1-min load average before / after: "
          f"{config['loadavg_1m_before_after'][0]} / {config['loadavg_1m_before_after'][1]}")
    print("| phase | key A's answers | B quiet p50 / p99 ms | B loaded p50 / p99 ms | p99 loaded / quiet "
          "| server CPU quiet / loaded |")
    print("|---|---|---:|---:|---:|---:|")
    for r in results:
        answers = ", ".join(f"{n}x {s}" for s, n in sorted(r["key_a"]["statuses"].items()))
        if r["phase"] == "streams":
            answers += f"; held per round: {', '.join(map(str, r['key_a']['held_per_round']))}"
        print(f"| {r['phase']} | {answers} | {r['quiet']['p50_ms']} / {r['quiet']['p99_ms']} | "
              f"{r['loaded']['p50_ms']} / {r['loaded']['p99_ms']} | {r['p99_ratio']}x | "
              f"{r['quiet']['server_cpu_share']:.0%} / {r['loaded']['server_cpu_share']:.0%} |")
    for r in results[:2]:
        per_a = "too few to tell" if r["cpu_ms_per_a_request"] is None else f"{r['cpu_ms_per_a_request']} ms"
        print(f"server CPU per request, {r['phase']}: {per_a} per refused POST (key A), "
              f"{r['cpu_ms_per_b_request']} ms per served GET (key B, quiet windows)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"config": config, "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
