"""The JobStore contract, run against every store, plus LocalStorage."""

from __future__ import annotations

import multiprocessing
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from vidserve.jobs import (InvalidTransition, Job, JobError, JobNotFound, JobStatus, LeaseLost, WebhookDelivery,
                           cancelled, complete, fail, heartbeat, recover, request_cancel, start)
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.options import AttentionOptions, CacheOptions
from vidserve.params import JobParams
from vidserve.storage import LocalStorage

LOST_RACE = 3  # exit code of a child process whose start() was refused


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SQLiteJobStore(tmp_path / "db" / "jobs.db")
    else:  # a fresh prefix keeps each test's jobs apart on the shared server
        s = RedisJobStore(request.getfixturevalue("redis_url"), prefix=f"test-{uuid.uuid4().hex}")
    yield s
    s.close()


PARAMS = JobParams(width=64, height=64, num_frames=17, fps=16, steps=4, guidance=5.0, seed=7, chunk_frames=(17,),
                   seconds="1")


def new_job(**fields) -> Job:
    return Job(**{"model": "wan-tiny", "prompt": "a cat", "params": PARAMS, **fields})


def ids(jobs: list[Job]) -> list[str]:
    return [j.id for j in jobs]


def test_create_get_round_trip(store):
    job = new_job(
        status=JobStatus.failed, progress=40, started_at=1.5, completed_at=2.25,
        params=PARAMS.model_copy(update={"prompts": ("one", "two"), "chunk_frames": (17, 17), "source_frames": 5,
                                         "attention": AttentionOptions(mode="topk", tile=(2, 4, 4)),
                                         "cache": CacheOptions(kind="first_block", threshold=0.1)}),
        input_image_key="video_x/input.png", outputs={"video": "video_x/video.mp4"},
        error=JobError(code="oom", message="out of memory"), attempts=2, max_attempts=3, worker_id="w1",
        lease_expires_at=99.0, cancel_requested=True, timings={"denoise": 1.25}, idempotency_key="k1",
        request_hash="abc", webhook_url="https://example.com/hook", metadata={"user": "u1"},
        remixed_from_video_id="video_y",
    )
    assert store.create(job) == (job, True)
    assert store.get(job.id) == job
    assert store.get("video_missing") is None


def test_idempotency_key_returns_the_first_job(store):
    first, created = store.create(new_job(idempotency_key="same"))
    again, created_again = store.create(new_job(idempotency_key="same", prompt="other"))
    assert created and not created_again
    assert again == first
    assert store.create(first) == (first, False)  # the very same job retried
    assert ids(store.list()[0]) == [first.id]


def test_concurrent_creates_with_one_key_make_one_job(store):
    barrier = threading.Barrier(8)

    def create(_):
        barrier.wait()
        return store.create(new_job(idempotency_key="race"))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(create, range(8)))
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1
    assert ids(store.list()[0]) == [results[0][0].id]


def test_duplicate_id_is_rejected(store):
    job = new_job()
    store.create(job)
    with pytest.raises(ValueError):
        store.create(job)


def test_list_pages_in_both_orders(store):
    jobs = [store.create(new_job())[0] for _ in range(5)]
    j = ids(jobs)

    page, more = store.list(limit=2)
    assert (ids(page), more) == (j[4:2:-1], True)
    page, more = store.list(after=page[-1].id, limit=2)
    assert (ids(page), more) == (j[2:0:-1], True)
    page, more = store.list(after=page[-1].id, limit=2)
    assert (ids(page), more) == ([j[0]], False)
    assert store.list(after=j[0]) == ([], False)

    page, more = store.list(limit=3, order="asc")
    assert (ids(page), more) == (j[:3], True)
    page, more = store.list(after=j[2], limit=3, order="asc")
    assert (ids(page), more) == (j[3:], False)
    assert ids(store.list(limit=5)[0]) == j[::-1] and not store.list(limit=5)[1]

    with pytest.raises(JobNotFound):
        store.list(after="video_missing")


def test_start_complete(store):
    job = store.create(new_job())[0]
    running = store.update(job.id, start("w1", lease_seconds=60))
    assert (running.status, running.attempts, running.worker_id) == (JobStatus.in_progress, 1, "w1")
    assert running.lease_expires_at > running.started_at
    done = store.update(job.id, complete("w1", {"video": f"{job.id}/video.mp4"}, {"total": 3.0}))
    assert (done.status, done.progress, done.outputs) == (JobStatus.completed, 100, {"video": f"{job.id}/video.mp4"})
    assert done.lease_expires_at is None
    assert store.get(job.id) == done


def test_fail(store):
    job = store.create(new_job())[0]
    store.update(job.id, start("w1", 60))
    failed = store.update(job.id, fail("w1", "oom", "out of memory"))
    assert failed.status is JobStatus.failed and failed.error == JobError(code="oom", message="out of memory")
    assert store.get(job.id) == failed


