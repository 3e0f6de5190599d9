"""A job run again after its worker was lost goes on from its last finished chunk: the chain's
state round-trips through bytes, a resumed chain makes what the whole one would have, and the
runner keeps the recorded chunks and their segments (the stream never shrinks) and makes only
the rest, falling back to an earlier chunk, or the start, where a state cannot be read back.
(tests/test_crash_safety.py kills a real server mid-job.)"""

from __future__ import annotations

import numpy as np
import pytest

from drift_doubles import SyntheticDriftGenerator
from vidserve.config import Settings
from vidserve.jobs import Job, JobStatus
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.media import read_video_bytes
from vidserve.media.drift import Anchor, ChainState, chain
from vidserve.params import JobParams
from vidserve.storage import LocalStorage
from vidserve.workers.lease import recover_lost_jobs
from vidserve.workers.runner import JobRunner

PLAN = [6, 6, 6, 6]


def states_of(plan, **kwargs) -> tuple[np.ndarray, list, list[ChainState]]:
    states = []
    frames, metrics = chain(SyntheticDriftGenerator(), plan, on_state=states.append, **kwargs)
    return frames, metrics, states


@pytest.mark.parametrize("correction", ["color", "none"])
@pytest.mark.parametrize("stopped_after", [1, 2, 4])
def test_a_chain_resumed_from_a_stored_state_makes_what_the_whole_chain_made(correction, stopped_after):
    whole, metrics, states = states_of(PLAN, correction=correction, seed=3)
    stored = ChainState.from_bytes(states[stopped_after - 1].to_bytes())
    rest, rest_metrics = chain(SyntheticDriftGenerator(), PLAN, correction=correction, seed=3, resume=stored)
    made_before = PLAN[0] + (PLAN[1] - 1) * (stopped_after - 1)  # each later chunk drops its condition frame
    np.testing.assert_array_equal(rest, whole[made_before:])
    assert rest_metrics == metrics[stopped_after:]


def test_a_continued_video_resumes_against_its_own_anchor():
    last_frame = SyntheticDriftGenerator().generate(None, 3, seed=1)[-1]
    start = {"condition": last_frame, "anchor": Anchor.from_frames(last_frame[None]), "continuing": True}
    whole, metrics, states = states_of([5, 5, 5], **start)
    rest, rest_metrics = chain(SyntheticDriftGenerator(), [5, 5, 5], continuing=True,
                               resume=ChainState.from_bytes(states[0].to_bytes()))
    np.testing.assert_array_equal(rest, whole[4:])
    assert rest_metrics == metrics[1:]


@pytest.mark.parametrize("data", [b"", b"not an npz", b"PK\x03\x04 truncated zip"])
def test_a_damaged_state_is_a_value_error(data):
    with pytest.raises(ValueError):
        ChainState.from_bytes(data)


# --- the runner, on wan-tiny: 3 chunks of 9 frames, 2 steps each ---

STEPS, CHUNKS = 2, (9, 9, 9)


class Watched(SQLiteJobStore):
    """The real job store, noting the job's segments after each write (the stream as a player saw
    it); with `lose_worker_after`, the job's worker is lost (its lease lapses and the reaper queues
    the job again, as after a kill -9) once that many of its chunks are recorded."""

    def __init__(self, path, lose_worker_after: int | None = None):
        super().__init__(path)
        self.lose_worker_after = lose_worker_after
        self.seen: list[list[str]] = []

    def update(self, job_id, change):
        job = super().update(job_id, change)
        self.seen.append([s.name for s in job.segments])
        if len(job.chunks) == self.lose_worker_after:
            self.lose_worker_after = None
            super().update(job_id, _lease_lapsed)
            assert [j.id for j in recover_lost_jobs(self)] == [job_id]
        return job


def _lease_lapsed(job: Job) -> None:
    job.lease_expires_at = 1.0  # long past


@pytest.fixture
def files(tmp_path) -> LocalStorage:
    return LocalStorage(tmp_path / "files")


def runner_for(store, files, tmp_path, name: str) -> JobRunner:
    return JobRunner(Settings(data_dir=tmp_path / "data"), store, files, worker_id=name)


