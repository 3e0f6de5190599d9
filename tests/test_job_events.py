"""Event streams follow a job by the store's own change notices, never by polling it: open
streams on queued jobs cost the store no reads while nothing changes, and a change reaches each
stream, on the embedded SQLite store (an in-process notice) and on Redis (pub/sub, across a
restart of the Redis server too)."""

from __future__ import annotations

import asyncio
import secrets
import threading

import httpx
import pytest
import redis
from apps import idle_services, served_app
from polling import eventually
from test_outages import own_redis  # noqa: F401  (a fixture: a redis-server of the test's own, to kill)
from test_tenancy import BODY

from vidserve import jobs
from vidserve.api.services import Services
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore

STREAMS = 200
KEEP_ALIVE = 0.3  # seconds: each quiet stream says so this often, the clock this test reads quiet by


class Counting:
    """A real store that counts its reads of jobs, however they are read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.reads, self._counting = 0, threading.Lock()

    def _read(self) -> None:
        with self._counting:
            self.reads += 1

    def get(self, job_id):
        self._read()
        return super().get(job_id)

    def list(self, *args, **kwargs):
        self._read()
        return super().list(*args, **kwargs)

    def with_status(self, statuses):
        self._read()
        return super().with_status(statuses)


class CountingSQLite(Counting, SQLiteJobStore):
    pass


class CountingRedis(Counting, RedisJobStore):
    pass


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path) -> Counting:
    if request.param == "sqlite":
        return CountingSQLite(tmp_path / "jobs.sqlite")
    url = request.getfixturevalue("redis_url")
    return CountingRedis(url, prefix=f"events-{secrets.token_hex(4)}")


class Stream:
    """One client's event stream: what it has read, and a way to wait for what it will read."""

    def __init__(self, video_id: str):
        self.video_id = video_id
        self.lines: list[str] = []
        self._read = asyncio.Event()

    async def read(self, http: httpx.AsyncClient) -> None:
        async with http.stream("GET", f"/v1/videos/{self.video_id}/events") as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                if line:
                    self.lines.append(line)
                    self._read.set()

    async def until(self, count: int, line: str) -> None:
        """Until it has read `line` at least `count` times."""
        while self.lines.count(line) < count:
            self._read.clear()
            await self._read.wait()


async def follow(url: str, services: Services, video_ids: list[str]) -> tuple[int, list[Stream]]:
    """Open a stream on each video; once each is quiet, cancel every video. The store's reads from
    the first event of every stream until each has said twice that it is quiet, and the streams."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as http:
        streams = [Stream(video_id) for video_id in video_ids]
        readers = [asyncio.create_task(stream.read(http)) for stream in streams]
        waiting = asyncio.gather(*(s.until(1, "event: video.queued") for s in streams))
        await asyncio.wait_for(waiting, 300)
        # Every stream's first read is done. Two keep-alives from each after this point: every
        # stream has been quiet a whole keep-alive period since, in which a poll would read.
        before = services.store.reads
        quiet = [s.until(s.lines.count(": keep-alive") + 2, ": keep-alive") for s in streams]
        await asyncio.wait_for(asyncio.gather(*quiet), 300)
        idle_reads = services.store.reads - before

        def cancel_all() -> None:
            for video_id in video_ids:
                services.store.update(video_id, jobs.request_cancel)

        await asyncio.to_thread(cancel_all)
        await asyncio.wait_for(asyncio.gather(*readers), 300)  # each stream ends after its terminal event
        return idle_reads, streams


def test_open_streams_on_queued_jobs_read_nothing_until_a_change_which_reaches_each(store, tmp_path):
    services = idle_services(tmp_path, store=store, event_keepalive_seconds=KEEP_ALIVE, max_queued=STREAMS)
    with served_app(services) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as http:
            video_ids = [http.post("/v1/videos", json=BODY).json()["id"] for _ in range(STREAMS)]
        idle_reads, streams = asyncio.run(follow(url, services, video_ids))
    assert idle_reads == 0, f"{STREAMS} quiet streams read the store {idle_reads} times"
    for stream in streams:
        events = [line for line in stream.lines if line.startswith("event: ")]
        assert events == ["event: video.queued", "event: video.cancelled"], (stream.video_id, events)


def test_a_stream_on_redis_hears_changes_after_the_redis_server_restarts(own_redis, tmp_path):  # noqa: F811
    store = CountingRedis(own_redis.url, prefix="events")
    services = idle_services(tmp_path, store=store, event_keepalive_seconds=KEEP_ALIVE)
    with served_app(services) as (url, _):
        with httpx.Client(base_url=url, timeout=60) as http:
            video_id = http.post("/v1/videos", json=BODY).json()["id"]
        eventually(lambda: own_redis.on_disk(video_id), timeout=30, what="the job to reach the append-only file")

        def cancel() -> bool:
            try:
                return store.update(video_id, jobs.request_cancel).status is jobs.JobStatus.cancelled
            except redis.ConnectionError as exc:  # a pooled connection from before the restart
                raise AssertionError(str(exc)) from exc

        async def across_a_restart() -> Stream:
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                stream = Stream(video_id)
                reader = asyncio.create_task(stream.read(http))
                await asyncio.wait_for(stream.until(1, "event: video.queued"), 60)
                own_redis.kill()
                own_redis.start()
                # The stream keeps its connection; the store's next change reaches it.
                await asyncio.to_thread(eventually, cancel, timeout=60, what="the store to answer again")
                await asyncio.wait_for(reader, 60)
                return stream

        stream = asyncio.run(across_a_restart())
    events = [line for line in stream.lines if line.startswith("event: ")]
    assert events == ["event: video.queued", "event: video.cancelled"], events
