"""Quotas hold under a burst: a key's `max_active_jobs` and the server's `VIDSERVE_MAX_QUEUED`
are checked in the same atomic step that stores the job, so 40 requests at once from one key
with room for 20 get exactly 20 jobs, on the embedded server and on two Celery API processes
sharing one Redis; the rest get the 429 one request over the limit always got."""

from __future__ import annotations

import io
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from apps import app_client, idle_services
from PIL import Image
from polling import eventually
from servers import Server
from stores import RedisServer

from vidserve.jobs import AdmissionLimits, Job, JobStatus, QuotaExceeded, start
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.keys import key_digest
from vidserve.params import JobParams

KEYS = {"team-a": "key-a-0123456789", "team-b": "key-b-0123456789"}
BODY = {"model": "wan-tiny", "prompt": "a red fox", "size": "64x64", "num_frames": 17, "num_inference_steps": 1}
BURST = 40
KEY_LIMIT = 20  # team-a's max_active_jobs
QUEUE_LIMIT = 30  # VIDSERVE_MAX_QUEUED: room for 10 more once team-a's 20 are queued
# Runs on the embedded worker for as long as the bursts take (it is cancelled after), so every
# job they queue stays queued and counted: none finishes and frees a place meanwhile.
BLOCKER = {**BODY, "num_frames": 81, "num_inference_steps": 100}


def keys_file(folder) -> str:
    """team-a may have KEY_LIMIT jobs queued or running; team-b any number (only the queue limits it)."""
    quotas = {"team-a": KEY_LIMIT, "team-b": 0}
    path = folder / "keys.toml"
    path.write_text("".join(f'[[keys]]\nname = "{name}"\nsha256 = "{key_digest(key)}"\n'
                            f"max_active_jobs = {quotas[name]}\n\n" for name, key in KEYS.items()))
    return str(path)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[key]}"}


def burst(urls: list[str], key: str) -> list[httpx.Response]:
    """BURST creates from `key` released together, spread over the API processes at `urls`."""
    barrier = threading.Barrier(BURST)
    pairs = [(urls[i % len(urls)], i) for i in range(BURST)]

    with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=BURST)) as client:
        def create(pair: tuple[str, int]) -> httpx.Response:
            url, seed = pair
            barrier.wait()
            return client.post(f"{url}/v1/videos", json={**BODY, "seed": seed}, headers=auth(key))

        with ThreadPoolExecutor(BURST) as pool:
            return list(pool.map(create, pairs))


def refusals(responses: list[httpx.Response]) -> set[tuple[int, str, str, bool]]:
    return {(r.status_code, r.json()["error"]["code"], r.json()["error"]["param"], int(r.headers["Retry-After"]) > 0)
            for r in responses if r.status_code != 200}


def queued_of(url: str, key: str) -> int:
    page = httpx.get(f"{url}/v1/videos", params={"limit": 100}, headers=auth(key), timeout=30).json()["data"]
    return sum(video["status"] == "queued" for video in page)


def check_bursts(urls: list[str]) -> None:
    """team-a's burst fills its own quota exactly; team-b's then fills the queue exactly."""
    responses = burst(urls, "team-a")
    assert sum(r.status_code == 200 for r in responses) == KEY_LIMIT, [r.status_code for r in responses]
    assert refusals(responses) == {(429, "quota_exceeded", "max_active_jobs", True)}
    assert queued_of(urls[0], "team-a") == KEY_LIMIT

    responses = burst(urls, "team-b")
    assert sum(r.status_code == 200 for r in responses) == QUEUE_LIMIT - KEY_LIMIT, [r.status_code for r in responses]
    assert refusals(responses) == {(429, "queue_full", "max_queued", True)}
    assert queued_of(urls[-1], "team-b") == QUEUE_LIMIT - KEY_LIMIT


def test_a_burst_on_the_embedded_server_gets_exactly_the_quota(tmp_path):
    env = {"VIDSERVE_KEYS_FILE": keys_file(tmp_path), "VIDSERVE_MAX_QUEUED": str(QUEUE_LIMIT),
           "VIDSERVE_CHAT_MODEL": "", "OMP_NUM_THREADS": "1"}
    server = Server(tmp_path / "data", env=env).start()
    try:
        blocker = httpx.post(f"{server.url}/v1/videos", json=BLOCKER, headers=auth("team-b"), timeout=30).json()["id"]
        eventually(lambda: httpx.get(f"{server.url}/v1/videos/{blocker}", headers=auth("team-b"),
                                     timeout=30).json()["status"] == "in_progress",
                   timeout=300, what="the blocker to run")
        check_bursts([server.url])
        status = httpx.get(f"{server.url}/v1/videos/{blocker}", headers=auth("team-b"), timeout=30).json()["status"]
        assert status == "in_progress", "the blocker ended during the bursts: a job could have left the count"
        httpx.post(f"{server.url}/v1/videos/{blocker}/cancel", headers=auth("team-b"), timeout=30)
    finally:
        server.stop()


