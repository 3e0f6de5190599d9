"""Output expiry: a completed video's files are deleted `output_ttl` seconds after it
completes, by a sweeper that one API process at a time runs (a lock in the JobStore); its
record stays, with `expires_at`, and its content answers 410 `video_expired`. On both stores,
and on local and S3 storage."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from apps import app_client, idle_services
from polling import eventually
from stores import TEST_BUCKET

from vidserve.config import Settings
from vidserve.jobs.expiry import LOCK_NAME, ExpirySweeper
from vidserve.jobs import Job, JobStatus, complete
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.media import encode_mp4
from vidserve.params import JobParams
from vidserve.storage import LocalStorage
from vidserve.storage.s3 import S3Storage

BODY = {"model": "wan-tiny", "prompt": "a red fox", "seconds": "1", "size": "64x64", "num_inference_steps": 1}
HOUR = 3600


def open_store(kind: str, request, tmp_path, prefix: str | None = None):
    if kind == "sqlite":
        return SQLiteJobStore(tmp_path / "jobs.sqlite")
    return RedisJobStore(request.getfixturevalue("redis_url"), prefix=prefix or f"expiry-{uuid.uuid4().hex}")


def open_files(kind: str, request, tmp_path):
    if kind == "local":
        return LocalStorage(tmp_path / "files")
    s3_url = request.getfixturevalue("s3_url")
    return S3Storage.from_url(f"s3://{TEST_BUCKET}/{uuid.uuid4().hex}", endpoint_url=s3_url)  # a prefix per test


def completed_video(client, services, tmp_path, output_ttl: float) -> str:
    """A video completed by hand, as a worker would, with its files in storage."""
    video_id = client.post("/v1/videos", json=BODY).json()["id"]
    frames = np.full((17, 64, 64, 3), 80, np.uint8)
    outputs = {"video": services.storage.put_file(f"{video_id}/video.mp4", encode_mp4(frames, tmp_path / "v.mp4", fps=16)),
               "thumbnail": services.storage.put_bytes(f"{video_id}/thumbnail.webp", b"webp")}
    services.store.update(video_id, lambda job: setattr(job, "status", JobStatus.in_progress) or
                          setattr(job, "worker_id", "w"))
    services.store.update(video_id, complete("w", outputs, {}, output_ttl=output_ttl))
    return video_id


def assert_expired(response) -> None:
    assert response.status_code == 410, response.text
    assert response.json()["error"]["code"] == "video_expired"


@pytest.mark.parametrize("files", ["local", "s3"])
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_an_expired_video_loses_its_files_and_keeps_its_record(kind, files, request, tmp_path):
    storage = open_files(files, request, tmp_path)
    with app_client(tmp_path, idle_services(tmp_path, store=open_store(kind, request, tmp_path),
                                            storage=storage)) as (client, services):
        video_id = completed_video(client, services, tmp_path, output_ttl=HOUR)
        video = client.get(f"/v1/videos/{video_id}").json()
        assert video["expires_at"] == int(services.store.get(video_id).completed_at + HOUR)
        assert client.get(f"/v1/videos/{video_id}/content").status_code == 200

        assert services.sweeper.sweep(now=time.time()) == []  # not due yet
        assert services.sweeper.sweep(now=video["expires_at"] + 1) == [video_id]
        assert not storage.exists(f"{video_id}/video.mp4") and not storage.exists(f"{video_id}/thumbnail.webp")
        if files == "local":
            assert not (tmp_path / "files" / video_id).exists()
        assert services.sweeper.sweep(now=video["expires_at"] + 2) == []  # swept once

        for variant in ("video", "thumbnail"):
            assert_expired(client.get(f"/v1/videos/{video_id}/content", params={"variant": variant}))
        after = client.get(f"/v1/videos/{video_id}")
        assert after.status_code == 200
        assert after.json()["status"] == "completed" and after.json()["expires_at"] == video["expires_at"]
        assert_expired(client.post(f"/v1/videos/{video_id}/remix", json={"prompt": "a blue fox"}))
        extension = client.post("/v1/videos/extensions", json={"prompt": "more", "video": {"id": video_id},
                                                               "seconds": "1"})
        assert_expired(extension)
        assert extension.json()["error"]["param"] == "video"


def test_content_is_gone_once_past_expires_at_even_before_a_sweep(tmp_path, request):
    with app_client(tmp_path, idle_services(tmp_path)) as (client, services):
        video_id = completed_video(client, services, tmp_path, output_ttl=0.2)
        eventually(lambda: client.get(f"/v1/videos/{video_id}/content").status_code == 410,
                   timeout=10, what="the content to answer 410")
        assert services.storage.exists(f"{video_id}/video.mp4")  # the sweep (every 60 s) has not come yet


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_ttl_of_zero_keeps_files_until_deleted(kind, request, tmp_path):
    services = idle_services(tmp_path, store=open_store(kind, request, tmp_path), output_ttl=0)
    with app_client(tmp_path, services) as (client, _):
        video_id = completed_video(client, services, tmp_path, output_ttl=services.settings.output_ttl)
        assert client.get(f"/v1/videos/{video_id}").json()["expires_at"] is None
        assert services.sweeper.sweep(now=time.time() + 100 * 365 * 24 * HOUR) == []
        assert client.get(f"/v1/videos/{video_id}/content").status_code == 200


@pytest.mark.parametrize(("kind", "files"), [("sqlite", "local"), ("redis", "s3")])
def test_the_sweeper_thread_expires_a_video_seconds_after_it_completes(kind, files, request, tmp_path):
    storage = open_files(files, request, tmp_path)
    services = idle_services(tmp_path, store=open_store(kind, request, tmp_path), storage=storage,
                             expiry_sweep_seconds=0.1)
    with app_client(tmp_path, services) as (client, _):
        video_id = completed_video(client, services, tmp_path, output_ttl=3)
        assert storage.exists(f"{video_id}/video.mp4")
        eventually(lambda: services.store.get(video_id).expired, timeout=30, what="the sweeper to expire the video")
        assert not storage.exists(f"{video_id}/video.mp4") and not storage.exists(f"{video_id}/thumbnail.webp")
        if files == "local":
            assert not (tmp_path / "files" / video_id).exists()
        assert services.store.get(video_id).outputs == {}
        assert_expired(client.get(f"/v1/videos/{video_id}/content"))
        video = client.get(f"/v1/videos/{video_id}").json()
        assert video["status"] == "completed" and video["expires_at"] is not None


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_one_holder_of_a_lock_at_a_time(kind, request, tmp_path):
    prefix = f"expiry-{uuid.uuid4().hex}"
    first, second = (open_store(kind, request, tmp_path, prefix) for _ in range(2))  # two processes' stores
    assert first.try_lock("sweep", 30, "a")
    assert not second.try_lock("sweep", 30, "b") and not first.try_lock("sweep", 30, "b")
    second.unlock("sweep", "b")  # not its lock: nothing happens
    assert not second.try_lock("sweep", 30, "b")
    first.unlock("sweep", "a")
    assert second.try_lock("sweep", 0.2, "b")
    eventually(lambda: first.try_lock("sweep", 30, "a"), timeout=10, what="the lapsed lock to be free")
    second.unlock("sweep", "b")  # lapsed, and now a's: it stays a's
    assert not second.try_lock("sweep", 30, "b")
    first.close()
    second.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_sweeper_waits_while_another_holds_the_lock(kind, request, tmp_path):
    store = open_store(kind, request, tmp_path)
    with app_client(tmp_path, idle_services(tmp_path, store=store)) as (client, services):
        video_id = completed_video(client, services, tmp_path, output_ttl=HOUR)
        other = ExpirySweeper(store, services.storage, interval=60)
        later = time.time() + 2 * HOUR
        assert store.try_lock(LOCK_NAME, 30, other.token)  # the other process is mid-sweep
        assert services.sweeper.sweep(now=later) == []
        assert services.storage.exists(f"{video_id}/video.mp4")
        store.unlock(LOCK_NAME, other.token)
        assert services.sweeper.sweep(now=later) == [video_id]


def test_records_stored_before_expiry_load():
    params = JobParams(width=64, height=64, num_frames=17, fps=16, steps=1, guidance=5.0, seed=0,
                       chunk_frames=(17,), seconds="1")
    old = Job(model="wan-tiny", prompt="x", params=params).model_dump_json(exclude={"expires_at", "expired"})
    loaded = Job.model_validate_json(old)  # as both stores load a record
    assert loaded.expires_at is None and not loaded.expired and not loaded.is_expired()


def test_the_runner_gives_a_completed_video_the_servers_ttl(tmp_path, monkeypatch):
    from vidserve.pipelines import chain  # torch: only this test needs it
    from vidserve.workers.runner import JobRunner

    def grey(request, *args, **kwargs):
        frames = np.full((request.num_frames, request.height, request.width, 3), 80, np.uint8)
        return chain.VideoResult(frames=frames, fps=request.fps, seed=request.seed, timings={})

    monkeypatch.setattr(chain, "generate_video", grey)
    store = SQLiteJobStore(tmp_path / "jobs.sqlite")
    runner = JobRunner(Settings(data_dir=tmp_path / "data", output_ttl=120), store, LocalStorage(tmp_path / "files"),
                       worker_id="w1")
    params = JobParams(width=64, height=64, num_frames=9, fps=12, steps=1, guidance=1.0, seed=1,
                       chunk_frames=(9,), seconds="0.66667")
    job, _ = store.create(Job(model="wan-tiny", prompt="a fox", params=params))
    final = runner.run(job.id)
    assert final.status is JobStatus.completed and final.expires_at == final.completed_at + 120
    store.close()
