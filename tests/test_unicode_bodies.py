"""Text that is not valid Unicode, a lone UTF-16 surrogate sent as the JSON escape "\\ud800",
is a 400 naming the field in every body the API reads (JSON, multipart forms, chat), never a
500; and the keep-alive connection it came on serves the next request. Against a real server
(chat on), each bad request followed by a good one on the same httpx connection."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from polling import eventually
from servers import Server

LONE = "\ud800"  # json.dumps writes it as the escape "\ud800", which json.loads turns back into it
TINY = {"model": "wan-tiny", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}
PNG = Path("examples/first.png").read_bytes()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("unicode") / "data").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def completed(http) -> str:
    """A finished video, to remix and to extend."""
    created = http.post("/v1/videos", json={**TINY, "prompt": "a source"})
    assert created.status_code == 200, created.text
    video_id = created.json()["id"]

    def done() -> bool:
        status = http.get(f"/v1/videos/{video_id}").json()["status"]
        assert status == "completed", status
        return True

    eventually(done, timeout=300, what=f"{video_id} to complete")
    return video_id


def json_post(http, path: str, body: dict) -> httpx.Response:
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


# (what, request, the field named): each request is sent on the one keep-alive connection.
CASES = [
    ("prompt", lambda http, _: json_post(http, "/v1/videos", {**TINY, "prompt": f"a fox {LONE}"}), "prompt"),
    ("negative_prompt", lambda http, _: json_post(http, "/v1/videos", {**TINY, "prompt": "a fox",
                                                                       "negative_prompt": LONE}), "negative_prompt"),
    ("metadata value", lambda http, _: json_post(http, "/v1/videos", {**TINY, "prompt": "a fox",
                                                                      "metadata": {"note": LONE}}), "metadata.note"),
    ("metadata key", lambda http, _: json_post(http, "/v1/videos", {**TINY, "prompt": "a fox",
                                                                    "metadata": {f"k{LONE}": "v"}}), "metadata"),
    ("per-chunk prompt", lambda http, _: json_post(http, "/v1/videos", {**TINY, "prompt": "a fox",
                                                                        "prompts": ["one", LONE]}), "prompts.1"),
    ("multipart metadata", lambda http, _: http.post(
        "/v1/videos", data={"model": "wan-tiny-i2v", "prompt": "it moves", "size": "64x64", "num_frames": "5",
                            "metadata": json.dumps({"note": LONE})},
        files={"input_reference": ("first.png", PNG, "image/png")}), "metadata.note"),
    ("extension prompt", lambda http, video: json_post(http, "/v1/videos/extensions", {
        "prompt": LONE, "seconds": 1, "video": {"id": video}}), "prompt"),
    ("remix prompt", lambda http, video: json_post(http, f"/v1/videos/{video}/remix", {"prompt": LONE}), "prompt"),
    ("chat content", lambda http, _: json_post(http, "/v1/chat/completions", {
        "max_tokens": 2, "messages": [{"role": "user", "content": f"hi {LONE}"}]}), "messages.0.content"),
    ("chat content part", lambda http, _: json_post(http, "/v1/chat/completions", {
        "max_tokens": 2, "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": [{"type": "text", "text": LONE}]}]}),
     "messages.1.content.0.text"),
]


@pytest.mark.parametrize(("what", "send", "param"), CASES, ids=[case[0] for case in CASES])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_the_connection_goes_on(http, completed, what, send, param):
    response = send(http, completed)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_unicode", error
    assert error["param"] == param, error
    assert param in error["message"] and "Unicode" in error["message"], error
    assert response.headers.get("connection") != "close"
    # The same connection (the client's pool holds one, kept alive) serves the next request.
    assert http.get("/v1/models").status_code == 200
    assert json_post(http, "/v1/chat/completions", {"max_tokens": 2, "messages": [
        {"role": "user", "content": "hi \U0001F600"}]}).status_code == 200  # a real pair of surrogates is fine


def test_whole_characters_sent_as_escaped_pairs_still_read(http):
    """An emoji is two surrogates as JSON escapes ("\\ud83d\\ude00"): one character, accepted."""
    body = json.dumps({**TINY, "prompt": "a fox \U0001F600", "metadata": {"mood": "\U0001F600"}})
    assert "\\ud83d\\ude00" in body
    created = http.post("/v1/videos", content=body, headers={"content-type": "application/json"})
    assert created.status_code == 200, created.text
    assert created.json()["prompt"] == "a fox \U0001F600"