def test_cancel_queued_is_immediate(store):
    job = store.create(new_job())[0]
    assert store.update(job.id, request_cancel).status is JobStatus.cancelled


def test_cancel_running_waits_for_the_worker(store):
    job = store.create(new_job())[0]
    store.update(job.id, start("w1", 60))
    asked = store.update(job.id, request_cancel)
    assert (asked.status, asked.cancel_requested) == (JobStatus.in_progress, True)
    assert store.update(job.id, cancelled("w1")).status is JobStatus.cancelled
    assert store.with_status([JobStatus.cancelled]) == [store.get(job.id)]


def test_invalid_transition_leaves_the_record_unchanged(store):
    job = store.create(new_job())[0]
    before = store.update(job.id, request_cancel)
    with pytest.raises(InvalidTransition):
        store.update(job.id, complete("w1", {}, {}))
    assert store.get(job.id) == before
    assert store.with_status([JobStatus.completed]) == []


def test_update_missing_job(store):
    with pytest.raises(JobNotFound):
        store.update("video_missing", request_cancel)


def test_a_worker_that_lost_its_job_changes_nothing(store):
    job = store.create(new_job(max_attempts=3))[0]
    store.update(job.id, start("w1", 60))
    store.update(job.id, recover)  # w1's lease lapsed: queued again
    for change in (heartbeat("w1", 60), complete("w1", {}, {}), fail("w1", "x", "y"), cancelled("w1")):
        with pytest.raises(LeaseLost):
            store.update(job.id, change)
    store.update(job.id, start("w2", 60))
    with pytest.raises(LeaseLost):  # now another worker's
        store.update(job.id, complete("w1", {}, {}))
    assert store.get(job.id).status is JobStatus.in_progress


def test_records_written_before_typed_params_still_load(store):
    """A record whose params is the plain dict older servers wrote (no cache, prompt_extend,
    caption_chain; attention as a dict) reads as typed parameters with their defaults."""
    old = new_job().model_dump(mode="json")
    old["attention_effective"] = "topk"  # the sparse mode's other name
    old["params"] = {"seconds": "2", "width": 64, "height": 64, "num_frames": 33, "fps": 16, "steps": 4,
                     "guidance": 5.0, "seed": 3, "negative_prompt": "", "chunk_frames": [33], "prompts": [],
                     "drift_correction": "none", "attention": {"mode": "topk", "density": 0.25},
                     "source_frames": 0}
    loaded = Job.model_validate(old)
    store.create(loaded)
    params = store.get(loaded.id).params
    assert (params.num_frames, params.chunk_frames, params.drift_correction) == (33, (33,), "none")
    assert (params.attention.mode, params.attention.density) == ("sparse", 0.25)
    assert store.get(loaded.id).attention_effective == "sparse"
    assert params.cache == CacheOptions() and params.prompt_extend is False


def test_recover_requeues_then_fails(store):
    job = store.create(new_job(max_attempts=2))[0]
    store.update(job.id, start("w1", 60))
    again = store.update(job.id, recover)
    assert (again.status, again.attempts, again.worker_id) == (JobStatus.queued, 1, None)
    assert ids(store.with_status([JobStatus.queued])) == [job.id]
    store.update(job.id, start("w2", 60))
    lost = store.update(job.id, recover)
    assert (lost.status, lost.attempts, lost.error.code) == (JobStatus.failed, 2, "worker_lost")
    assert store.with_status([JobStatus.queued, JobStatus.in_progress]) == []


def test_two_threads_race_to_start(store):
    barrier = threading.Barrier(2)

    def take(job_id, worker_id):
        barrier.wait()
        try:
            return store.update(job_id, start(worker_id, 60))
        except InvalidTransition:
            return None

    for _ in range(10):  # one round can miss a broken store by luck; ten rarely do
        job = store.create(new_job())[0]
        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(take, [job.id, job.id], ["w1", "w2"]))
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        assert store.get(job.id) == winners[0] and winners[0].attempts == 1


def _start_in_child(opener, job_id, barrier):
    cls, args = opener
    store = cls(*args)  # each process opens its own store
    barrier.wait(timeout=30)
    try:
        store.update(job_id, start(f"worker-{multiprocessing.current_process().name}", 60))
    except InvalidTransition:
        sys.exit(LOST_RACE)


def test_two_processes_race_to_start(store):
    job = store.create(new_job())[0]
    opener = ((SQLiteJobStore, (str(store.path),)) if isinstance(store, SQLiteJobStore)
              else (RedisJobStore, (store.url, store.prefix)))
    ctx = multiprocessing.get_context("spawn")  # a clean process, as a real worker would be
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_start_in_child, args=(opener, job.id, barrier)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert sorted(p.exitcode for p in procs) == [0, LOST_RACE]
    final = store.get(job.id)
    assert (final.status, final.attempts) == (JobStatus.in_progress, 1)


