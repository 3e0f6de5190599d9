"""A job for a model that cannot run is refused at submission, never queued to fail or to
wait for nobody: embedded, a model whose weights are not on the machine (400); Celery, a
model no live worker holds (503 with Retry-After), unless jobs may wait for workers yet to
start. The playground's model list marks such models."""

from __future__ import annotations

import httpx
import pytest
import redis
from polling import eventually
from servers import Server, Worker

from vidserve.errors import ModelUnavailable
from vidserve.workers.celery_app import queue_name

TINY = {"model": "wan-tiny", "prompt": "a fox", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
NO_CHAT = {"VIDSERVE_CHAT_MODEL": ""}


def post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/videos", json=body, timeout=30)


def listed(url: str) -> list[dict]:
    return httpx.get(f"{url}/v1/videos", timeout=10).json()["data"]


def availability(url: str) -> dict[str, dict]:
    response = httpx.get(f"{url}/playground/models", timeout=10)
    assert response.status_code == 200, response.text
    return {model["id"]: model for model in response.json()["data"]}


def assert_model_unavailable(response: httpx.Response, status: int, message: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["message"]) == ("model_unavailable", "model", message)


# --- embedded: weights on this machine ---------------------------------------------------------


@pytest.fixture(scope="module")
def bare_machine(tmp_path_factory):
    """An embedded server on a machine whose hub cache is empty and which cannot download."""
    root = tmp_path_factory.mktemp("bare")
    hf = root / "hf"
    env = {**NO_CHAT, "HF_HOME": str(hf), "HF_HUB_CACHE": str(hf / "hub"), "HF_HUB_OFFLINE": "1"}
    server = Server(root / "data", env=env).start()
    try:
        yield server
    finally:
        server.stop()


def test_a_model_whose_weights_are_absent_is_refused_and_nothing_is_queued(bare_machine):
    response = post(bare_machine.url, {"model": "Wan2.1-T2V-1.3B", "prompt": "a fox"})
    # The message the job would have failed with, now before there is a job.
    assert_model_unavailable(response, 400, str(ModelUnavailable("Wan-AI/Wan2.1-T2V-1.3B-Diffusers")))
    assert listed(bare_machine.url) == []


def test_the_playground_marks_a_model_whose_weights_are_absent(bare_machine):
    models = availability(bare_machine.url)
    absent = models["Wan2.1-T2V-1.3B"]
    assert absent["available"] is False and "hf download Wan-AI/Wan2.1-T2V-1.3B-Diffusers" in absent["reason"]
    assert models["wan-tiny"] == {"id": "wan-tiny", "available": True, "reason": None}  # built in: always here


# --- Celery: a live worker for the model ---------------------------------------------------------


@pytest.fixture
def celery_env(redis_url, tmp_path):
    url = redis_url.rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(url).flushdb()
    return tmp_path / "data", {**NO_CHAT, "VIDSERVE_REDIS_URL": url}


def queued_messages(env: dict, model: str) -> int:
    return redis.Redis.from_url(env["VIDSERVE_REDIS_URL"]).llen(queue_name(model))


def test_a_model_without_a_worker_is_a_503_until_one_starts(celery_env):
    data, env = celery_env
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = None
    try:
        response = post(server.url, TINY)
        assert_model_unavailable(response, 503,
                                 "no worker serves model wan-tiny; start one with `vidserve worker --model wan-tiny`")
        assert int(response.headers["retry-after"]) > 0
        assert listed(server.url) == [] and queued_messages(env, "wan-tiny") == 0
        assert availability(server.url)["wan-tiny"]["available"] is False

        worker = Worker(data, "wan-tiny", env, "late").start()

        def accepted() -> str:
            response = post(server.url, TINY)
            assert response.status_code == 200, response.text
            return response.json()["id"]

        video_id = eventually(accepted, timeout=30, what="a submission once the worker runs")
        assert availability(server.url)["wan-tiny"]["available"] is True

        def finished() -> dict:
            video = httpx.get(f"{server.url}/v1/videos/{video_id}", timeout=10).json()
            assert video["status"] in ("completed", "failed"), video["status"]
            return video

        assert eventually(finished, what="the job to run")["status"] == "completed"
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


def test_queue_without_workers_accepts_a_job_no_worker_holds_and_keeps_it_queued(celery_env):
    data, env = celery_env
    server = Server(data, env={**env, "VIDSERVE_QUEUE_WITHOUT_WORKERS": "1"}, extra=["--queue", "celery"]).start()
    try:
        response = post(server.url, TINY)
        assert response.status_code == 200, response.text
        assert [video["status"] for video in listed(server.url)] == ["queued"]
        assert queued_messages(env, "wan-tiny") == 1  # waiting for the worker a scaler starts
        assert availability(server.url)["wan-tiny"]["available"] is True  # a job for it is accepted
    finally:
        server.stop()
