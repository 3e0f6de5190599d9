"""No job lost, none stuck: kill -9 of workers and servers, restarts, bounded attempts,
a rerun that goes on from the chunks made, and ten jobs over two Celery workers each run
exactly once."""

from __future__ import annotations

import socket

import httpx
import pytest
from conftest import FAST_LEASE
from prometheus_client.parser import text_string_to_metric_families
from polling import eventually
from servers import Server, Worker

from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore

TINY = {"model": "wan-tiny", "size": "64x64", "num_frames": 33, "num_inference_steps": 4}
# Long enough to be killed mid-run: ~100 steps of a few tens of ms.
LONG = {"model": "wan-tiny", "size": "128x128", "num_frames": 81, "num_inference_steps": 100}
# Four chunks (33 + 3 x 32 frames), each long enough to be killed between two.
CHAINED = {"model": "wan-tiny", "size": "64x64", "num_frames": 129, "num_inference_steps": 20}
# A bound on a broken test, not a claim about speed: these run a LONG job, or ten, start to end,
# and a machine busy with other work stretches that.
JOBS_TIMEOUT = 300


def video(url, video_id):
    return httpx.get(f"{url}/v1/videos/{video_id}", timeout=10).json()


def submit(url, **body):
    response = httpx.post(f"{url}/v1/videos", json={"prompt": "a fox", **body}, timeout=10)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def finished(url, video_id, what):
    return eventually(lambda: (v := video(url, video_id))["status"] in ("completed", "failed") and v,
                      timeout=JOBS_TIMEOUT, what=what)


def kill_mid_job_and_restart(server, video_id, what):
    eventually(lambda: running_with_progress(server.url, video_id), what=what)
    server.kill()
    return Server(server.data_dir, env=FAST_LEASE).start()


def running_with_progress(url, video_id, at_least=3):
    v = video(url, video_id)
    return v if v["status"] == "in_progress" and v["progress"] >= at_least else None


@pytest.fixture
def celery_env(redis_url, tmp_path):
    import redis

    url = redis_url.rsplit("/", 1)[0] + "/15"
    redis.Redis.from_url(url).flushdb()
    return tmp_path / "data", {**FAST_LEASE, "VIDSERVE_REDIS_URL": url}


def test_ten_jobs_on_two_workers_each_run_once(celery_env):
    data, env = celery_env
    # Nothing is killed here: a lease of the default length, so a worker starved of CPU for a
    # moment does not lose one and run its job twice.
    env = {**env, "VIDSERVE_LEASE_SECONDS": "30"}
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    workers = [Worker(data, "wan-tiny", env, f"w{i}").start() for i in range(2)]
    try:
        ids = [submit(server.url, seed=i, **TINY) for i in range(10)]

        def all_completed():
            videos = [video(server.url, i) for i in ids]
            return videos if all(v["status"] == "completed" for v in videos) else None

        done = eventually(all_completed, timeout=JOBS_TIMEOUT, what="10 jobs")
        assert [v["attempts"] for v in done] == [1] * 10  # one claim each: no job ran twice
        ran_on = {record.worker_id for record in _records(env, ids)}
        assert ran_on <= {f"{socket.gethostname()}:{w.pid}" for w in workers}
    finally:
        for w in workers:
            w.stop()
        server.stop()


def test_killed_worker_job_reruns_on_restart_and_api_restart_loses_nothing(celery_env):
    data, env = celery_env
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = Worker(data, "wan-tiny", env, "first").start()
    replacement = None
    try:
        long_id = submit(server.url, **LONG)
        queued_id = submit(server.url, **TINY)
        eventually(lambda: running_with_progress(server.url, long_id), what="the long job to run")
        worker.kill()
        # With its worker dead, the job must not stay in_progress: its lease lapses and it is queued again.
        eventually(lambda: video(server.url, long_id)["status"] == "queued", timeout=30, what="requeue")

        server.kill()  # and the API dies too; job records live in Redis
        server = Server(data, env=env, extra=["--queue", "celery"]).start()
        listed = {v["id"] for v in httpx.get(f"{server.url}/v1/videos", params={"limit": 100}).json()["data"]}
        assert {long_id, queued_id} <= listed

        # Its own leases are long: a replacement starved of CPU for a moment must not lose the job too.
        replacement = Worker(data, "wan-tiny", {**env, "VIDSERVE_LEASE_SECONDS": "30"}, "replacement").start()
        final = finished(server.url, long_id, "the rerun")
        assert final["status"] == "completed" and final["attempts"] == 2
        assert eventually(lambda: video(server.url, queued_id)["status"] == "completed", timeout=JOBS_TIMEOUT,
                          what="the queued job")
    finally:
        for w in (worker, replacement):
            if w:
                w.stop()
        server.stop()


