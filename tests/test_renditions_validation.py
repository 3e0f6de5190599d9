"""A request's `outputs` that cannot be made, or that asks past the server's limits, is a 400
naming the field, on create, extension and remix alike, before any job is queued."""

from __future__ import annotations

import json

import numpy as np
import pytest
from apps import app_client, idle_services

from vidserve.media import encode_mp4

VIDEO = {"model": "wan-tiny", "prompt": "a fox", "size": "96x64", "num_frames": 17}
LIMITS = {"max_outputs": 3, "max_output_side": 640, "max_output_frames": 40}

# outputs -> the param the 400 names. The video is 96x64, 17 frames at wan-tiny's 16 fps.
BAD_OUTPUTS = {
    "prores in webm": ([{"format": "webm", "codec": "prores"}], "outputs.0.codec"),
    "a codec for a gif": ([{"format": "mp4"}, {"format": "gif", "codec": "h264"}], "outputs.1.codec"),
    "an unknown format": ([{"format": "avi"}], "outputs.0.format"),
    "an unknown field": ([{"format": "mp4", "bitrate": "8M"}], "outputs.0.bitrate"),
    "a CRF past h264's": ([{"format": "mp4", "quality": 52}], "outputs.0.quality"),
    "a CRF for prores": ([{"format": "mov", "quality": 20}], "outputs.0.quality"),
    "a quality for lossless frames": ([{"format": "frames", "quality": "high"}], "outputs.0.quality"),
    "an unknown quality": ([{"format": "mp4", "quality": "best"}], "outputs.0.quality"),
    "no frame rate": ([{"format": "mp4", "fps": 0}], "outputs.0.fps"),
    "a cropping size": ([{"format": "mp4", "size": "64x64"}], "outputs.0.size"),
    "an odd size for h264": ([{"format": "mp4", "size": "75x50"}], "outputs.0.size"),
    "a size that is not WxH": ([{"format": "gif", "size": "big"}], "outputs.0.size"),
    "a name taken twice": ([{"format": "mp4"}, {"format": "mp4", "fps": 24}], "outputs.1.name"),
    "a reserved name": ([{"format": "gif", "name": "thumbnail"}], "outputs.0.name"),
    "a name that is no variant": ([{"format": "gif", "name": "../gif"}], "outputs.0.name"),
    "not a list": ({"format": "mp4"}, "outputs"),
    # Past the server's limits (LIMITS):
    "too many": ([{"format": f, "name": f} for f in ("mp4", "webm", "mov", "gif")], "outputs"),
    "too large": ([{"format": "mp4", "size": "960x640"}], "outputs.0.size"),
    "too many frames": ([{"format": "mp4", "fps": 60}], "outputs.0.fps"),  # 17 frames at 16 fps are 61 at 60
}


@pytest.fixture
def api(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path, **LIMITS)) as (client, services):
        yield client, services


def assert_refused(response, param: str) -> None:
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


@pytest.mark.parametrize("case", list(BAD_OUTPUTS))
def test_bad_outputs_are_refused_before_queueing(api, case):
    client, services = api
    outputs, param = BAD_OUTPUTS[case]
    assert_refused(client.post("/v1/videos", json={**VIDEO, "outputs": outputs}), param)
    assert services.queue.submitted == [] and services.store.list()[0] == []


def test_outputs_in_a_form_are_json(api):
    client, services = api
    form = {k: str(v) for k, v in VIDEO.items()}
    assert_refused(client.post("/v1/videos", data={**form, "outputs": json.dumps([{"format": "webm", "codec": "h264"}])}),
                   "outputs.0.codec")
    created = client.post("/v1/videos", data={**form, "outputs": json.dumps([{"format": "webm", "fps": 24}])})
    assert created.status_code == 200, created.text
    assert [(o["name"], o["codec"], o["fps"], o["frames"]) for o in created.json()["outputs"]] == [("webm", "vp9", 24, 25)]


def test_outputs_written_field_by_field_as_the_sdk_writes_them_are_read_by_position(api):
    """OpenAI's SDK writes a list of objects field by field: every outputs[][format], then every outputs[][fps]."""
    client, _ = api
    form = {**{k: str(v) for k, v in VIDEO.items()}, "outputs[][format]": ["webm", "mov"],
            "outputs[][fps]": ["24", "8"]}
    created = client.post("/v1/videos", data=form)
    assert created.status_code == 200, created.text
    assert [(o["format"], o["fps"]) for o in created.json()["outputs"]] == [("webm", 24), ("mov", 8)]


def test_a_list_written_field_by_field_with_different_counts_is_refused(api):
    """Three formats and one fps: the fps may be any item's, so the server asks for JSON rather than guess."""
    client, services = api
    form = {**{k: str(v) for k, v in VIDEO.items()}, "outputs[][format]": ["webm", "mov", "frames"],
            "outputs[][fps]": "30"}
    refused = client.post("/v1/videos", data=form)
    assert_refused(refused, "outputs")
    error = refused.json()["error"]
    assert error["code"] == "ambiguous_form_field" and "as JSON" in error["message"], error
    assert services.queue.submitted == [] and services.store.list()[0] == []


def test_an_extension_renders_the_whole_video_and_is_checked_like_any(api, tmp_path):
    client, services = api
    source = encode_mp4(np.full((9, 64, 96, 3), 90, np.uint8), tmp_path / "source.mp4", fps=16).read_bytes()
    body = {"model": "wan-tiny", "prompt": "the fox runs", "seconds": "1"}
    refused = client.post("/v1/videos/extensions", data={**body, "outputs": json.dumps([{"format": "mov", "quality": 9}])},
                          files={"video": ("source.mp4", source, "video/mp4")})
    assert_refused(refused, "outputs.0.quality")
    assert services.queue.submitted == []
    created = client.post("/v1/videos/extensions", data={**body, "outputs": json.dumps([{"format": "gif", "fps": 8}])},
                          files={"video": ("source.mp4", source, "video/mp4")})
    assert created.status_code == 200, created.text
    video = created.json()
    # 9 source frames and 16 new ones: 25 frames at 16 fps are 13 at 8.
    assert video["num_frames"] == 25 and video["outputs"][0]["frames"] == 13


def test_a_remix_keeps_the_sources_outputs_or_takes_new_ones(api):
    client, services = api
    source = client.post("/v1/videos", json={**VIDEO, "outputs": [{"format": "gif"}]}).json()
    kept = client.post(f"/v1/videos/{source['id']}/remix", json={"prompt": "a grey fox"})
    assert kept.status_code == 200 and kept.json()["outputs"] == source["outputs"]
    assert_refused(client.post(f"/v1/videos/{source['id']}/remix",
                               json={"prompt": "a grey fox", "outputs": [{"format": "gif", "size": "96x96"}]}),
                   "outputs.0.size")
    changed = client.post(f"/v1/videos/{source['id']}/remix", json={"prompt": "a grey fox", "outputs": []})
    assert changed.status_code == 200 and changed.json()["outputs"] == []
    assert services.queue.submitted == [source["id"], kept.json()["id"], changed.json()["id"]]
