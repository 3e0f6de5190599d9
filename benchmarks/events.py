"""What open event streams cost the job store, and how soon a change reaches them.

An in-process server (the app on uvicorn, its store counting reads, a queue that runs nothing,
so every video stays queued) with N open `GET /v1/videos/{id}/events` streams, one per video:
  idle    the store's reads while nothing changes, over two keep-alive periods of every stream;
  single  one write at a time (a cancel), the time from the write to its stream's
          `video.cancelled`, and the store's reads per write (a cancel moves the line: every
          queued job's stream reads once);
  burst   the other videos cancelled one after another as fast as the store takes it, the time
          from each write to its stream's event.

    python benchmarks/events.py [--streams 200] [--single 20] [--redis redis://...] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import tempfile
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from vidserve import jobs
from vidserve.api.app import create_app
from vidserve.api.services import Services
from vidserve.config import Settings
from vidserve.jobs.place_in_line import PlaceInLine
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.storage import LocalStorage
from vidserve.telemetry import Metrics
from vidserve.webhooks import WebhookSender, generate_secret

BODY = {"model": "wan-tiny", "prompt": "a red fox", "seconds": "1", "size": "64x64", "num_inference_steps": 1}
KEEP_ALIVE_S = 0.5
TIMEOUT_S = 600


class IdleQueue:
    """Takes jobs and runs none; stands them in line in the order given."""

    alive, warming = True, False

    def __init__(self) -> None:
        self.line: list[str] = []

    def start(self) -> None: ...
    def stop(self) -> None: ...

    def submit(self, job) -> None:
        self.line.append(job.id)

    def places_in_line(self, model: str) -> dict[str, PlaceInLine]:
        return {job_id: PlaceInLine(position, None) for position, job_id in enumerate(self.line, 1)}


def counting(store_class):
    class Counting(store_class):
        reads = 0

        def get(self, job_id):
            Counting.reads += 1
            return super().get(job_id)

        def with_status(self, statuses):
            Counting.reads += 1
            return super().with_status(statuses)

    return Counting


class Stream:
    def __init__(self, video_id: str):
        self.video_id = video_id
        self.keep_alives = 0
        self.queued = asyncio.Event()
        self.cancelled_at: float | None = None
        self.changed = asyncio.Event()

    async def read(self, http: httpx.AsyncClient) -> None:
        async with http.stream("GET", f"/v1/videos/{self.video_id}/events") as response:
            async for line in response.aiter_lines():
                if line == "event: video.queued":
                    self.queued.set()
                elif line == ": keep-alive":
                    self.keep_alives += 1
                elif line == "event: video.cancelled":
                    self.cancelled_at = time.perf_counter()
                self.changed.set()

    async def until(self, condition) -> None:
        while not condition():
            self.changed.clear()
            await self.changed.wait()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(url: str, store, video_ids: list[str], singles: int) -> dict:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=TIMEOUT_S, limits=limits) as http:
        streams = [Stream(video_id) for video_id in video_ids]
        readers = [asyncio.create_task(s.read(http)) for s in streams]
        await asyncio.wait_for(asyncio.gather(*(s.queued.wait() for s in streams)), TIMEOUT_S)

        reads, started = store.reads, time.perf_counter()
        marks = [s.keep_alives + 2 for s in streams]
        await asyncio.gather(*(s.until(lambda s=s, m=m: s.keep_alives >= m) for s, m in zip(streams, marks)))
        idle = {"reads": store.reads - reads, "seconds": round(time.perf_counter() - started, 2)}

        single, reads, rest = [], store.reads, streams[singles:]
        for stream in streams[:singles]:
            written = time.perf_counter()
            await asyncio.to_thread(store.update, stream.video_id, jobs.request_cancel)
            await stream.until(lambda stream=stream: stream.cancelled_at is not None)
            single.append((stream.cancelled_at - written) * 1000)
        marks = [s.keep_alives + 2 for s in rest]  # quiet again: every read the writes caused is done
        await asyncio.gather(*(s.until(lambda s=s, m=m: s.keep_alives >= m) for s, m in zip(rest, marks)))
        reads_per_write = (store.reads - reads) / singles

        written_at = {}

        def cancel_rest() -> None:
            for stream in rest:
                written_at[stream.video_id] = time.perf_counter()
                store.update(stream.video_id, jobs.request_cancel)

        await asyncio.to_thread(cancel_rest)
        await asyncio.wait_for(asyncio.gather(*readers), TIMEOUT_S)
        burst = [(s.cancelled_at - written_at[s.video_id]) * 1000 for s in rest]
    ms = lambda values: {"p50": round(percentile(values, 0.5), 1), "p99": round(percentile(values, 0.99), 1),  # noqa: E731
                         "max": round(max(values), 1), "n": len(values)}
    return {"idle": idle, "single_ms": ms(single), "reads_per_write": round(reads_per_write, 1),
            "burst_ms": ms(burst)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--single", type=int, default=20, help="videos cancelled one at a time")
    parser.add_argument("--redis", help="a Redis URL: the Celery mode's store, notified by pub/sub")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data:
        data_dir = Path(data)
        settings = Settings(data_dir=data_dir, chat_model="", max_queued=args.streams,
                            event_keepalive_seconds=KEEP_ALIVE_S)
        if args.redis:
            store = counting(RedisJobStore)(args.redis, prefix=f"bench-events-{int(time.time())}")
        else:
            store = counting(SQLiteJobStore)(data_dir / "jobs.sqlite")
        services = Services(settings, store, LocalStorage(data_dir / "files"), IdleQueue(), Metrics(),
                            WebhookSender(generate_secret()))
        server = uvicorn.Server(uvicorn.Config(create_app(settings, services), host="127.0.0.1", port=0,
                                               log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=60) as http:
                video_ids = [http.post("/v1/videos", json=BODY).json()["id"] for _ in range(args.streams)]
            result = asyncio.run(measure(url, store, video_ids, args.single))
        finally:
            server.should_exit = True
            thread.join(30)

    result = {"store": "redis" if args.redis else "sqlite", "streams": args.streams,
              "keep_alive_s": KEEP_ALIVE_S, "python": platform.python_version(), **result}
    print(f"| store | streams | store reads while idle | single write → event, p50 / p99 ms | "
          f"reads per write | burst write → event, p50 / p99 ms |")
    print("|---|---|---|---|---|---|")
    print(f"| {result['store']} | {args.streams} | {result['idle']['reads']} in {result['idle']['seconds']} s | "
          f"{result['single_ms']['p50']} / {result['single_ms']['p99']} | {result['reads_per_write']} | "
          f"{result['burst_ms']['p50']} / {result['burst_ms']['p99']} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
