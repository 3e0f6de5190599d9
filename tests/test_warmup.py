"""The embedded worker warms up before the server says it is ready: one tiny generation of the
default model, so the first job finds the model loaded and already run. Checked by what was
loaded and run when, never by timing (benchmarks/first_job.py measures the times)."""

from __future__ import annotations

import logging
import threading

from apps import app_client
from polling import eventually

from vidserve.pipelines import chain, video
from vidserve.pipelines.video import VideoPipeline

JOB = {"prompt": "a fox", "size": "64x64", "seconds": "1", "num_inference_steps": 2, "seed": 3}


def ready(client) -> bool:
    return client.get("/readyz").status_code == 200


def completed(client, video_id: str) -> bool:
    status = client.get(f"/v1/videos/{video_id}").json()["status"]
    assert status in ("queued", "in_progress", "completed"), status
    return status == "completed"


def counted_loads(monkeypatch) -> list[str]:
    """The models loaded from now on, in order, with none resident yet in this process."""
    monkeypatch.setattr(video, "_loaded", {})  # other tests in this process may have loaded them
    loads = []
    load = VideoPipeline.load.__func__

    def counting(cls, spec, *args, **kwargs):
        loads.append(spec.name)
        return load(cls, spec, *args, **kwargs)

    monkeypatch.setattr(VideoPipeline, "load", classmethod(counting))
    return loads


def test_not_ready_while_warming_up_and_jobs_wait_for_it(tmp_path, monkeypatch):
    gate, warm_ups = threading.Event(), []
    generate = chain.generate_video

    def held(request, *args, **kwargs):
        warm_ups.append(request)
        assert gate.wait(60), "the test never let the warm-up go"
        return generate(request, *args, **kwargs)

    monkeypatch.setattr(chain, "generate_video", held)
    with app_client(tmp_path, warmup=True) as (client, _):
        eventually(lambda: warm_ups, what="the warm-up to start")
        answer = client.get("/readyz")
        assert answer.status_code == 503 and answer.json()["error"]["code"] == "warming_up"
        assert "warming up" in answer.json()["error"]["message"]
        assert client.get("/healthz").status_code == 200  # up, only not ready
        queued = client.post("/v1/videos", json=JOB).json()
        assert client.get(f"/v1/videos/{queued['id']}").json()["status"] == "queued"  # it waits its turn
        monkeypatch.setattr(chain, "generate_video", generate)
        gate.set()
        eventually(lambda: ready(client), what="/readyz to say ready")
        eventually(lambda: completed(client, queued["id"]), what="the job to complete")
    warm_up = warm_ups[0]
    assert (warm_up.model, warm_up.steps, len(warm_up.chunk_frames)) == ("wan-tiny", 2, 1)  # tiny: one chunk, 2 steps


def test_the_first_job_finds_the_default_model_loaded(tmp_path, monkeypatch):
    loads = counted_loads(monkeypatch)
    with app_client(tmp_path, warmup=True) as (client, _):
        eventually(lambda: ready(client), what="/readyz to say ready")
        assert loads == ["wan-tiny"]  # loaded, and run, before the server said ready
        first = client.post("/v1/videos", json=JOB).json()
        eventually(lambda: completed(client, first["id"]), what="the first job to complete")
        assert loads == ["wan-tiny"]  # the first job loaded nothing


def test_without_warm_up_the_first_job_loads_the_model(tmp_path, monkeypatch):
    loads = counted_loads(monkeypatch)
    with app_client(tmp_path, warmup=False) as (client, _):
        assert ready(client) and loads == []
        first = client.post("/v1/videos", json=JOB).json()
        eventually(lambda: completed(client, first["id"]), what="the first job to complete")
        assert loads == ["wan-tiny"]


def test_a_default_model_not_on_this_machine_is_not_fetched_to_warm_up(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    loads = counted_loads(monkeypatch)
    with app_client(tmp_path, warmup=True, default_model="Wan2.1-T2V-1.3B") as (client, _):
        eventually(lambda: ready(client), what="/readyz to say ready")
    assert loads == []


def test_an_image_to_video_default_model_warms_up_from_a_gray_frame(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vidserve.runner")
    loads = counted_loads(monkeypatch)
    with app_client(tmp_path, warmup=True, default_model="wan-tiny-i2v") as (client, _):
        eventually(lambda: ready(client), what="/readyz to say ready")
    assert loads == ["wan-tiny-i2v"]
    assert any("warmed up wan-tiny-i2v" in r.getMessage() for r in caplog.records), caplog.text