def submit(store) -> Job:
    params = JobParams(width=64, height=64, num_frames=sum(CHUNKS) - len(CHUNKS) + 1, fps=16, steps=STEPS,
                       guidance=1.0, seed=5, chunk_frames=CHUNKS, seconds="1.5625")
    job, _ = store.create(Job(model="wan-tiny", prompt="a fox", params=params))
    return job


def steps_run(runner: JobRunner) -> float:
    return runner.metrics.registry.get_sample_value("vidserve_denoise_step_seconds_count", {"model": "wan-tiny"}) or 0


def interrupted(tmp_path, files, after_chunks: int) -> tuple[Watched, Job]:
    """A job whose first worker was lost once `after_chunks` chunks were recorded: queued again
    (and the store's `seen` emptied, for the rerun's)."""
    store = Watched(tmp_path / "jobs.sqlite", lose_worker_after=after_chunks)
    job = submit(store)
    runner_for(store, files, tmp_path, "first").run(job.id)
    again = store.get(job.id)
    assert (again.status, again.attempts, len(again.segments)) == (JobStatus.queued, 1, after_chunks)
    store.seen.clear()
    return store, again


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> tuple[Job, LocalStorage]:
    """The same job, run start to end, for its outputs to compare with."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    store = SQLiteJobStore(folder / "jobs.sqlite")
    runner = runner_for(store, LocalStorage(folder / "files"), folder, "whole")
    final = runner.run(submit(store).id)
    yield final, runner.storage
    store.close()


def video_frames(storage, job: Job) -> np.ndarray:
    return read_video_bytes(storage.read_bytes(job.outputs["video"]))[0]


def test_a_rerun_goes_on_from_the_last_recorded_chunk_and_makes_the_same_video(tmp_path, files, uninterrupted):
    store, queued = interrupted(tmp_path, files, after_chunks=2)
    kept = list(queued.segments)
    rerun = runner_for(store, files, tmp_path, "second")
    final = rerun.run(queued.id)
    assert (final.status, final.attempts) == (JobStatus.completed, 2)
    assert steps_run(rerun) == STEPS * 1  # only the third chunk was made again
    assert final.segments[:2] == kept and [s.name for s in final.segments] == ["0.m4s", "1.m4s", "2.m4s"]
    whole, whole_storage = uninterrupted
    np.testing.assert_array_equal(video_frames(files, final), video_frames(whole_storage, whole))
    assert [c.drift for c in final.chunks] == [c.drift for c in whole.chunks]
    assert not files.exists(f"{final.id}/chain/0.npz")  # a completed job's states are gone


def test_a_rerun_lost_after_its_last_chunk_makes_nothing_again(tmp_path, files, uninterrupted):
    store, queued = interrupted(tmp_path, files, after_chunks=3)
    rerun = runner_for(store, files, tmp_path, "second")
    final = rerun.run(queued.id)
    assert final.status is JobStatus.completed and steps_run(rerun) == 0
    whole, whole_storage = uninterrupted
    np.testing.assert_array_equal(video_frames(files, final), video_frames(whole_storage, whole))


def test_a_missing_state_falls_back_to_the_chunk_before_and_keeps_the_stream(tmp_path, files, uninterrupted):
    store, queued = interrupted(tmp_path, files, after_chunks=2)
    files.delete_prefix(f"{queued.id}/chain/1.npz")
    rerun = runner_for(store, files, tmp_path, "second")
    final = rerun.run(queued.id)
    assert final.status is JobStatus.completed
    assert steps_run(rerun) == STEPS * 2  # chunks 2 and 3
    assert all(names[:2] == ["0.m4s", "1.m4s"] for names in store.seen)  # chunk 2 made again in its place
    whole, whole_storage = uninterrupted
    np.testing.assert_array_equal(video_frames(files, final), video_frames(whole_storage, whole))


def test_with_no_state_readable_a_rerun_starts_over_in_place(tmp_path, files):
    store, queued = interrupted(tmp_path, files, after_chunks=2)
    files.delete_prefix(f"{queued.id}/chain/")
    rerun = runner_for(store, files, tmp_path, "second")
    final = rerun.run(queued.id)
    assert (final.status, final.attempts) == (JobStatus.completed, 2)
    assert steps_run(rerun) == STEPS * 3
    assert all(names[:2] == ["0.m4s", "1.m4s"] for names in store.seen)  # remade in their places
    assert [s.name for s in final.segments] == ["0.m4s", "1.m4s", "2.m4s"]
