"""Renditions end to end: a request's `outputs` made by the embedded worker from the frames the
tiny model generates, encoded by the real ffmpeg binary, stored, downloaded as variants and
probed; the spritesheet through the official openai SDK; the default MP4 unchanged."""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np
import openai
import pytest
from apps import app_client
from PIL import Image
from probe import probe

from vidserve import __version__
from vidserve.media.renderer import ENCODERS, Encoder
from vidserve.media import save_thumbnail
from vidserve.media.hls import encode_segment, join_segments
from vidserve.pipelines import chain
from vidserve.media.spritesheet import sprite_indices

# The SDK marks its videos methods deprecated (OpenAI's own service); they still speak the API.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SMALL = {"model": "wan-tiny", "size": "64x64", "num_inference_steps": 2, "seed": 7}
EVERY_KIND = [
    {"format": "mp4", "codec": "h264", "fps": 16},
    {"format": "webm", "codec": "vp9", "fps": 30},
    {"format": "mp4", "codec": "av1"},
    {"format": "mov", "codec": "prores"},
    {"format": "gif", "size": "48x48"},
    {"format": "frames"},
    {"format": "apng"},
    {"format": "mp4", "codec": "h265", "size": "32x32", "quality": "low", "name": "small"},
]
# name -> (ffmpeg's codec name, media type, fps, size): what each of EVERY_KIND must hold.
EXPECTED = {
    "mp4": ("h264", "video/mp4", 16, (64, 64)),
    "webm": ("vp9", "video/webm", 30, (64, 64)),
    "mp4-av1": ("av1", "video/mp4", 16, (64, 64)),
    "mov": ("prores", "video/quicktime", 16, (64, 64)),
    "gif": ("gif", "image/gif", 16, (48, 48)),
    "apng": ("apng", "image/apng", 16, (64, 64)),
    "small": ("hevc", "video/mp4", 16, (32, 32)),
}
TAGGED = ("mp4", "webm", "mp4-av1", "mov", "small")


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """The app with its embedded worker; `made` maps each job's prompt to the frames the model made."""
    made: dict[str, np.ndarray] = {}
    generate = chain.generate_video

    def recording(request, *args, **kwargs):
        result = generate(request, *args, **kwargs)
        made[request.prompt] = result.frames
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chain, "generate_video", recording)
        with app_client(tmp_path_factory.mktemp("renditions")) as (client, _):
            yield client, made


def run_job(client, body) -> tuple[dict, list[tuple[str, dict]]]:
    """Create the video and follow its events to the end: (the final video object, the events)."""
    created = client.post("/v1/videos", json=body)
    assert created.status_code == 200, created.text
    events, kind = [], None
    with client.stream("GET", f"/v1/videos/{created.json()['id']}/events") as stream:
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[len("data: "):])))
    return events[-1][1], events


def download(client, video_id: str, variant: str, tmp_path):
    response = client.get(f"/v1/videos/{video_id}/content", params={"variant": variant})
    assert response.status_code == 200, response.text
    path = tmp_path / variant
    path.write_bytes(response.content)
    return response, path


def zip_frames(path) -> tuple[np.ndarray, dict]:
    with zipfile.ZipFile(path) as archive:
        names = sorted(name for name in archive.namelist() if name.endswith(".png"))
        frames = np.stack([np.asarray(Image.open(io.BytesIO(archive.read(name))).convert("RGB")) for name in names])
        return frames, json.loads(archive.read("manifest.json"))


@pytest.fixture(scope="module")
def every_kind(api):
    """One job asking for every kind of rendition: (client, its video object, events, frames made)."""
    client, made = api
    prompt = "a red fox in snow"
    video, events = run_job(client, {**SMALL, "prompt": prompt, "num_frames": 17, "outputs": EVERY_KIND})
    assert video["status"] == "completed", video["error"]
    return client, video, events, made[prompt]


def test_every_rendition_downloads_as_asked(every_kind, tmp_path):
    client, video, _, frames = every_kind
    listed = {output["name"]: output for output in video["outputs"]}
    assert list(listed) == ["mp4", "webm", "mp4-av1", "mov", "gif", "frames", "apng", "small"]
    for name, (codec, media_type, fps, size) in EXPECTED.items():
        response, path = download(client, video["id"], name, tmp_path)
        assert response.headers["content-type"] == media_type, name
        assert len(response.content) == listed[name]["bytes"], name
        # 17 frames at 16 fps are 31 at 30 fps: (17 - 1) * 30 // 16 + 1.
        frame_count = 31 if fps == 30 else 17
        assert listed[name]["frames"] == frame_count and listed[name]["fps"] == fps, name
        assert listed[name]["size"] == f"{size[0]}x{size[1]}" and listed[name]["media_type"] == media_type, name
        found = probe(path)
        assert (found.codec, found.fps, (found.width, found.height), found.frames) == (codec, fps, size, frame_count), \
            name


def test_the_frames_zip_holds_the_generated_frames_losslessly(every_kind, tmp_path):
    client, video, _, frames = every_kind
    response, path = download(client, video["id"], "frames", tmp_path)
    assert response.headers["content-type"] == "application/zip"
    unpacked, manifest = zip_frames(path)
    assert np.array_equal(unpacked, frames)
    assert manifest == {"fps": 16, "size": "64x64", "prompt": "a red fox in snow", "model": "wan-tiny", "seed": 7,
                        "vidserve_version": __version__, "frames": 17, "names": "frame-%06d.png"}


def test_tags_say_prompt_model_seed_and_version(every_kind, tmp_path):
    client, video, _, _ = every_kind
    for name in TAGGED:
        _, path = download(client, video["id"], name, tmp_path)
        assert {key: probe(path).tags.get(key) for key in ("prompt", "model", "seed", "vidserve_version")} == \
            {"prompt": "a red fox in snow", "model": "wan-tiny", "seed": "7", "vidserve_version": __version__}, name