def test_a_burst_over_two_celery_api_processes_gets_exactly_the_quota(tmp_path):
    (tmp_path / "redis").mkdir()
    redis = RedisServer(tmp_path / "redis").start()
    # No worker: every job stays queued, and counted. The API accepts jobs for the model anyway.
    env = {"VIDSERVE_REDIS_URL": redis.url, "VIDSERVE_KEYS_FILE": keys_file(tmp_path),
           "VIDSERVE_MAX_QUEUED": str(QUEUE_LIMIT), "VIDSERVE_QUEUE_WITHOUT_WORKERS": "1", "VIDSERVE_CHAT_MODEL": ""}
    servers = []
    try:
        servers = [Server(tmp_path / "data", env=env, extra=["--queue", "celery"]).start() for _ in range(2)]
        check_bursts([server.url for server in servers])
    finally:
        for server in servers:
            server.stop()
        redis.stop()


# --- the store's side of it: the limits, and what they do not count ---------------------------


PARAMS = JobParams(width=64, height=64, num_frames=17, fps=16, steps=1, guidance=5.0, seed=7, chunk_frames=(17,),
                   seconds="1")


def new_job(owner: str | None = "a", **fields) -> Job:
    return Job(model="wan-tiny", prompt="a cat", params=PARAMS, owner=owner, **fields)


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SQLiteJobStore(tmp_path / "jobs.db")
    else:
        s = RedisJobStore(request.getfixturevalue("redis_url"), prefix=f"quota-{uuid.uuid4().hex}")
    yield s
    s.close()


def test_a_key_counts_its_running_jobs_and_the_queue_counts_only_waiting_ones(store):
    limits = AdmissionLimits(max_queued=2, max_active=2)
    running, _ = store.create(new_job(), limits)
    store.update(running.id, start("w", 30))
    store.create(new_job(), limits)
    with pytest.raises(QuotaExceeded) as refused:  # one running and one queued: a's two
        store.create(new_job(), limits)
    assert (refused.value.limit, refused.value.count, refused.value.allowed) == ("max_active_jobs", 2, 2)
    store.create(new_job(owner="b"), limits)  # another key: the queue holds one of a's, one of b's
    with pytest.raises(QuotaExceeded) as refused:
        store.create(new_job(owner="c"), limits)
    assert (refused.value.limit, refused.value.count, refused.value.allowed) == ("max_queued", 2, 2)
    store.create(new_job(owner="c"))  # without limits: an operator's job, say
    assert store.count_by_status()[JobStatus.queued] == 3


def test_a_retry_of_an_accepted_request_at_the_limit_returns_its_job(store):
    limits = AdmissionLimits(max_queued=100, max_active=1)
    first, created = store.create(new_job(idempotency_key="a:order-1"), limits)
    again, created_again = store.create(new_job(idempotency_key="a:order-1"), limits)
    assert created and not created_again and again.id == first.id
    with pytest.raises(QuotaExceeded):
        store.create(new_job(idempotency_key="a:order-2"), limits)
    _, created = store.create(new_job(idempotency_key="a:order-2"))  # the refused request took no key
    assert created


def test_a_refused_request_leaves_no_files(tmp_path):
    """The first frame is stored before the job (a worker may take it at once): when the store
    then refuses the job, the frame goes too."""
    image = io.BytesIO()
    Image.new("RGB", (64, 64), "red").save(image, format="PNG")
    form = {**{name: str(value) for name, value in BODY.items()}, "model": "wan-tiny-i2v"}
    with app_client(tmp_path, idle_services(tmp_path, keys_file=keys_file(tmp_path))) as (client, services):
        for _ in range(KEY_LIMIT):
            assert client.post("/v1/videos", json=BODY, headers=auth("team-a")).status_code == 200
        refused = client.post("/v1/videos", data=form, files={"input_reference": ("f.png", image.getvalue())},
                              headers=auth("team-a"))
        assert refused.status_code == 429, refused.text
        assert [path for path in (tmp_path / "files").rglob("*") if path.is_file()] == []
        accepted = client.post("/v1/videos", data=form, files={"input_reference": ("f.png", image.getvalue())},
                               headers=auth("team-b"))
        assert accepted.status_code == 200, accepted.text
        assert services.storage.exists(services.store.get(accepted.json()["id"]).input_image_key)
