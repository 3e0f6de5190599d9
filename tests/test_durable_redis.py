"""A Celery deployment's Redis must keep what it acknowledged: the API and workers refuse one
without its append-only file (unless told otherwise, and then say so in their metrics), and
with it a `kill -9` of Redis in the middle of a run loses no job."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import httpx
import pytest
from polling import eventually
from servers import Server, VidserveProcess, Worker, free_port
from stores import RedisServer

from vidserve.jobs.redis_persistence import aof_enabled

# Short clips, so the scenario fits a couple of CPU cores: TINY jobs take seconds; LONG is long
# enough to be running when Redis is killed and still running when it is back.
TINY = {"model": "wan-tiny", "size": "64x64", "num_frames": 17, "num_inference_steps": 2}
LONG = {"model": "wan-tiny", "size": "64x64", "num_frames": 17, "num_inference_steps": 40}
NO_CHAT = {"VIDSERVE_CHAT_MODEL": ""}  # no LLM to load: these tests are about Redis


class LockedDownRedis(RedisServer):
    """A Redis with some commands renamed away, as managed Redis services do with CONFIG."""

    def __init__(self, workdir, hidden: tuple[str, ...]):
        super().__init__(workdir, appendonly=True)
        self.hidden = hidden

    def _command(self) -> list[str]:
        return [*super()._command(), *(arg for name in self.hidden for arg in ("--rename-command", name, ""))]


@pytest.fixture
def redis_at(tmp_path):
    """`redis_at(appendonly=..., hidden=...)`: a redis-server of this test's own, stopped at its end."""
    started = []

    def start(appendonly: bool = True, hidden: tuple[str, ...] = ()) -> RedisServer:
        workdir = tmp_path / f"redis-{len(started)}"
        workdir.mkdir()
        server = LockedDownRedis(workdir, hidden) if hidden else RedisServer(workdir, appendonly=appendonly)
        started.append(server.start())
        return server

    yield start
    for server in started:
        server.stop()


def refusal(command: str, redis_url: str, tmp_path, *extra: str) -> str:
    """The one line `vidserve COMMAND` exits 2 with, on this Redis."""
    args = [command, "--redis-url", redis_url, "--data-dir", str(tmp_path / "data"), *extra]
    result = subprocess.run([sys.executable, "-m", "vidserve.cli", *args], capture_output=True, text=True,
                            timeout=60, env={**os.environ, **NO_CHAT})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vidserve: error: "), result.stderr
    return lines[0]


