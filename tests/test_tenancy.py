"""One server shared by several API keys: each sees only its own videos (an admin sees
all), Idempotency-Keys are per key, and quotas (active jobs, requests per minute) hold
per key, on both stores, and across API processes sharing one Redis."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest
from apps import app_client, idle_services
from servers import Server

from vidserve.api.services import Services
from vidserve.errors import VidserveError
from vidserve.jobs import JobStatus, complete
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.keys import KeyRing, key_digest
from vidserve.media import encode_mp4

KEYS = {"team-a": "key-a-0123456789", "team-b": "key-b-0123456789", "ops": "key-ops-0123456789"}
BODY = {"model": "wan-tiny", "prompt": "a red fox", "seconds": "1", "size": "64x64", "num_inference_steps": 1}


def keys_file(tmp_path, **quotas) -> str:
    lines = []
    for name, key in KEYS.items():
        lines += ["[[keys]]", f'name = "{name}"', f'sha256 = "{key_digest(key)}"',
                  f'role = "{"admin" if name == "ops" else "user"}"']
        lines += [f"{quota} = {value}" for quota, value in quotas.get(name, {}).items()]
    path = tmp_path / "keys.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def tenant_services(kind, request, tmp_path, **quotas) -> Services:
    """Idle services on a SQLite or Redis store whose keys file holds KEYS, with `quotas` by key name."""
    store = None  # idle_services' SQLite
    if kind == "redis":
        store = RedisJobStore(request.getfixturevalue("redis_url"), prefix=f"tenancy-{uuid.uuid4().hex}")
    services = idle_services(tmp_path, store=store, keys_file=keys_file(tmp_path, **quotas))
    services.metrics.watch(services.store)
    return services


@pytest.fixture(params=["sqlite", "redis"])
def api(request, tmp_path):
    with app_client(tmp_path, tenant_services(request.param, request, tmp_path)) as (client, services):
        yield client, services


def as_key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def completed_video(client, services, tmp_path, key: str) -> str:
    video_id = client.post("/v1/videos", json=BODY, headers=as_key(key)).json()["id"]
    frames = np.full((17, 64, 64, 3), 80, np.uint8)
    outputs = {"video": services.storage.put_file(f"{video_id}/video.mp4", encode_mp4(frames, tmp_path / "v.mp4", fps=16)),
               "thumbnail": services.storage.put_bytes(f"{video_id}/thumbnail.webp", b"webp")}
    services.store.update(video_id, lambda job: setattr(job, "status", JobStatus.in_progress) or
                          setattr(job, "worker_id", "w"))
    services.store.update(video_id, complete("w", outputs, {}))
    return video_id


def test_another_keys_video_is_absent_on_every_route(api, tmp_path):
    client, services = api
    video_id = completed_video(client, services, tmp_path, "team-a")
    b = as_key("team-b")
    routes = [("get", f"/v1/videos/{video_id}", None), ("get", f"/v1/videos/{video_id}/content", None),
              ("get", f"/v1/videos/{video_id}/events", None), ("post", f"/v1/videos/{video_id}/cancel", None),
              ("post", f"/v1/videos/{video_id}/remix", {"prompt": "a blue fox"}),
              ("post", "/v1/videos/extensions", {"prompt": "more", "video": {"id": video_id}, "seconds": "1"}),
              ("delete", f"/v1/videos/{video_id}", None)]
    for method, path, body in routes:
        response = client.request(method, path, json=body, headers=b)
        assert response.status_code == 404, (method, path, response.text)
        assert response.json()["error"]["code"] == "not_found", (method, path)
    # The same routes work for the owner (delete last), so the 404s above were about ownership.
    a = as_key("team-a")
    for method, path, body in routes:
        expected = 409 if path.endswith("/cancel") else 200  # a completed video cannot be cancelled
        assert client.request(method, path, json=body, headers=a).status_code == expected, (method, path)


def test_lists_show_own_jobs_and_an_admin_sees_all(api):
    client, _ = api
    a_ids = [client.post("/v1/videos", json=BODY, headers=as_key("team-a")).json()["id"] for _ in range(3)]
    b_ids = [client.post("/v1/videos", json=BODY, headers=as_key("team-b")).json()["id"] for _ in range(2)]

    def listed(key, **params):
        return [v["id"] for v in client.get("/v1/videos", params=params, headers=as_key(key)).json()["data"]]

    assert listed("team-a") == a_ids[::-1]
    assert listed("team-b") == b_ids[::-1]
    assert listed("team-a", limit=2, after=a_ids[2]) == a_ids[1::-1]  # paging stays within the key's jobs
    response = client.get("/v1/videos", params={"after": a_ids[0]}, headers=as_key("team-b"))
    assert response.status_code == 400  # another key's id is no cursor
    assert listed("ops") == (a_ids + b_ids)[::-1]
    assert client.get(f"/v1/videos/{a_ids[0]}", headers=as_key("ops")).status_code == 200
    assert client.get(f"/v1/videos/{b_ids[0]}", headers=as_key("ops")).status_code == 200


def test_an_idempotency_key_belongs_to_the_api_key_that_sent_it(api):
    client, services = api
    retry = {"Idempotency-Key": "order-42"}
    first = client.post("/v1/videos", json=BODY, headers={**as_key("team-a"), **retry}).json()
    again = client.post("/v1/videos", json=BODY, headers={**as_key("team-a"), **retry}).json()
    other = client.post("/v1/videos", json=BODY, headers={**as_key("team-b"), **retry}).json()
    assert again["id"] == first["id"]
    assert other["id"] != first["id"]
    assert services.store.get(other["id"]).owner == "team-b"
    assert services.store.get(first["id"]).owner == "team-a"


@pytest.mark.parametrize("store", ["sqlite", "redis"])
def test_a_key_at_its_active_job_limit_gets_429_while_another_submits(request, tmp_path, store):
    services = tenant_services(store, request, tmp_path, **{"team-a": {"max_active_jobs": 2}})
    with app_client(tmp_path, services) as (client, _):
        for _ in range(2):
            assert client.post("/v1/videos", json=BODY, headers=as_key("team-a")).status_code == 200
        refused = client.post("/v1/videos", json=BODY, headers=as_key("team-a"))
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
        error = refused.json()["error"]
        assert (error["code"], error["param"], error["type"]) == ("quota_exceeded", "max_active_jobs",
                                                                  "rate_limit_error")
        assert "team-a" in error["message"]
        assert client.post("/v1/videos", json=BODY, headers=as_key("team-b")).status_code == 200
        metrics = client.get("/metrics", headers=as_key("ops")).text
        assert 'vidserve_key_rejected_total{key="team-a",limit="max_active_jobs"} 1.0' in metrics
        assert 'vidserve_key_jobs{key="team-a",status="queued"} 2.0' in metrics
        assert 'vidserve_key_jobs_accepted_total{key="team-b"} 1.0' in metrics


def test_a_keys_own_maxima_refuse_bigger_requests(tmp_path, request):
    services = tenant_services("sqlite", request, tmp_path, **{"team-a": {"max_steps": 4, "max_seconds": 2}})
    with app_client(tmp_path, services) as (client, _):
        response = client.post("/v1/videos", json={**BODY, "num_inference_steps": 8}, headers=as_key("team-a"))
        assert response.status_code == 400 and response.json()["error"]["param"] == "num_inference_steps"
        response = client.post("/v1/videos", json={**BODY, "seconds": "4"}, headers=as_key("team-a"))
        assert response.status_code == 400 and response.json()["error"]["param"] == "seconds"
        assert client.post("/v1/videos", json={**BODY, "num_inference_steps": 8},
                           headers=as_key("team-b")).status_code == 200


def test_keys_are_hashed_and_odd_bytes_never_raise(tmp_path):
    ring = KeyRing.from_settings(frozenset({"plain-key-123"}), keys_file(tmp_path))
    assert ring.find(b"key-a-0123456789").name == "team-a"
    assert ring.find("plain-key-123".encode()).name.startswith("key-")
    for odd in (b"k\xe9", b"", b"\x00" * 300, "ключ".encode()):
        assert ring.find(odd) is None
    assert all(KEYS[name] not in key.sha256 for key in ring.keys for name in KEYS)


def test_a_bad_keys_file_is_one_line_naming_the_entry_and_field(tmp_path):
    path = tmp_path / "keys.toml"
    path.write_text(open(keys_file(tmp_path)).read().replace('role = "user"', 'role = "boss"', 1))
    with pytest.raises(VidserveError, match=r"keys\[0\]\.role: ") as caught:
        KeyRing.from_settings(frozenset(), str(path))
    assert "\n" not in str(caught.value) and str(path) in str(caught.value)


def _get(url: str, key: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        assert exc.code != 429 or int(exc.headers["Retry-After"]) >= 1
        return exc.code


def test_a_rate_limit_over_two_api_processes_on_one_redis_holds(tmp_path, redis_url):
    per_minute = 60  # a burst of 60, then one request a second
    env = {"VIDSERVE_REDIS_URL": redis_url.rsplit("/", 1)[0] + "/14", "VIDSERVE_CHAT_MODEL": "",
           "VIDSERVE_KEYS_FILE": keys_file(tmp_path, **{"team-a": {"requests_per_minute": per_minute}})}
    servers = [Server(tmp_path / f"data-{i}", env=env, extra=["--queue", "celery"]).start() for i in range(2)]
    try:
        statuses, started = [], time.monotonic()
        while time.monotonic() - started < 8:
            for server in servers:
                statuses.append(_get(f"{server.url}/v1/videos?limit=1", KEYS["team-a"]))
        elapsed = time.monotonic() - started
        assert set(statuses) == {200, 429}
        allowed = per_minute + elapsed * per_minute / 60
        accepted = statuses.count(200)
        assert abs(accepted - allowed) <= 0.1 * allowed, (accepted, allowed)
        assert _get(f"{servers[0].url}/v1/videos?limit=1", KEYS["team-b"]) == 200  # its own bucket
    finally:
        for server in servers:
            server.stop()
