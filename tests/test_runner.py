"""How the runner ends a job: a bug fails it (with its traceback in the log), only a deleted
or cancelled job ends quietly, and a finished clip that is blank carries a warning, as does each
chunk that is, as soon as it is made."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from vidserve.config import Settings
from vidserve.errors import ModelUnavailable
from vidserve.jobs import Job, JobStatus
from vidserve.jobs.video_object import VideoObject
from vidserve.media.drift import Anchor, measure
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.options import AttentionOptions
from vidserve.params import JobParams
from vidserve.pipelines import chain
from vidserve.storage import LocalStorage
from vidserve.workers.runner import JobRunner


@pytest.fixture
def runner(tmp_path):
    store = SQLiteJobStore(tmp_path / "jobs.sqlite")
    yield JobRunner(Settings(data_dir=tmp_path / "data"), store, LocalStorage(tmp_path / "files"), worker_id="w1")
    store.close()


def queued(runner: JobRunner, **fields) -> Job:
    params = JobParams(**{"width": 96, "height": 80, "num_frames": 9, "fps": 12, "steps": 2, "guidance": 1.0,
                          "seed": 1, "chunk_frames": (9,), "seconds": "0.66667", **fields})
    job, _ = runner.store.create(Job(model="wan-tiny", prompt="a fox", params=params))
    return job


def test_a_pipeline_bug_fails_the_job_and_logs_the_traceback(runner, monkeypatch, caplog):
    def buggy(request, *args, **kwargs):
        return {}["frames"]  # a KeyError from a bug, not from a deleted job

    monkeypatch.setattr(chain, "generate_video", buggy)
    job = queued(runner)
    with caplog.at_level(logging.ERROR, logger="vidserve.runner"):
        final = runner.run(job.id)
    assert final.status is JobStatus.failed
    assert (final.error.code, final.error.message) == ("generation_failed", "KeyError: 'frames'")
    assert runner.store.get(job.id).status is JobStatus.failed
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is KeyError]
    assert logged and job.id in logged[0].getMessage()


def test_a_job_deleted_while_running_ends_quietly_and_leaves_no_files(runner, monkeypatch, caplog):
    def deleted_mid_run(request, device, dtype, *, on_step, **kwargs):
        runner.storage.put_bytes(f"{job.id}/chunk-0.mp4", b"partial")
        runner.store.delete(job.id)
        on_step(1, 2)  # the next progress report finds the job gone
        raise AssertionError("on_step must stop a deleted job")

    monkeypatch.setattr(chain, "generate_video", deleted_mid_run)
    job = queued(runner)
    with caplog.at_level(logging.INFO, logger="vidserve.runner"):
        assert runner.run(job.id) is None
    assert runner.store.get(job.id) is None
    assert not runner.storage.exists(f"{job.id}/chunk-0.mp4")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("JobNotFound" in r.getMessage() for r in caplog.records)


def test_a_cancel_request_ends_the_job_cancelled_not_failed(runner, monkeypatch):
    from vidserve import jobs

    def cancelled_mid_run(request, device, dtype, *, on_step, **kwargs):
        runner.store.update(job.id, jobs.request_cancel)
        on_step(1, 2)
        raise AssertionError("on_step must stop a cancelled job")

    monkeypatch.setattr(chain, "generate_video", cancelled_mid_run)
    job = queued(runner)
    final = runner.run(job.id)
    assert final.status is JobStatus.cancelled and final.error is None


def test_a_model_that_cannot_be_fetched_fails_the_job_with_model_unavailable(runner, monkeypatch):
    def offline(request, *args, **kwargs):
        raise ModelUnavailable("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")

    monkeypatch.setattr(chain, "generate_video", offline)
    final = runner.run(queued(runner).id)
    assert final.status is JobStatus.failed and final.error.code == "model_unavailable"
    assert "hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers" in final.error.message


def test_a_blank_video_completes_with_a_warning_logged_and_counted(runner, monkeypatch, caplog):
    def blank(request, *args, **kwargs):
        frames = np.zeros((request.num_frames, request.height, request.width, 3), np.uint8)
        return chain.VideoResult(frames=frames, fps=request.fps, seed=request.seed, timings={"denoise": 0.1})

    monkeypatch.setattr(chain, "generate_video", blank)
    job = queued(runner)
    with caplog.at_level(logging.WARNING, logger="vidserve.runner"):
        final = runner.run(job.id)
    assert final.status is JobStatus.completed
    expected = [{"code": "blank_output", "chunk": None,
                 "message": "all 9 frames are nearly black (mean luma 0.0/255); try another seed or prompt"}]
    assert VideoObject.of(runner.store.get(job.id)).model_dump()["warnings"] == expected
    assert any(job.id in r.getMessage() and "blank_output" in r.getMessage() for r in caplog.records)
    count = runner.metrics.registry.get_sample_value("vidserve_output_warnings_total",
                                                     {"model": "wan-tiny", "code": "blank_output"})
    assert count == 1


def moving_square(frames: int) -> np.ndarray:
    """A white square crossing a black 96x80 frame: a normal clip."""
    clip = np.zeros((frames, 80, 96, 3), np.uint8)
    for t in range(frames):
        clip[t, 30:42, 10 + 2 * t:22 + 2 * t] = 255
    return clip


def chained(runner: JobRunner, monkeypatch, *chunks: np.ndarray) -> tuple[Job, list[list[dict]]]:
    """A job of these chunks, made one after another through the runner's on_chunk; the video's
    warnings as the job store held them after each chunk, and the finished job."""
    seen = []

    def generate(request, *args, on_chunk, **kwargs):
        anchor = Anchor.from_frames(chunks[0])
        for index, frames in enumerate(chunks):
            on_chunk(index, frames, measure(frames, anchor), request.prompt)
            seen.append([w.model_dump() for w in runner.store.get(job.id).warnings])
        return chain.VideoResult(frames=np.concatenate(chunks), fps=request.fps, seed=request.seed, timings={})

    monkeypatch.setattr(chain, "generate_video", generate)
    job = queued(runner, chunk_frames=tuple(len(c) for c in chunks), num_frames=sum(len(c) for c in chunks))
    return runner.run(job.id), seen


def test_a_blank_chunk_is_flagged_as_it_is_made_and_named(runner, monkeypatch):
    final, seen = chained(runner, monkeypatch, moving_square(9), np.zeros((8, 80, 96, 3), np.uint8),
                          moving_square(8))
    warning = {"code": "blank_output", "chunk": 1,
               "message": "chunk 2: all 8 frames are nearly black (mean luma 0.0/255); try another seed or prompt"}
    assert seen == [[], [warning], [warning]]  # on the video while it is made, from the chunk on
    assert final.status is JobStatus.completed
    assert VideoObject.of(final).model_dump()["warnings"] == [warning]  # the whole video moves: only the chunk's
    assert runner.metrics.registry.get_sample_value("vidserve_output_warnings_total",
                                                    {"model": "wan-tiny", "code": "blank_output"}) == 1


def test_a_video_blank_throughout_is_called_blank_once(runner, monkeypatch):
    black = np.zeros((8, 80, 96, 3), np.uint8)
    final, seen = chained(runner, monkeypatch, black[:1].repeat(9, axis=0), black)
    assert [w["chunk"] for w in seen[-1]] == [0, 1]
    assert [(w.code, w.chunk) for w in final.warnings] == [("blank_output", None)]
    assert final.warnings[0].message.startswith("all 17 frames are nearly black")


def test_wan_tiny_noise_completes_without_warnings(runner):
    final = runner.run(queued(runner).id)
    assert final.status is JobStatus.completed and VideoObject.of(final).model_dump()["warnings"] == []
    assert runner.metrics.registry.get_sample_value("vidserve_output_warnings_total",
                                                    {"model": "wan-tiny", "code": "blank_output"}) is None


@pytest.mark.parametrize(("attention", "effective"), [
    ({"mode": "dense"}, "dense"),
    ({"mode": "topk"}, "dense"),  # 3x5x6 tokens, under min_tokens
    ({"mode": "sparse", "min_tokens": 0, "tile": (1, 2, 2)}, "sparse"),
])
def test_the_video_says_which_attention_ran(runner, attention, effective):
    final = runner.run(queued(runner, attention=AttentionOptions(**attention)).id)
    assert final.status is JobStatus.completed
    assert VideoObject.of(final).attention == {**AttentionOptions(**attention).model_dump(), "effective": effective}


def test_a_one_chunk_video_is_stored_once_as_the_video(runner, tmp_path):
    final = runner.run(queued(runner).id)
    assert [chunk.key for chunk in final.chunks] == [final.outputs["video"]] == [f"{final.id}/video.mp4"]
    assert sorted(p.name for p in (tmp_path / "files" / final.id).iterdir()) == ["spritesheet.jpg", "stream",
                                                                            "thumbnail.webp", "video.mp4"]
    # Its stream: the init segment and the one chunk's segment, nothing else.
    assert sorted(p.name for p in (tmp_path / "files" / final.id / "stream").iterdir()) == ["0.m4s", "init.mp4"]