def volatile_gauge(metrics_url: str) -> float:
    text = httpx.get(metrics_url, timeout=10).text
    found = re.search(r"^vidserve_redis_volatile (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


def metrics_worker(data_dir, env: dict[str, str], *extra: str) -> tuple[VidserveProcess, str]:
    """A worker serving its metrics, started; and their URL."""
    port = free_port()
    worker = VidserveProcess(["worker", "--model", "wan-tiny", "--data-dir", str(data_dir), "--metrics-port",
                              str(port), *extra], env, data_dir.parent / f"worker-{port}.log").start()
    worker.wait_for_log("ready.")
    return worker, f"http://127.0.0.1:{port}/metrics"


def test_api_and_worker_refuse_a_redis_without_its_append_only_file(redis_at, tmp_path):
    redis = redis_at(appendonly=False)
    for line in (refusal("serve", redis.url, tmp_path, "--queue", "celery"),
                 refusal("worker", redis.url, tmp_path, "--model", "wan-tiny")):
        assert f"Redis at {redis.url} runs without its append-only file" in line
        assert f"redis-cli -u {redis.url} CONFIG SET appendonly yes" in line
        assert "appendonly yes` in redis.conf" in line and line.endswith("or pass --allow-volatile-redis")


def test_an_api_started_before_its_redis_waits_for_it(tmp_path):
    """Under compose or Kubernetes, Redis may come up a moment after the API: it waits, a while."""
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis")  # not started yet: its port is chosen, nothing listens
    server = Server(tmp_path / "data", env={**NO_CHAT, "VIDSERVE_REDIS_URL": redis.url}, extra=["--queue", "celery"])
    later = threading.Timer(10, redis.start)  # past the API's own start-up
    later.start()
    try:
        server.start()
        assert f"reaching Redis at {redis.url}" in server.logs()  # it did wait
    finally:
        later.join()
        server.stop()
        redis.stop()


@pytest.mark.parametrize("appendonly", [False, True])
def test_the_volatile_gauge_says_whether_redis_keeps_its_writes(appendonly, redis_at, tmp_path):
    """Allowed a Redis without its append-only file, the API and the worker start, warn, and
    show 1; on one with it, 0."""
    redis = redis_at(appendonly=appendonly)
    env = {**NO_CHAT, "VIDSERVE_REDIS_URL": redis.url}
    data = tmp_path / "data"
    # The API is allowed through the flag, the worker through the setting's environment variable.
    server = Server(data, env=env, extra=["--queue", "celery", "--allow-volatile-redis"]).start()
    worker = None
    try:
        worker, worker_metrics = metrics_worker(data, {**env, "VIDSERVE_ALLOW_VOLATILE_REDIS": "1"})
        assert volatile_gauge(f"{server.url}/metrics") == volatile_gauge(worker_metrics) == (0 if appendonly else 1)
        for process in (server, worker):
            assert ("runs without its append-only file" in process.logs()) is not appendonly  # the warning
    finally:
        if worker:
            worker.stop()
        server.stop()


def test_a_redis_without_config_answers_through_info_persistence(redis_at):
    assert aof_enabled(redis_at(hidden=("CONFIG",)).url) is True


def test_a_redis_that_says_nothing_of_its_persistence_is_refused_unless_allowed(redis_at, tmp_path):
    redis = redis_at(hidden=("CONFIG", "INFO"))
    assert aof_enabled(redis.url) is None
    line = refusal("worker", redis.url, tmp_path, "--model", "wan-tiny")
    assert f"could not verify that Redis at {redis.url} persists its writes" in line
    assert line.endswith("pass --allow-volatile-redis if it is known durable")


# --- kill -9 of Redis during a run ---------------------------------------------------------


def video(url: str, video_id: str) -> dict:
    response = httpx.get(f"{url}/v1/videos/{video_id}", timeout=10)
    assert response.status_code == 200, response.text  # an AssertionError: `eventually` tries again
    return response.json()


def running(url: str, video_id: str) -> bool:
    v = video(url, video_id)
    return v["status"] == "in_progress" and v["progress"] >= 3


def submit(url: str, **body) -> str:
    response = httpx.post(f"{url}/v1/videos", json={"prompt": "a fox", **body}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def test_kill_9_of_redis_mid_run_loses_no_job_and_every_job_completes(redis_at, tmp_path):
    redis = redis_at(appendonly=True)
    # A lease long enough that the Redis outage alone does not look like a dead worker.
    env = {**NO_CHAT, "VIDSERVE_REDIS_URL": redis.url, "VIDSERVE_LEASE_SECONDS": "10"}
    data = tmp_path / "data"
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = None
    try:
        worker = Worker(data, "wan-tiny", env, "w").start()
        done_id = submit(server.url, **TINY)
        eventually(lambda: video(server.url, done_id)["status"] == "completed", timeout=300, what="the first job")
        long_id = submit(server.url, **LONG)
        queued_ids = [submit(server.url, seed=i, **TINY) for i in range(2)]
        eventually(lambda: running(server.url, long_id), timeout=300, what="the long job to run")
        assert [video(server.url, i)["status"] for i in queued_ids] == ["queued", "queued"]
        ids = [done_id, long_id, *queued_ids]
        # A job acknowledged in the second before a crash may not have reached the AOF yet
        # (`appendfsync everysec`): what must come back is every job that did.
        eventually(lambda: all(redis.on_disk(i) for i in ids), what="every job to reach the AOF")

        redis.kill()
        redis.start()

        # Every record is back (the API's connections to Redis reconnect on their next command)...
        eventually(lambda: [video(server.url, i) for i in ids], timeout=30, what="every record to answer")

        def all_completed():
            statuses = [video(server.url, i)["status"] for i in ids]
            assert statuses == ["completed"] * 4, statuses
            return True

        # ...and every job completes, the long one perhaps on a second attempt.
        eventually(all_completed, timeout=300, interval=0.5, what="every job to complete")
    finally:
        if worker:
            worker.stop()
        server.stop()


def test_a_queued_job_whose_message_a_redis_crash_lost_still_runs(redis_at, tmp_path):
    """The record reached the AOF and the Celery message, written just after it, did not: the
    API sees Redis restart and publishes its queued jobs again, without restarting itself."""
    import redis as redis_client

    from vidserve.workers.celery_app import queue_name

    redis = redis_at(appendonly=True)
    env = {**NO_CHAT, "VIDSERVE_REDIS_URL": redis.url, "VIDSERVE_LEASE_SECONDS": "2",  # a lease check each 2/3 s
           "VIDSERVE_QUEUE_WITHOUT_WORKERS": "1"}  # its worker starts only after the crash
    data = tmp_path / "data"
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = None
    try:
        job_id = submit(server.url, **TINY)
        assert redis_client.Redis.from_url(redis.url).delete(queue_name("wan-tiny")) == 1  # the message is gone
        eventually(lambda: redis.on_disk(job_id), what="the job to reach the AOF")
        redis.kill()
        redis.start()

        worker = Worker(data, "wan-tiny", env, "w").start()
        final = eventually(lambda: (v := video(server.url, job_id))["status"] in ("completed", "failed") and v,
                           timeout=300, what="the job to run")
        assert final["status"] == "completed" and final["attempts"] == 1
    finally:
        if worker:
            worker.stop()
        server.stop()