def test_with_status_is_oldest_first(store):
    a, b, c, d = (store.create(new_job())[0] for _ in range(4))
    store.update(b.id, start("w1", 60))
    store.update(c.id, request_cancel)
    assert ids(store.with_status([JobStatus.queued])) == [a.id, d.id]
    assert ids(store.with_status([JobStatus.in_progress, JobStatus.queued])) == [a.id, b.id, d.id]
    assert store.with_status([]) == []
    assert store.count_by_status() == {**{s: 0 for s in JobStatus}, JobStatus.queued: 2,
                                       JobStatus.in_progress: 1, JobStatus.cancelled: 1}


def test_delete(store):
    keep = store.create(new_job())[0]
    gone = store.create(new_job(idempotency_key="k"))[0]
    assert store.delete(gone.id) is True
    assert store.delete(gone.id) is False
    assert store.get(gone.id) is None
    assert ids(store.list()[0]) == [keep.id]
    assert ids(store.with_status([JobStatus.queued])) == [keep.id]
    with pytest.raises(JobNotFound):
        store.update(gone.id, request_cancel)
    assert store.create(new_job(idempotency_key="k"))[1]  # the key is free again


def test_webhook_deliveries_are_pending_in_order_until_done(store):
    made = [WebhookDelivery(url=f"https://example.com/{i}", event_id=f"evt_{i}", body=f'{{"n":{i}}}')
            for i in range(12)]  # past 10, so ids must sort as numbers, not as text
    delivery_ids = [store.add_delivery(d) for d in made]
    assert len(set(delivery_ids)) == 12
    store.delivery_done(delivery_ids[1])
    store.delivery_done(delivery_ids[1])  # again: nothing left to forget
    assert store.pending_deliveries() == [(i, d) for i, d in zip(delivery_ids, made) if i != delivery_ids[1]]
    for delivery_id in delivery_ids:
        store.delivery_done(delivery_id)
    assert store.pending_deliveries() == [] and store.with_status(JobStatus) == []  # kept apart from jobs


# LocalStorage


def test_storage_round_trip(tmp_path):
    storage = LocalStorage(tmp_path / "files")
    assert storage.put_bytes("video_a/thumbnail.webp", b"thumb") == "video_a/thumbnail.webp"
    src = tmp_path / "render.mp4"
    src.write_bytes(b"mp4 data")
    assert storage.put_file("video_a/video.mp4", src) == "video_a/video.mp4"
    assert not src.exists()  # moved, not copied
    assert storage.read_bytes("video_a/video.mp4") == b"mp4 data"
    assert storage.size("video_a/video.mp4") == len(b"mp4 data")
    with storage.open("video_a/video.mp4") as file:
        file.seek(4)
        assert file.read() == b"data"
    assert storage.copy("video_a/video.mp4", "video_b/source.mp4") == "video_b/source.mp4"
    assert storage.read_bytes("video_b/source.mp4") == b"mp4 data"
    assert storage.exists("video_a/thumbnail.webp") and not storage.exists("video_a/missing.mp4")
    storage.put_bytes("video_a/thumbnail.webp", b"new")  # replaces
    assert storage.read_bytes("video_a/thumbnail.webp") == b"new"
    with pytest.raises(FileNotFoundError):
        storage.size("video_a/missing.mp4")
    assert sorted(p.name for p in (tmp_path / "files" / "video_a").iterdir()) == ["thumbnail.webp", "video.mp4"]


def test_storage_delete_prefix(tmp_path):
    storage = LocalStorage(tmp_path)
    for key in ["video_a/video.mp4", "video_a/thumb.webp", "video_ab/video.mp4"]:
        storage.put_bytes(key, b"x")
    storage.delete_prefix("video_a/")
    assert not storage.exists("video_a/video.mp4") and not storage.exists("video_a/thumb.webp")
    assert storage.exists("video_ab/video.mp4")
    storage.delete_prefix("video_missing")  # nothing to do is fine


@pytest.mark.parametrize("key", ["", "../etc/passwd", "video_a/../../x", "/etc/passwd", "video_a\\video.mp4",
                                 ".", "video_a//video.mp4"])
def test_storage_rejects_bad_keys(tmp_path, key):
    storage = LocalStorage(tmp_path)
    with pytest.raises(ValueError):
        storage.open(key)
    with pytest.raises(ValueError):
        storage.put_bytes(key, b"x")
    with pytest.raises(ValueError):
        storage.delete_prefix(key)