def test_embedded_server_killed_mid_job_recovers_it_on_restart(tmp_path):
    data = tmp_path / "data"
    server = Server(data, env=FAST_LEASE).start()
    try:
        long_id = submit(server.url, **LONG)
        queued_id = submit(server.url, **TINY)
        server = kill_mid_job_and_restart(server, long_id, "the long job to run")
        final = finished(server.url, long_id, "the recovered job")
        assert final["status"] == "completed" and final["attempts"] == 2
        assert eventually(lambda: video(server.url, queued_id)["status"] == "completed", timeout=JOBS_TIMEOUT,
                          what="the queued job")
    finally:
        server.stop()


def test_a_job_rerun_after_a_kill_goes_on_from_its_last_chunk_and_its_stream_never_shrinks(tmp_path):
    data = tmp_path / "data"
    server = Server(data, env=FAST_LEASE).start()
    try:
        video_id = submit(server.url, **CHAINED)
        listed = []  # the segment count of every playlist read, across the kill

        def segments_listed() -> int:
            # Held while the video has no segment yet (at most VIDSERVE_STREAM_HOLD_SECONDS, 30 s).
            playlist = httpx.get(f"{server.url}/v1/videos/{video_id}/stream.m3u8", timeout=60)
            assert playlist.status_code == 200, playlist.text
            listed.append(playlist.text.count("#EXTINF"))
            return listed[-1]

        eventually(lambda: segments_listed() >= 2, timeout=JOBS_TIMEOUT, what="two chunks in the stream")
        server.kill()
        store = SQLiteJobStore(data / "jobs.sqlite")
        made = len(store.get(video_id).chunks)
        store.close()
        assert 2 <= made < 4, f"the kill came after {made} of the 4 chunks"

        server = Server(data, env=FAST_LEASE).start()
        eventually(lambda: segments_listed() and video(server.url, video_id)["status"] in ("completed", "failed"),
                   timeout=JOBS_TIMEOUT, what="the rerun to end")
        final = video(server.url, video_id)
        assert (final["status"], final["attempts"]) == ("completed", 2)
        assert segments_listed() == 4 and listed == sorted(listed), f"segments listed: {listed}"
        # The new process made only the chunks the first had not recorded: 20 steps each.
        assert denoise_steps(server.url) == 20 * (4 - made)
    finally:
        server.stop()


def denoise_steps(url: str) -> float:
    metrics = httpx.get(f"{url}/metrics", timeout=10).text
    return next(sample.value for family in text_string_to_metric_families(metrics) for sample in family.samples
                if sample.name == "vidserve_denoise_step_seconds_count" and sample.labels == {"model": "wan-tiny"})


def test_a_job_that_keeps_killing_its_worker_fails_instead_of_looping(tmp_path):
    data = tmp_path / "data"
    server = Server(data, env=FAST_LEASE).start()
    try:
        long_id = submit(server.url, **LONG)
        for attempt in (1, 2):
            server = kill_mid_job_and_restart(server, long_id, f"attempt {attempt}")
        final = finished(server.url, long_id, "the final state")
        assert final["status"] == "failed" and final["attempts"] == 2
        assert final["error"]["code"] == "worker_lost"
    finally:
        server.stop()


def test_queued_job_whose_message_was_never_published_runs_after_api_restart(celery_env):
    """An API killed between marking a job queued and publishing its message (a submission, or a
    lease reaper's requeue) must not leave the job queued forever: the next API publishes it."""
    import redis

    from vidserve.workers.celery_app import queue_name

    data, env = celery_env
    env = {**env, "VIDSERVE_QUEUE_WITHOUT_WORKERS": "1"}  # its worker starts only after the API restart
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = None
    try:
        job_id = submit(server.url, **TINY)
        broker = redis.Redis.from_url(env["VIDSERVE_REDIS_URL"])
        assert broker.delete(queue_name("wan-tiny")) == 1  # the message is gone; the record says queued
        server.kill()
        server = Server(data, env=env, extra=["--queue", "celery"]).start()
        worker = Worker(data, "wan-tiny", env, "after").start()
        final = finished(server.url, job_id, "the job without a message")
        assert final["status"] == "completed" and final["attempts"] == 1
    finally:
        if worker:
            worker.stop()
        server.stop()


def _records(env, ids):
    store = RedisJobStore(env["VIDSERVE_REDIS_URL"])
    return [store.get(i) for i in ids]
