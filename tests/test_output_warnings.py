"""No silent garbage: a finished video that is blank, one flat colour, or frozen carries a
warning on its video object, in the log and in metrics, and the playground shows it; a
normal clip (the trained wan-shapes model's, or wan-tiny's noise) carries none."""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from urllib.parse import urlsplit

import numpy as np
import pytest

from vidserve.config import Settings
from vidserve.jobs import ChunkDrift, ChunkRecord, Job, JobStatus
from vidserve.jobs.video_object import VideoObject
from vidserve.media import encode_mp4
from vidserve.params import JobParams
from vidserve.pipelines import chain
from vidserve.media.quality import chunk_warnings, output_warnings
from vidserve.registry import resolve
from vidserve.options import GenerationOptions
from vidserve.video_request import build_request

FRAMES, SIDE = 33, 64


def codes(frames: np.ndarray) -> list[str]:
    return [w.code for w in output_warnings(frames)]


def moving_square(background: int = 0, colour=(255, 255, 255), side: int = 8) -> np.ndarray:
    """A small square crossing the frame one pixel a frame: 1.6% of each frame, the rest background."""
    frames = np.full((FRAMES, SIDE, SIDE, 3), background, np.uint8)
    for t in range(FRAMES):
        frames[t, 28:28 + side, 10 + t:10 + t + side] = colour
    return frames


def test_black_and_white_clips_are_blank():
    black = output_warnings(np.zeros((FRAMES, SIDE, SIDE, 3), np.uint8))
    assert [(w.code, w.message) for w in black] == [
        ("blank_output", "all 33 frames are nearly black (mean luma 0.0/255); try another seed or prompt")]
    white = output_warnings(np.full((FRAMES, SIDE, SIDE, 3), 255, np.uint8))
    assert [w.code for w in white] == ["blank_output"] and "nearly white (mean luma 255.0/255)" in white[0].message


def test_dark_noise_and_a_few_stray_pixels_are_still_blank():
    rng = np.random.default_rng(0)
    dark = rng.integers(0, 20, (FRAMES, SIDE, SIDE, 3), dtype=np.uint8)
    dark[:, 5, 5:15] = 255  # ten bright pixels a frame: 0.24%
    assert codes(dark) == ["blank_output"]


def test_one_flat_colour_is_constant():
    grey = output_warnings(np.full((FRAMES, SIDE, SIDE, 3), 128, np.uint8))
    assert [(w.code, w.message) for w in grey] == [
        ("constant_output", "all 33 frames are one flat colour (RGB 128, 128, 128); try another seed or prompt")]
    rng = np.random.default_rng(1)
    grain = np.clip(rng.normal((40, 90, 160), 3, (FRAMES, SIDE, SIDE, 3)), 0, 255).astype(np.uint8)
    assert codes(grain) == ["constant_output"]  # a little grain is still one colour


def test_one_frame_repeated_is_frozen():
    rng = np.random.default_rng(2)
    frame = rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)
    frozen = output_warnings(np.repeat(frame[None], FRAMES, axis=0))
    assert [w.code for w in frozen] == ["frozen_output"]
    assert frozen[0].message.startswith("all 33 frames are nearly identical (mean change from the first at most 0.00")
    # A long 720p clip is sampled, not read whole: a view of one frame repeated costs no memory.
    still = rng.integers(0, 256, (720, 1280, 3), dtype=np.uint8)
    assert codes(np.broadcast_to(still, (241, 720, 1280, 3))) == ["frozen_output"]


def test_moving_noise_and_a_moving_shape_carry_none():
    rng = np.random.default_rng(3)
    assert codes(rng.integers(0, 256, (FRAMES, SIDE, SIDE, 3), dtype=np.uint8)) == []
    assert codes(moving_square()) == []  # a white square on black
    assert codes(moving_square(background=255, colour=(0, 0, 255))) == []  # a blue one on white
    assert codes(moving_square(background=128, colour=(200, 60, 60))) == []  # a red one on grey


def test_a_single_normal_frame_carries_none():
    assert codes(moving_square()[:1]) == []  # one frame cannot move, and is not called frozen
    assert codes(np.zeros((1, SIDE, SIDE, 3), np.uint8)) == ["blank_output"]


def test_a_job_record_from_before_warnings_loads_with_none():
    params = JobParams(width=64, height=64, num_frames=17, fps=16, steps=20, guidance=4.0, seed=1,
                       chunk_frames=(17,), seconds="1.0625")
    record = json.loads(Job(model="wan-shapes", prompt="a cat", params=params).model_dump_json())
    del record["warnings"]
    job = Job.model_validate_json(json.dumps(record))
    assert job.warnings == [] and VideoObject.of(job).model_dump()["warnings"] == []


# Prompts from the shapes world: the stillest (a still shape) and one on each background. Fewer
# than the default 20 steps is not a normal clip: at 4 the shape is often never drawn, and those
# clips are rightly called blank.
SHAPES_PROMPTS = ["a green circle standing still on a black background",
                  "a blue square moving up on a white background",
                  "a yellow triangle moving right on a gray background"]


