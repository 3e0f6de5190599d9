"""A key that floods or hoards costs the server little: a request over its key's rate is
refused from its headers, before anything reads its body, and a key holds at most
max_streams event streams open, each counted until its client leaves or it ends."""

from __future__ import annotations


import httpx
import pytest
from apps import app_client, served_app
from polling import eventually
from test_hostile_input import assert_openai_error
from test_tenancy import BODY, as_key, tenant_services



def unread_body(read: list[bool]):
    """A request body that notes when anything reads it; it is no valid JSON either."""
    def chunks():
        read.append(True)
        yield b'{"model": "wan-tiny", "prompt": '

    return chunks()


def test_a_request_over_its_keys_rate_is_refused_without_reading_its_body(tmp_path, request):
    services = tenant_services("sqlite", request, tmp_path, **{"team-a": {"requests_per_minute": 2}})
    json_type = {"Content-Type": "application/json"}
    with app_client(tmp_path, services) as (client, _):
        for _ in range(2):  # the burst: each request counted once, however many layers look at the key
            assert client.get("/v1/videos", headers=as_key("team-a")).status_code == 200
        # The chat route parses its body before its dependencies run; the video route reads its own.
        for path in ("/v1/chat/completions", "/v1/videos"):
            read: list[bool] = []
            response = client.post(path, content=unread_body(read), headers={**as_key("team-a"), **json_type})
            error = assert_openai_error(response, 429, "requests_per_minute", "rate_limit_exceeded")
            assert error["type"] == "rate_limit_error" and "'team-a'" in error["message"], error
            assert "limit of 2 requests per minute" in error["message"], error
            assert int(response.headers["Retry-After"]) >= 1
            assert read == [], f"{path}: the refused request's body was read"

        # The same body from a key within its rate is read (and refused as the bad JSON it is),
        # and a request without a valid key still gets the 401.
        read = []
        response = client.post("/v1/videos", content=unread_body(read), headers={**as_key("team-b"), **json_type})
        assert response.status_code == 400 and read == [True], response.text
        for headers in ({}, {"Authorization": "Bearer not-a-key"}):
            response = client.post("/v1/videos", json=BODY, headers=headers)
            assert_openai_error(response, 401, code="invalid_api_key")


@pytest.fixture
def served(tmp_path, request):
    """The app on a real loopback socket: streams stay open there while the test does other
    things (the TestClient runs each request to its end)."""
    services = tenant_services("sqlite", request, tmp_path, **{"team-a": {"max_streams": 2}})
    with served_app(services) as served:
        yield served


def open_events(http: httpx.Client, video_id: str) -> httpx.Response:
    """An event stream, its headers read; a 200 is left open, its first event read through
    `response.lines`, which the rest is read from (dropping a half-read line iterator closes it)."""
    response = http.send(http.build_request("GET", f"/v1/videos/{video_id}/events"), stream=True)
    if response.status_code == 200:
        response.lines = response.iter_lines()
        assert next(response.lines) == "event: video.queued"
    return response


def test_a_keys_open_streams_are_capped_and_counted_down_as_they_end(served):
    url, app = served
    with httpx.Client(base_url=url, headers=as_key("team-a"), timeout=30) as http, \
            httpx.Client(base_url=url, headers=as_key("team-b"), timeout=30) as other:
        video_id = http.post("/v1/videos", json=BODY).json()["id"]  # stays queued: nothing runs jobs here
        streams = [open_events(http, video_id) for _ in range(2)]
        assert [s.status_code for s in streams] == [200, 200]

        refused = open_events(http, video_id)
        assert refused.status_code == 429, "a third stream was let in"
        refused.read()
        error = assert_openai_error(refused, 429, "max_streams", "too_many_streams")
        assert error["type"] == "rate_limit_error" and "'team-a'" in error["message"], error
        assert "max_streams 2" in error["message"], error
        assert int(refused.headers["Retry-After"]) >= 1

        # The cap is the key's own: another key streams its own video meanwhile.
        b_stream = open_events(other, other.post("/v1/videos", json=BODY).json()["id"])
        assert b_stream.status_code == 200
        b_stream.close()

        streams.pop().close()  # a client that leaves frees its place

        def reopened() -> httpx.Response:
            response = open_events(http, video_id)
            if response.status_code != 200:
                response.close()
                raise AssertionError(f"still refused: {response.status_code}")
            return response

        streams.append(eventually(reopened, timeout=30, what="a stream to be accepted once one closed"))
        assert app.state.streams.count("team-a") == 2

        # Streams the server ends count down too: cancelling the video ends both.
        assert http.post(f"/v1/videos/{video_id}/cancel").json()["status"] == "cancelled"
        for stream in streams:
            assert "event: video.cancelled" in list(stream.lines)
            stream.close()
        eventually(lambda: app.state.streams.count("team-a") == 0 and app.state.streams.count("team-b") == 0,
                   timeout=30, what="every stream to be counted as closed")
