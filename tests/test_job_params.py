"""Every typed job parameter travels the whole way: request body (JSON and multipart) → job
record (SQLite and Redis) → the worker's GenerationRequest → the video object → a remix.

The tables below name each JobParams field once. A field added to JobParams without an
entry here fails `test_every_field_has_a_walk`; one dropped or renamed anywhere on the
way fails the walk."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
from apps import app_client, idle_services

from vidserve import cli
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.loras import LoraRequest
from vidserve.media import encode_mp4
from vidserve.params import JobParams
from vidserve.media.renditions import Rendition
from vidserve.workers.runner import JobRunner

# What a client sends: every field away from its default, on wan-tiny (33-frame chunks), so
# 65 frames is a two-chunk chain and per-chunk prompts and caption_chain apply.
BODY = {"model": "wan-tiny", "prompt": "a red fox", "size": "96x80", "num_frames": 65, "fps": 12,
        "num_inference_steps": 3, "guidance_scale": 2.5, "seed": 1234, "negative_prompt": "blurry",
        "prompts": ["the fox sits", "the fox runs"], "drift_correction": "none",
        "attention": {"mode": "topk", "density": 0.25, "tile": [2, 4, 4]},
        "cache": {"kind": "first_block", "threshold": 0.1}, "prompt_extend": True, "caption_chain": True,
        "loras": [{"name": "tiny-style", "scale": 0.5}], "preset": "fast", "priority": "high",
        "outputs": [{"format": "webm", "fps": 24, "fps_mode": "blend", "quality": 40, "size": "48x40", "name": "web"}]}
# Multipart carries every field as a string, structured ones as JSON.
FORM = {k: json.dumps(v) if isinstance(v, (dict, list)) else str(v).lower() if isinstance(v, bool) else str(v)
        for k, v in BODY.items()}

WEB = Rendition(name="web", format="webm", codec="vp9", fps=24, fps_mode="blend", quality=40, width=48, height=40)
WEB_SHOWN = {"name": "web", "format": "webm", "media_type": "video/webm", "codec": "vp9", "fps": 24,
             "fps_mode": "blend", "quality": 40, "size": "48x40", "bytes": None, "filename": "web.webm"}

# JobParams field -> (the value the job keeps, the video object's key, the value it shows there).
# None as the key: the field is the worker's alone (the video object shows its effect elsewhere).
WALK = {
    "width": (96, "size", "96x80"),
    "height": (80, "size", "96x80"),
    "num_frames": (65, "num_frames", 65),
    "fps": (12, "fps", 12),
    "steps": (3, "num_inference_steps", 3),
    "guidance": (2.5, "guidance_scale", 2.5),
    "seed": (1234, "seed", 1234),
    "negative_prompt": ("blurry", "negative_prompt", "blurry"),
    "chunk_frames": ((33, 33), None, None),
    "prompts": (("the fox sits", "the fox runs"), "prompts", ["the fox sits", "the fox runs"]),
    "drift_correction": ("none", "drift_correction", "none"),
    # Sent as "topk", the sparse mode's other name: every path reads it as "sparse".
    "attention": ({"mode": "sparse", "density": 0.25, "tile": (2, 4, 4)}, "attention",
                  {"mode": "sparse", "density": 0.25, "tile": [2, 4, 4]}),
    "cache": ({"kind": "first_block", "threshold": 0.1}, "cache", {"kind": "first_block", "threshold": 0.1}),
    "prompt_extend": (True, "prompt_extend", True),
    "caption_chain": (True, "caption_chain", True),
    "loras": ((LoraRequest(name="tiny-style", scale=0.5),), "loras", [{"name": "tiny-style", "scale": 0.5,
                                                                         "target": "both"}]),
    "preset": ("fast", "preset", "fast"),
    "priority": ("high", "priority", "high"),  # remixes keep it: the remixes below name none
    "flow_shift": (2.0, None, None),  # the preset's; the fields the body gives (steps, guidance) win over it
    "seconds": ("5.33333", "seconds", "5.33333"),  # (65 - 1) / 12
    "source_frames": (0, None, None),  # walked by the extension test below
    "outputs": ((WEB,), "outputs", [{**WEB_SHOWN, "frames": 129}]),  # (65 - 1) * 24 // 12 + 1
}


def test_every_field_has_a_walk():
    assert set(WALK) == set(JobParams.model_fields)


@pytest.fixture(params=["sqlite", "redis"])
def api(request, tmp_path):
    # A chat endpoint is configured (never called here), so prompt_extend and caption_chain are accepted.
    adapter = tmp_path / "tiny-style.safetensors"  # registered, never loaded: no job runs here
    adapter.write_bytes(b"")
    store = None  # idle_services' SQLite
    if request.param == "redis":
        store = RedisJobStore(request.getfixturevalue("redis_url"), prefix=f"walk-{uuid.uuid4().hex}")
    services = idle_services(tmp_path, store=store, chat_url="http://127.0.0.1:9/v1", loras=f"tiny-style={adapter}")
    with app_client(tmp_path, services) as (client, _):
        yield client, services, JobRunner(services.settings, services.store, services.storage)


def _stored_value(value):
    return value.model_dump(exclude_unset=False) if hasattr(value, "model_dump") else value


def assert_walked(job, video, runner, walk=WALK, source=None):
    request = runner.request_for(job, source)
    for name, (kept, video_key, shown) in walk.items():
        value = getattr(job.params, name)
        if isinstance(kept, dict):  # options: the fields sent, over the server's defaults
            assert {k: _stored_value(value)[k] for k in kept} == kept, name
        else:
            assert value == kept, name
        if name not in ("seconds", "source_frames", "outputs"):
            carried = getattr(request, name)
            assert (tuple(carried) if isinstance(carried, list) else carried) == value, f"request.{name}"
        if video_key is not None:
            got = video[video_key]
            assert ({k: got[k] for k in shown} if isinstance(shown, dict) else got) == shown, f"video.{video_key}"
    assert request.continuing == (job.params.source_frames > 0)
    assert (request.model, request.prompt) == (job.model, job.prompt)


@pytest.mark.parametrize("encoding", ["json", "multipart"])
def test_fields_walk_create_record_worker_video_remix(api, encoding):
    client, services, runner = api
    response = (client.post("/v1/videos", json=BODY) if encoding == "json"
                else client.post("/v1/videos", data=FORM))
    assert response.status_code == 200, response.text
    video = response.json()
    job = services.store.get(video["id"])
    assert_walked(job, video, runner)
    assert client.get(f"/v1/videos/{job.id}").json() == video

    remixed = client.post(f"/v1/videos/{job.id}/remix", json={"prompt": "a blue fox"})
    assert remixed.status_code == 200, remixed.text
    remix = services.store.get(remixed.json()["id"])
    assert remix.params == job.params and (remix.prompt, remix.remixed_from_video_id) == ("a blue fox", job.id)
    assert services.queue.submitted == [job.id, remix.id]


def test_extension_walks_source_frames_and_remixes_from_the_same_source(api, tmp_path):
    client, services, runner = api
    frames = np.full((9, 80, 96, 3), 90, np.uint8)
    source = encode_mp4(frames, tmp_path / "source.mp4", fps=12).read_bytes()
    form = {k: v for k, v in FORM.items() if k not in ("size", "num_frames", "fps")}  # the source's
    response = client.post("/v1/videos/extensions", data={**form, "seconds": "5"},
                           files={"video": ("source.mp4", source, "video/mp4")})
    assert response.status_code == 200, response.text
    video = response.json()
    job = services.store.get(video["id"])
    # 5 s at 12 fps adds 60 frames: two 33-frame chunks that each open on the frame they continue.
    walk = {**WALK, "num_frames": (60, "num_frames", 69), "chunk_frames": ((33, 29), None, None),
            "seconds": ("5.66667", "seconds", "5.66667"),  # (9 + 60 - 1) / 12
            "source_frames": (9, None, None),
            "outputs": ((WEB,), "outputs", [{**WEB_SHOWN, "frames": 137}])}  # renditions of all 69 frames
    assert_walked(job, video, runner, walk, source=frames)

    # A remix of an extension continues the same source (it never asks for a 4k+1 frame count).
    remixed = client.post(f"/v1/videos/{job.id}/remix", json={"prompt": "a grey fox"})
    assert remixed.status_code == 200, remixed.text
    remix = services.store.get(remixed.json()["id"])
    assert remix.params == job.params and remix.source_video_key != job.source_video_key
    assert services.storage.read_bytes(remix.source_video_key) == source


def test_one_prompt_limit_for_cli_and_api(api, capsys):
    client, _, _ = api
    long = "x" * 10_001
    response = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": long})
    assert response.status_code == 400 and response.json()["error"]["param"] == "prompt"
    assert cli.main(["generate", long, "--model", "wan-tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["vidserve: error: prompt is 10001 characters; the limit is 10000"]
    assert client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "x" * 10_000,
                                           "num_inference_steps": 1}).status_code == 200