def test_encoding_is_a_stage_with_a_time_per_rendition(every_kind):
    _, video, events, _ = every_kind
    encoding = [data for kind, data in events if data.get("stage") == "encoding"]
    assert encoding and all(kind == "video.progress" for kind, data in events if data.get("stage") == "encoding")
    assert [data["progress"] for data in encoding] == sorted(data["progress"] for data in encoding)
    assert video["stage"] is None and video["progress"] == 100
    assert {f"encode.{name}" for name in EXPECTED} | {"encode.frames"} <= set(video["timings"])


def test_the_spritesheet_and_thumbnail_through_the_openai_sdk(every_kind, tmp_path):
    client, video, _, frames = every_kind
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=client, max_retries=0)
    sheet = Image.open(io.BytesIO(sdk.videos.download_content(video["id"], variant="spritesheet").read()))
    assert sheet.format == "JPEG" and sheet.size == (4 * 64, 4 * 64)  # 16 of the 17 frames, 4 a row
    tiles = np.asarray(sheet.convert("RGB")).astype(int)
    for tile, index in enumerate(sprite_indices(len(frames))):
        row, column = divmod(tile, 4)
        shown = tiles[row * 64:(row + 1) * 64, column * 64:(column + 1) * 64]
        assert np.abs(shown - frames[index]).mean() < 12, f"tile {tile} is not frame {index}"  # JPEG's loss
    thumbnail = sdk.videos.download_content(video["id"], variant="thumbnail").read()
    assert thumbnail == save_thumbnail(frames, tmp_path / "thumbnail.webp").read_bytes()


def test_a_long_video_is_rendered_whole_and_16_fps_becomes_32_by_interpolation(api, tmp_path):
    client, made = api
    prompt = "a fox walks"
    outputs = [{"format": "frames"}, {"format": "frames", "fps": 32, "name": "interpolated"},
               {"format": "frames", "fps": 32, "fps_mode": "blend", "name": "blended"}]
    # 37 frames are two chunks of wan-tiny's 33: the renditions are of the stitched video.
    video, _ = run_job(client, {**SMALL, "prompt": prompt, "num_frames": 37, "outputs": outputs})
    assert video["status"] == "completed", video["error"]
    frames = made[prompt]
    assert len(frames) == 37 and len(video["chunks"]) == 2
    whole, _ = zip_frames(download(client, video["id"], "frames", tmp_path)[1])
    assert np.array_equal(whole, frames)
    for name in ("interpolated", "blended"):
        converted, manifest = zip_frames(download(client, video["id"], name, tmp_path)[1])
        assert len(converted) == 2 * (37 - 1) + 1 == manifest["frames"] and manifest["fps"] == 32, name
        assert next(o for o in video["outputs"] if o["name"] == name)["frames"] == len(converted), name
        # Every other frame falls on a source frame's time, the first and the last among them.
        assert np.array_equal(converted[0], frames[0]) and np.array_equal(converted[-1], frames[-1]), name
        assert np.array_equal(converted[::2], frames), name
    chunk = client.get(f"/v1/videos/{video['id']}/content", params={"variant": "chunk", "index": 1})
    assert chunk.status_code == 200 and chunk.headers["content-type"] == "video/mp4"
    (tmp_path / "chunk.mp4").write_bytes(chunk.content)
    assert probe(tmp_path / "chunk.mp4").codec == "h264"  # chunks stay H.264


def test_without_outputs_the_video_is_its_stream_joined(api, tmp_path):
    """Renditions leave the default MP4 alone: the chunk's segment, the encode the stream plays."""
    client, made = api
    prompt = "a plain fox"
    video, _ = run_job(client, {**SMALL, "prompt": prompt, "num_frames": 17})
    assert video["status"] == "completed", video["error"]
    assert video["outputs"] == []
    response, _ = download(client, video["id"], "video", tmp_path)
    segment = encode_segment(made[prompt], 16)
    assert response.content == join_segments(segment.init, [segment.media], tmp_path / "video.mp4").read_bytes()
    missing = client.get(f"/v1/videos/{video['id']}/content", params={"variant": "webm"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "variant_not_found"


def test_an_encoder_failure_fails_the_job_and_the_next_job_is_served(api, monkeypatch):
    client, _ = api
    monkeypatch.setitem(ENCODERS, "vp9", Encoder("libvpx-vp9-missing", "yuv420p", "crf"))
    failed, _ = run_job(client, {**SMALL, "prompt": "a fox in fog", "num_frames": 5,
                                 "outputs": [{"format": "mp4"}, {"format": "webm"}]})
    assert failed["status"] == "failed" and failed["error"]["code"] == "encode_failed"
    assert "webm" in failed["error"]["message"]
    served, _ = run_job(client, {**SMALL, "prompt": "a fox in sun", "num_frames": 5, "outputs": [{"format": "mp4"}]})
    assert served["status"] == "completed", served["error"]
    assert client.get("/readyz").status_code == 200


def test_deleting_a_video_deletes_its_renditions(api):
    client, _ = api
    video, _ = run_job(client, {**SMALL, "prompt": "a fox at dusk", "num_frames": 5,
                                "outputs": [{"format": "gif"}, {"format": "frames"}]})
    assert video["status"] == "completed", video["error"]
    files = client.app.state.services.settings.data_dir / "files" / video["id"]
    assert {path.name for path in (files / "outputs").iterdir()} == {"gif.gif", "frames.zip"}
    assert client.delete(f"/v1/videos/{video['id']}").json()["deleted"] is True
    assert not files.exists()