def test_wan_shapes_normal_clips_carry_none():
    for seed, prompt in enumerate(SHAPES_PROMPTS):
        request = build_request(resolve("wan-shapes"), Settings(), prompt, GenerationOptions(seed=seed))
        frames = chain.generate_video(request, device="cpu", dtype="float32").frames
        assert output_warnings(frames) == [], prompt


CHROMIUM = os.environ.get("VIDSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
STATIC = os.path.join(os.path.dirname(__file__), "..", "api", "static")
ORIGIN = "http://127.0.0.1:9"  # nothing listens there: every request is answered by the routes below


@contextmanager
def playground_with_one_job(tmp_path, completed_with):
    """The page as served (static files, its CSP) against a fake API whose one job, submitted from
    the form, ends completed as `completed_with(job)` leaves it (its frames black); yields the page
    once the warnings show."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if CHROMIUM is None:
        pytest.skip("no Chromium binary (apt-get install chromium, or set VIDSERVE_CHROMIUM)")
    from vidserve.api.routers.playground import HEADERS

    params = JobParams(width=64, height=64, num_frames=33, fps=16, steps=4, guidance=1.0, seed=7,
                       chunk_frames=(33,), seconds="2.0625")
    job = Job(id="video_blank", model="wan-tiny", prompt="a red fox in snow", params=params)
    queued = VideoObject.of(job).model_dump(mode="json")
    frames = np.zeros((33, 64, 64, 3), np.uint8)
    job.status, job.progress, job.completed_at = JobStatus.completed, 100, job.created_at + 3
    completed_with(job, frames)
    completed = VideoObject.of(job).model_dump(mode="json")
    mp4 = encode_mp4(frames, tmp_path / "blank.mp4", fps=16).read_bytes()
    models = {"data": [{"id": "wan-tiny", "kind": "t2v", "size": "64x64", "fps": 16, "frames_per_chunk": 33}]}

    def answer(route):
        url = urlsplit(route.request.url)
        if url.path == "/" or url.path.startswith("/static/"):
            name = "index.html" if url.path == "/" else url.path.removeprefix("/static/")
            kind = {"html": "text/html", "js": "text/javascript", "css": "text/css"}[name.rsplit(".", 1)[1]]
            with open(os.path.join(STATIC, name), "rb") as file:
                route.fulfill(body=file.read(), content_type=kind, headers=HEADERS)
        elif url.path == "/v1/models":
            route.fulfill(json=models)
        elif url.path == "/v1/videos":
            route.fulfill(json=queued if route.request.method == "POST" else {"data": [], "has_more": False})
        elif url.path == f"/v1/videos/{job.id}/events":
            route.fulfill(body=f"event: video.completed\ndata: {json.dumps(completed)}\n\n",
                          content_type="text/event-stream")
        elif url.path == f"/v1/videos/{job.id}/content":
            route.fulfill(body=mp4, content_type="video/mp4")
        else:
            route.fulfill(status=404, json={"error": {"message": f"no route {url.path}"}})

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.route("**/*", answer)
            page.goto(ORIGIN)
            page.fill("#prompt", "a red fox in snow")
            assert page.is_hidden("#live-warnings")
            page.click("#generate")
            page.wait_for_selector("#live-warnings:not([hidden])")
            yield page
            assert not errors, errors
        finally:
            browser.close()


def test_the_playground_shows_a_videos_warnings(tmp_path):
    def blank(job, frames):
        job.warnings = output_warnings(frames)

    with playground_with_one_job(tmp_path, blank) as page:
        assert page.text_content("#live-warnings") == (
            "Warning: all 33 frames are nearly black (mean luma 0.0/255); try another seed or prompt")
        assert page.get_attribute("#live-warnings", "role") == "status"
        assert page.text_content("#live-status").startswith("completed")
        page.screenshot(path=str(tmp_path / "warning.png"))


def test_the_playground_flags_the_chunk_a_warning_names(tmp_path):
    def second_chunk_blank(job, frames):
        drift = ChunkDrift(mean_luma=0.0, channel_mean=(0, 0, 0), channel_std=(0, 0, 0), histogram_distance=0.0,
                           sharpness=0.0, luma_change=0.0, sharpness_ratio=1.0)
        job.chunks = [ChunkRecord(index=i, frames=33 - i, key=f"{job.id}/chunk-{i}.mp4", drift=drift) for i in (0, 1)]
        job.warnings = chunk_warnings(frames[:32], 1)

    with playground_with_one_job(tmp_path, second_chunk_blank) as page:
        assert page.text_content("#live-warnings") == ("Warning: chunk 2: all 32 frames are nearly black (mean luma "
                                                       "0.0/255); try another seed or prompt")
        page.wait_for_selector("#live-chunks li[data-index='1'] p.warning")
        assert page.text_content("#live-chunks li[data-index='1'] p.warning") == "⚠ blank_output"
        assert page.locator("#live-chunks li[data-index='0'] p.warning").count() == 0
