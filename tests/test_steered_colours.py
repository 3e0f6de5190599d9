"""A video whose prompt changes colour mid-way keeps the new colour under the default drift
correction: a storyboard's `prompts` and a realtime session's `prompt.update`, on the trained
`wan-shapes` model in an embedded server, colours read from the decoded MP4's pixels. (How the
reference is chosen, and that drift within one prompt is still corrected, is tests/test_drift.py's.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
from apps import app_client
from polling import eventually

from training.shapes_score import detect
from vidserve.media import read_video_bytes

GREEN = "a green circle moving right on a black background"  # training/shapes_world.py's caption pattern
BLUE = "a blue circle moving left on a black background"
# Two chunks of 17 frames (1 s each at 16 fps), few steps: blue within the second chunk, unlike the
# 4-step adapter, which holds on to the green it opens on.
SHAPES = {"model": "wan-shapes", "seconds": 2, "num_inference_steps": 8, "seed": 0}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The embedded server, jobs run in it."""
    with app_client(tmp_path_factory.mktemp("steered")) as (client, _):
        yield client


def finished(api, video_id: str) -> dict:
    def ended() -> dict:
        video = api.get(f"/v1/videos/{video_id}").json()
        assert video["status"] in ("completed", "failed", "cancelled"), video["status"]
        return video

    video = eventually(ended, timeout=1200, interval=0.5, what=f"{video_id} to end")
    assert video["status"] == "completed", video.get("error")
    return video


def chunk_colours(api, video: dict) -> list[str | None]:
    """The colour of each chunk's shape, as training/shapes_score.py reads it from the video's pixels."""
    frames, _ = read_video_bytes(api.get(f"/v1/videos/{video['id']}/content").content)
    ends = np.cumsum([chunk["frames"] for chunk in video["chunks"]])
    return [detect(chunk)["colour"] for chunk in np.split(frames, ends[:-1])]


def test_a_storyboard_from_green_to_blue_ends_blue(api):
    created = api.post("/v1/videos", json={**SHAPES, "prompt": GREEN, "prompts": [GREEN, BLUE]})
    assert created.status_code == 200, created.text
    video = finished(api, created.json()["id"])
    assert video["drift_correction"] == "color"
    assert [chunk["prompt"] for chunk in video["chunks"]] == [GREEN, BLUE]
    assert chunk_colours(api, video) == ["green", "blue"]


def next_text(ws) -> dict:
    """The session's next text message (the stream's segments, sent as binary ones, skipped)."""
    while "text" not in (message := ws.receive()):
        assert message["type"] == "websocket.send", message
    answer = json.loads(message["text"])
    assert answer["type"] != "error", answer
    return answer


def test_a_realtime_session_steered_from_green_to_blue_ends_blue(api):
    with api.websocket_connect("/v1/realtime/video") as ws:
        ws.send_text(json.dumps({"type": "session.create", **SHAPES, "prompt": GREEN}))
        while (message := next_text(ws))["type"] != "video.progress" or message["progress"] == 0:
            pass
        # A step of chunk 1 is done, so chunk 2 is the first the update can steer.
        ws.send_text(json.dumps({"type": "prompt.update", "prompt": BLUE}))
        while (message := next_text(ws))["type"] != "prompt.updated":
            pass
        assert message["from_chunk"] == 1
        while (message := next_text(ws))["type"] != "video.completed":
            pass
    video = message["video"]
    assert video["drift_correction"] == "color"
    assert [chunk["prompt"] for chunk in video["chunks"]] == [GREEN, BLUE]
    assert chunk_colours(api, video) == ["green", "blue"]
