"""What a hostile or careless client gets back, beyond the 4xx shape: an empty Idempotency-Key
refused, forms that say one thing once, a 416 in the JSON error shape, echoed input cut short,
and nothing about the server's disks, hosts or keys told to whoever asks."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator
from urllib.parse import urlencode

import httpx
import pytest
from apps import app_client, idle_services
from fastapi.testclient import TestClient
from servers import free_port
from test_expiry import completed_video
from test_hostile_input import assert_openai_error
from test_tenancy import KEYS, keys_file

from vidserve.errors import ECHO_CHARS

VIDEO = {"model": "wan-tiny", "prompt": "a fox", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.fixture
def client(tmp_path) -> Iterator[TestClient]:
    with app_client(tmp_path, idle_services(tmp_path)) as (client, _):
        yield client


def as_key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def nothing_queued(client: TestClient) -> None:
    assert client.get("/v1/videos").json()["data"] == []


# --- Idempotency-Key -----------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_idempotency_key_is_refused(client, value):
    for body in (VIDEO, {**VIDEO, "prompt": "another"}):
        response = client.post("/v1/videos", json=body, headers={"Idempotency-Key": value})
        assert_openai_error(response, 400, param="Idempotency-Key", code="invalid_idempotency_key")
    nothing_queued(client)


# --- forms ---------------------------------------------------------------------------------


def post_form(client: TestClient, pairs: list[tuple[str, str]]):
    return client.post("/v1/videos", content=urlencode(pairs), headers=FORM)


FIELDS = [(name, str(value)) for name, value in VIDEO.items() if name != "prompt"]


@pytest.mark.parametrize("pairs", [
    [("prompt", "x"), ("prompt", "y")],
    [("prompt", "x"), ("outputs[][format]", "gif"), ("outputs", "[]")],
    [("prompt", "x"), ("outputs", "[]"), ("outputs[][format]", "gif")],
], ids=["plain-twice", "bracketed-then-plain", "plain-then-bracketed"])
def test_a_form_field_given_twice_is_refused_whichever_comes_first(client, pairs):
    error = assert_openai_error(post_form(client, FIELDS + pairs), 400, param=pairs[-1][0].partition("[")[0])
    assert "given" in error["message"]
    nothing_queued(client)


def test_indexed_form_lists_read_like_the_sdks_bracketed_ones(client):
    indexed = post_form(client, FIELDS + [("prompt", "indexed"), ("outputs[0][format]", "webm"),
                                          ("outputs[1][format]", "gif"), ("outputs[0][fps]", "24")])
    sdk = post_form(client, FIELDS + [("prompt", "sdk"), ("outputs[][format]", "webm"), ("outputs[][fps]", "24"),
                                      ("outputs[][format]", "gif")])
    assert indexed.status_code == sdk.status_code == 200, (indexed.text, sdk.text)
    assert indexed.json()["outputs"] == sdk.json()["outputs"]
    assert [(o["format"], o["fps"]) for o in indexed.json()["outputs"]] == [("webm", 24), ("gif", 16)]


@pytest.mark.parametrize("pairs", [
    [("outputs[1][format]", "gif")],
    [("outputs[0][format]", "webm"), ("outputs[2][format]", "gif")],
    [("outputs[0][format]", "webm"), ("outputs[0][format]", "gif")],
    [("outputs[0][format]", "webm"), ("outputs[x][format]", "gif")],
    [("outputs[" + "9" * 5000 + "][format]", "gif")],
], ids=["from-1", "gap", "twice", "name-for-index", "huge-index"])
def test_indexed_form_lists_count_from_zero_without_gaps(client, pairs):
    assert_openai_error(post_form(client, FIELDS + [("prompt", "x")] + pairs), 400, param="outputs")
    nothing_queued(client)


# --- 416 and echoed input ------------------------------------------------------------------


def test_an_unsatisfiable_range_is_a_json_error_with_its_content_range(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path)) as (client, services):
        video_id = completed_video(client, services, tmp_path, output_ttl=0)
        size = services.storage.size(f"{video_id}/video.mp4")
        response = client.get(f"/v1/videos/{video_id}/content", headers={"Range": f"bytes={size}-"})
        assert_openai_error(response, 416, param="Range", code="range_not_satisfiable")
        assert response.headers["content-range"] == f"bytes */{size}"


def test_error_messages_quote_only_a_prefix_of_what_was_sent(client):
    huge = "v" * 20_000
    for response in (client.get(f"/v1/videos/{huge}"), client.get("/v1/videos", params={"after": huge}),
                     client.post("/v1/videos", json={**VIDEO, "model": huge}),
                     client.post("/v1/videos", json={**VIDEO, huge: 1})):
        assert 400 <= response.status_code < 500 and huge[:ECHO_CHARS + 1] not in response.text, response.text[:300]
        assert len(response.content) < 2000


# --- what the server tells about itself ----------------------------------------------------


def test_readiness_detail_is_for_admins_and_names_no_path(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path, keys_file=keys_file(tmp_path))) as (client, _):
        assert client.get("/readyz").json() == {"status": "ready"}
        assert client.get("/readyz", headers=as_key("team-a")).json() == {"status": "ready"}
        assert client.get("/readyz", headers=as_key("ops")).json() == {"status": "ready", "queue": "embedded",
                                                                       "storage": "local"}


def test_metrics_need_an_admin_key_or_a_listener_of_their_own(tmp_path):
    port = free_port()
    services = idle_services(tmp_path, keys_file=keys_file(tmp_path), metrics_address=f"127.0.0.1:{port}")
    with app_client(tmp_path, services) as (client, _):
        client.post("/v1/videos", json=VIDEO, headers=as_key("team-a"))
        assert_openai_error(client.get("/metrics"), 401, code="invalid_api_key")
        assert_openai_error(client.get("/metrics", headers=as_key("team-a")), 403, code="admin_required")
        assert "team-a" in client.get("/metrics", headers=as_key("ops")).text
        assert "team-a" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    with pytest.raises(httpx.ConnectError):  # the listener stops with the app
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)


def test_models_name_no_folder_on_the_server(client):
    models = client.get("/v1/models").json()["data"]
    shapes = next(m for m in models if m["id"] == "wan-shapes")
    assert shapes["source"] == "local"
    assert not any(str(Path(__file__).resolve().parents[1]) in str(m) for m in models)
