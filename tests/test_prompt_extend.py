"""The video path using the LLM path: `prompt_extend` rewrites the prompt first (seeing
the first frame for image-to-video), `caption_chain` captions the frame each
continuation chunk starts from; embedded servers call their engine, workers call HTTP."""

from __future__ import annotations

import io

import pytest
from apps import app_client
from PIL import Image
from polling import eventually
from servers import Server

from vidserve.workers.prompt_writer import EngineWriter, HTTPWriter


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with app_client(tmp_path_factory.mktemp("extend"), chat_model="vlm-tiny") as (client, services):
        yield client, services


def finished(client, video_id: str, timeout: float = 120) -> dict:
    def settled() -> dict:
        video = client.get(f"/v1/videos/{video_id}").json()
        assert video["status"] not in ("queued", "in_progress"), video
        return video

    video = eventually(settled, timeout=timeout, what=f"{video_id} to finish")
    assert video["status"] == "completed", video
    return video


def test_prompt_extend_records_the_original_and_the_extended_prompt(api):
    client, services = api
    body = {"model": "wan-tiny", "prompt": "a red fox in snow", "seconds": "2", "seed": 4, "prompt_extend": True}
    video = finished(client, client.post("/v1/videos", json=body).json()["id"])
    expected = EngineWriter(services.chat).extend("a red fox in snow", None, seed=4)
    assert video["prompt"] == "a red fox in snow" and video["prompt_extend"] is True
    assert video["extended_prompt"] == expected and expected != "a red fox in snow"
    assert video["chunks"][0]["prompt"] == expected  # the clip was generated from the rewrite


def test_without_prompt_extend_nothing_is_rewritten(api):
    client, services = api
    steps = services.chat.engine.decode_steps
    video = finished(client, client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "a cat",
                                                             "seconds": "2"}).json()["id"])
    assert video["extended_prompt"] is None and video["chunks"][0]["prompt"] == "a cat"
    assert services.chat.engine.decode_steps == steps


def test_image_to_video_prompt_extension_sees_the_image(api):
    client, services = api
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (20, 200, 40)).save(buffer, format="PNG")
    encoded_before = services.chat.engine.model.vision_calls
    response = client.post("/v1/videos", data={"model": "wan-tiny-i2v", "prompt": "it starts to rain",
                                               "seconds": "2", "prompt_extend": "true"},
                           files={"input_reference": ("first.png", buffer.getvalue(), "image/png")})
    video = finished(client, response.json()["id"])
    assert video["extended_prompt"] and services.chat.engine.model.vision_calls == encoded_before + 1


def test_caption_chain_captions_each_continuation_chunk(api):
    client, services = api
    body = {"model": "wan-tiny", "prompt": "a boat at sea", "seconds": "5", "seed": 9, "caption_chain": True}
    video = finished(client, client.post("/v1/videos", json=body).json()["id"])
    prompts = [c["prompt"] for c in sorted(video["chunks"], key=lambda c: c["index"])]
    assert len(prompts) == 3 and prompts[0] == "a boat at sea"
    for later in prompts[1:]:
        assert later.startswith("a boat at sea ") and len(later) > len("a boat at sea ")
    assert prompts[1] != prompts[2]  # each caption is of its own chunk's opening frame


def test_caption_chain_on_a_single_chunk_is_refused(api):
    client, _ = api
    response = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "x", "seconds": "1",
                                               "caption_chain": True})
    assert response.status_code == 400 and response.json()["error"]["param"] == "caption_chain"


def test_without_a_chat_model_the_options_are_refused(tmp_path):
    with app_client(tmp_path) as (client, _):
        response = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "x", "prompt_extend": True})
        assert response.status_code == 400 and response.json()["error"]["param"] == "prompt_extend"
        assert client.get("/v1/videos").json()["data"] == []


def test_workers_reach_the_llm_over_http(tmp_path):
    """A Celery worker's HTTPWriter asks the API server's engine: same answer as in-process."""
    server = Server(tmp_path / "data").start()
    try:
        remote = HTTPWriter(f"{server.url}/v1")
        frame = Image.new("RGB", (64, 64), (200, 30, 30))
        assert remote.vision
        extended = remote.extend("a red fox", frame, seed=3)
        assert extended and extended == remote.extend("a red fox", frame, seed=3)
        assert remote.caption(frame, seed=1)
    finally:
        server.stop()
    with pytest.raises(RuntimeError, match="unreachable"):
        remote.caption(frame, seed=1)
