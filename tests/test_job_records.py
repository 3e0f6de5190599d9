"""A job's live-video records are typed, and a record stored before they were (plain dicts, a
segment named by its file) loads into them from either store, and goes on as any other.

`data/job_record_before_typed_records.json` is a record as the store held it before: written
by that code's own transitions (a prompt update, then two chunks with their segments and a
blank chunk's warning) through SQLiteJobStore."""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest

from vidserve import jobs
from vidserve.jobs import ChunkDrift, ChunkRecord, Job, JobStatus, PromptUpdate, SegmentRecord
from vidserve.jobs.files import JobFiles, segment_chunk, segment_name
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.jobs.video_object import VideoObject
from vidserve.media.hls import Timeline
from vidserve.workers.resume import resume_point

OLD_RECORD = (Path(__file__).parent / "data" / "job_record_before_typed_records.json").read_text()
WORKER = "worker-1"


@pytest.fixture(params=["sqlite", "redis"])
def old_job_in_store(request, tmp_path):
    """A store holding the old record, written there as raw bytes, the way it was stored."""
    job = Job.model_validate_json(OLD_RECORD)
    if request.param == "sqlite":
        store = SQLiteJobStore(tmp_path / "jobs.db")
        store.create(job)
        with sqlite3.connect(tmp_path / "jobs.db") as db:
            db.execute("UPDATE jobs SET data = ? WHERE id = ?", (OLD_RECORD, job.id))
    else:
        store = RedisJobStore(request.getfixturevalue("redis_url"), prefix=f"test-{uuid.uuid4().hex}")
        store.create(job)
        store._redis.set(store._key("job", job.id), OLD_RECORD)
    yield store, job.id
    store.close()


def test_the_old_record_is_stored_as_plain_dicts():
    """The fixture is what it says: the shapes the store held before, not the new ones."""
    raw = json.loads(OLD_RECORD)
    assert [s["name"] for s in raw["segments"]] == ["0.m4s", "1.m4s"] and "chunk" not in raw["segments"][0]
    assert raw["chunks"][1]["drift"]["luma_change"] == -0.0123 and raw["prompt_updates"][0]["from_chunk"] == 1


def test_a_record_stored_before_typed_records_loads_and_reads_the_same(old_job_in_store):
    store, job_id = old_job_in_store
    job = store.get(job_id)
    files = JobFiles(job_id)
    assert job.chunks == [ChunkRecord(index=i, frames=17, key=files.chunk_video(i), prompt=prompt,
                                      drift=ChunkDrift(**json.loads(OLD_RECORD)["chunks"][i]["drift"]))
                          for i, prompt in enumerate(["a red ball", "a blue ball"])]
    assert job.segments == [SegmentRecord(chunk=i, key=files.segment(i), frames=17, seconds=1.0625) for i in (0, 1)]
    assert [s.name for s in job.segments] == ["0.m4s", "1.m4s"] and job.stream_init_key == files.stream_init
    assert job.prompt_updates == [PromptUpdate(from_chunk=1, prompt="a blue ball")]
    assert [jobs.steered_prompt(job, i) for i in (0, 1, 2)] == [None, "a blue ball", "a blue ball"]
    video = VideoObject.of(job)
    assert [(c.index, c.segment) for c in video.chunks] == [
        (i, f"/v1/videos/{job_id}/stream/{i}.m4s") for i in (0, 1)]
    assert video.chunks[1].drift.luma_change == -0.0123
    assert [w.chunk for w in job.warnings] == [1]


def test_an_old_record_goes_on_as_a_new_one(old_job_in_store):
    """Its next chunk is added after the old ones, a chunk made again replaces its old record in
    place, and the record is written back in the new shape."""
    store, job_id = old_job_in_store
    files = JobFiles(job_id)
    old = store.get(job_id)
    again = old.chunks[1].model_copy(update={"frames": 16})
    third = ChunkRecord(index=2, frames=17, key=files.chunk_video(2), drift=old.chunks[0].drift)
    store.update(job_id, jobs.chunk_done(WORKER, again, old.segments[1].model_copy(update={"frames": 16}),
                                         files.stream_init))
    job = store.update(job_id, jobs.chunk_done(WORKER, third, SegmentRecord(chunk=2, key=files.segment(2), frames=17,
                                                                               seconds=1.0625), files.stream_init))
    assert [(c.index, c.frames) for c in job.chunks] == [(0, 17), (1, 16), (2, 17)]
    assert [(s.chunk, s.frames) for s in job.segments] == [(0, 17), (1, 16), (2, 17)]
    assert store.get(job_id) == job and job.status is JobStatus.in_progress
    assert all("name" not in s and "chunk" in s for s in json.loads(job.model_dump_json())["segments"])


def test_a_rerun_of_an_old_record_keeps_its_chunks(old_job_in_store):
    """The resume point reads the old segments by chunk: a missing chain state means starting
    over, never a KeyError on a segment's old name."""
    store, job_id = old_job_in_store
    resume, timeline = resume_point(store.get(job_id), 3, lambda key: (_ for _ in ()).throw(FileNotFoundError(key)))
    assert resume is None and timeline.media == Timeline().media


@pytest.mark.parametrize("chunk", [None, 0, 7, 123456])
def test_segment_names_and_chunks_are_one_mapping(chunk):
    assert segment_chunk(segment_name(chunk)) == chunk


@pytest.mark.parametrize("name", ["init.mp4", "7.mp4", ".m4s", "-1.m4s", "source", "x.m4s", "1.5.m4s"])
def test_other_names_are_no_segment(name):
    with pytest.raises(ValueError):
        segment_chunk(name)
