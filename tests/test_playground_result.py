"""The playground puts the result first, in headless Chromium against one real server: at 1366x900
and at 400x800 the finished video plays at the top without scrolling, with crisp pixels and no
controls over it; every download answers with its file; remix, extend and "same seed again" make
videos that complete; the copied curl command (and Python) makes the same job again; nothing
scrolls sideways at 400 px; the running, failed and error states are shown for what they are; at
400 and 1280 px a page of recent jobs stays in a box of bounded height, the chat's file input shows
whole, an error goes once its field is changed, and Remix is one Tab (and Enter) from the prompt.

Screenshots of the empty, running, finished, failed and error states are saved under the
module's temp dir (`screens`). Like test_playground.py, these need Playwright and a Chromium
binary, and skip without them."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest
from servers import Server
from test_playground import assert_not_blank, assert_pixel_scaled, browser, checked_page, wait_until  # noqa: F401

DESKTOP, PHONE = {"width": 1366, "height": 900}, {"width": 400, "height": 800}
SMALL = {"#size": "64x64", "#seconds": "2", "#steps": "2"}  # wan-tiny: one 33-frame chunk, two steps
MEDIA_TYPES = {"video": "video/mp4", "thumbnail": "image/webp", "spritesheet": "image/jpeg", "webm": "video/webm",
               "gif": "image/gif", "frames": "application/zip"}
# What a request sets, compared between a job and the one its copied request makes.
ASKED = ("model", "prompt", "size", "seconds", "seed", "num_inference_steps", "guidance_scale", "negative_prompt",
         "cache", "loras", "preset", "drift_correction", "priority")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One embedded server for the module (no chat), with an adapter whose file is not one: a job
    that names it fails when it loads."""
    root = tmp_path_factory.mktemp("playground-result")
    broken = root / "broken.safetensors"
    broken.write_bytes(b"\x00 not a safetensors file")
    started = Server(root / "data", extra=["--chat-model", "", "--lora", f"broken={broken}"]).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def screens(tmp_path_factory):
    return tmp_path_factory.mktemp("screens")


@pytest.fixture(scope="module")
def api(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


def open_playground(page, server) -> None:
    page.goto(server.url)
    wait_until(page, "document.querySelector('#model').options.length > 1")


def submit(page, prompt: str, fields: dict[str, str] = SMALL, model: str = "wan-tiny") -> str:
    """Fill the form and generate; the new video's id once the page follows it."""
    before = page.text_content("#live-id") if page.is_visible("#live") else ""
    page.fill("#prompt", prompt)
    page.select_option("#model", model)
    for field, value in fields.items():
        page.fill(field, value)
    page.click("#generate")
    return new_video(page, before)


def new_video(page, before: str) -> str:
    wait_until(page, f"(id => id && id !== {json.dumps(before)})(document.querySelector('#live-id').textContent)")
    return page.text_content("#live-id")


def finished_and_playing(page) -> None:
    wait_until(page, "document.querySelector('#live-status').textContent.startsWith('completed')")
    # Playing: it has frames, is not paused, and its time moves on by itself.
    playing = "(v => v.readyState >= 2 && !v.paused && v.currentTime > 0)(document.querySelector('#live-video'))"
    wait_until(page, playing)
    start = page.evaluate("document.querySelector('#live-video').currentTime")
    wait_until(page, f"document.querySelector('#live-video').currentTime !== {start}")


def assert_in_view_unscrolled_and_uncovered(page) -> None:
    """The video lies wholly inside the window, and its controls below it, not on it."""
    found = page.evaluate("""() => {
        const video = document.querySelector('#live-video').getBoundingClientRect();
        const bar = document.querySelector('#player-bar').getBoundingClientRect();
        return {top: video.top, bottom: video.bottom, left: video.left, right: video.right, barTop: bar.top,
                height: innerHeight, width: innerWidth, controls: document.querySelector('#live-video').controls,
                muted: document.querySelector('#live-video').muted, loop: document.querySelector('#live-video').loop};
    }""")
    assert -1 < found["top"] and found["bottom"] < found["height"] + 1, found  # to the pixel
    assert -1 < found["left"] and found["right"] < found["width"] + 1, found
    assert not found["controls"] and found["barTop"] >= found["bottom"], found
    assert found["muted"] and found["loop"], found


def no_sideways_scroll(page) -> None:
    width = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert width[0] <= width[1], f"the page scrolls sideways: {width[0]} px of content in {width[1]} px"


def video(api, video_id: str) -> dict:
    return api.get(f"/v1/videos/{video_id}").raise_for_status().json()


def test_the_finished_video_plays_first_with_every_download(server, browser, api, screens):
    with checked_page(browser, DESKTOP) as page:
        open_playground(page, server)
        assert page.is_visible("#stage-empty") and page.is_hidden("#live")
        page.screenshot(path=screens / "empty-1366x900.png")
        for name in ("webm", "gif", "frames"):
            page.check(f"input[name=outputs][value={name}]")
        video_id = submit(page, "a red circle moving left on a black background", {**SMALL, "#seed": "11"})
        finished_and_playing(page)
        assert_in_view_unscrolled_and_uncovered(page)
        assert_pixel_scaled(page, "#live-video", 7)  # 64x64, 7x: as large as 480 px high allows, crisp
        page.wait_for_selector("#result:not([hidden])")
        page.screenshot(path=screens / "finished-1366x900.png")
        assert_not_blank(screens / "finished-1366x900.png")

        links = page.eval_on_selector_all("#live-downloads a", "links => links.map(a => [a.href, a.download])")
        variants = [re.search(r"variant=([\w-]+)", href)[1] for href, _ in links]
        assert variants == ["video", "thumbnail", "spritesheet", "webm", "gif", "frames"]
        for (href, filename), variant in zip(links, variants):
            answer = httpx.get(href, timeout=30)
            assert answer.status_code == 200 and answer.headers["content-type"] == MEDIA_TYPES[variant], variant
            assert filename.startswith(video_id) and answer.content, (variant, filename)
            with page.expect_download() as saved:  # and the browser saves it, under its name
                page.click(f"#live-downloads a[href$='variant={variant}']")
            assert saved.value.suggested_filename == filename
        assert [name for _, name in links][:1] == [f"{video_id}.mp4"]


def test_remix_extend_and_the_same_seed_again_at_400_px(server, browser, api, screens):
    with checked_page(browser, PHONE) as page:
        open_playground(page, server)
        no_sideways_scroll(page)
        page.screenshot(path=screens / "empty-400x800.png", full_page=True)
        first = submit(page, "a yellow triangle moving right on a gray background", {**SMALL, "#seed": "5"})
        finished_and_playing(page)
        assert_in_view_unscrolled_and_uncovered(page)  # the page brought it up from the form, far below
        assert_pixel_scaled(page, "#live-video", 5)  # as wide as a 400 px screen allows
        page.wait_for_selector("#result:not([hidden])")
        page.click("#snippet summary")
        no_sideways_scroll(page)
        page.screenshot(path=screens / "finished-400x800.png", full_page=True)

        page.fill("#prompt", "a blue circle moving up on a white background")
        page.click("#remix")
        remix = new_video(page, first)
        finished_and_playing(page)
        made = video(api, remix)
        assert (made["remixed_from_video_id"], made["prompt"], made["seed"]) == (
            first, "a blue circle moving up on a white background", 5)

        page.fill("#seconds", "1")
        page.click("#extend")
        extension = new_video(page, remix)
        finished_and_playing(page)
        made = video(api, extension)
        assert made["extends_video_id"] == remix and made["num_frames"] == 33 + 16  # 1 s more at 16 fps

        page.fill("#prompt", "")
        page.click("#rerun")
        again = new_video(page, extension)
        finished_and_playing(page)
        made, source = video(api, again), video(api, extension)
        assert made["remixed_from_video_id"] == extension
        assert [made[k] for k in ("prompt", "seed", "num_frames", "size")] == [source[k] for k in (
            "prompt", "seed", "num_frames", "size")]
        no_sideways_scroll(page)
        page.evaluate("window.scrollTo(0, document.body.scrollHeight)")  # the gallery's cards, at the bottom
        page.locator(f"#gallery-rows tr[data-id='{again}'] td.status.completed").wait_for()
        no_sideways_scroll(page)


def test_the_copied_request_makes_the_same_job(server, browser, api, tmp_path):
    context_options = {"permissions": ["clipboard-read", "clipboard-write"]}
    with checked_page(browser, DESKTOP, **context_options) as page:
        open_playground(page, server)
        page.fill("#negative_prompt", "blurry, dark")
        page.fill("#guidance", "3.5")
        page.check("input[name=outputs][value=webm]")
        page.click("#advanced summary")
        page.check("input[name=cache][value=first_block]")
        page.fill("#cache-threshold", "0.1")
        page.select_option("#priority", "low")
        original = submit(page, "a green triangle moving down on a black background", {**SMALL, "#seed": "4242"})
        page.click("#snippet summary")
        page.click("#copy-curl")
        wait_until(page, "document.querySelector('#copy-status').textContent.startsWith('Copied')")
        command = page.evaluate("navigator.clipboard.readText()")
        assert command == page.text_content("#snippet-curl") and command.startswith("curl -s ")
        python = page.text_content("#snippet-python")

    made = json.loads(subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                                     timeout=60).stdout)
    printed = subprocess.run([sys.executable, "-c", python], capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    again = printed.stdout.split()[0]
    source = video(api, original)
    for copy in (made, video(api, again)):
        assert copy["id"] not in (original,) and copy["status"] in ("queued", "in_progress", "completed")
        assert {k: copy[k] for k in ASKED} == {k: source[k] for k in ASKED}
        assert [o["name"] for o in copy["outputs"]] == [o["name"] for o in source["outputs"]] == ["webm"]
        assert (source["seed"], source["cache"]["kind"], source["priority"]) == (4242, "first_block", "low")
        api.post(f"/v1/videos/{copy['id']}/cancel")  # seen enough: free the worker for the next test


def test_running_queued_failed_and_refused_are_shown_as_such(server, browser, api, screens):
    with checked_page(browser, DESKTOP) as page:
        open_playground(page, server)
        long = submit(page, "a red circle moving right on a black background", {**SMALL, "#seconds": "8",
                                                                                 "#steps": "40"})
        detail = re.compile(r"generating · step (\d+)/(\d+) · chunk \d of 4 · about \d+ s left")
        wait_until(page, "/step [1-9]\\d*\\/160 .* left/.test(document.querySelector('#live-detail').textContent)")
        assert detail.fullmatch(page.text_content("#live-detail")), page.text_content("#live-detail")
        assert page.text_content("#live-status") == "in progress"
        page.screenshot(path=screens / "running-1366x900.png")

        waiting = submit(page, "a blue circle moving left on a white background")
        wait_until(page, "document.querySelector('#live-status').textContent.startsWith('queued, next in line')")
        page.screenshot(path=screens / "queued-1366x900.png")
        for job in (waiting, long):
            api.post(f"/v1/videos/{job}/cancel")

        page.select_option("#lora", "broken")
        submit(page, "a green circle moving up on a gray background")
        wait_until(page, "document.querySelector('#live-status').textContent.startsWith('failed')")
        assert "lora_load_failed" in page.text_content("#live-detail")
        colour = page.evaluate("getComputedStyle(document.querySelector('#live-status')).color")
        assert colour == page.evaluate("getComputedStyle(document.querySelector('#job-error')).color")  # red
        page.screenshot(path=screens / "failed-1366x900.png")

        page.select_option("#lora", "")
        page.fill("#size", "65x64")
        page.click("#generate")
        page.wait_for_selector("#job-error:not([hidden])")
        assert "multiples of 16" in page.text_content("#job-error")
        assert page.get_attribute("#size", "aria-invalid") == "true"
        page.screenshot(path=screens / "error-1366x900.png")
    for shot in screens.iterdir():
        assert_not_blank(shot)


def test_the_page_stays_short_and_the_result_is_one_tab_from_the_prompt(server, browser, api, screens):
    """A page of ten cards scrolls in its own box; the chat's file input shows whole; an error beside
    a field goes once that field is changed; from the prompt, one Tab and Enter reach Remix."""
    for n in range(10):  # ten cards, cancelled while queued: nothing to compute
        made = api.post("/v1/videos", json={"prompt": f"card {n}", "size": "64x64", "seconds": "1",
                                            "num_inference_steps": 1}).raise_for_status().json()
        api.post(f"/v1/videos/{made['id']}/cancel").raise_for_status()
    for viewport in (PHONE, {"width": 1280, "height": 900}):
        with checked_page(browser, viewport) as page:
            open_playground(page, server)
            wait_until(page, "document.querySelectorAll('#gallery-rows tr[data-id]').length === 10")
            cards = page.evaluate("""(rows => ({shown: rows.clientHeight, all: rows.scrollHeight,
                                               section: document.querySelector('#gallery').offsetHeight}))(
                                     document.querySelector('#gallery-rows'))""")
            bound = min(36 * 15, 0.75 * viewport["height"])  # min(36rem, 75vh), at 15 px a rem
            assert cards["shown"] <= bound + 1 and cards["all"] > cards["shown"], cards
            assert cards["section"] < bound + 200, cards  # its heading and buttons above the cards
            image = page.evaluate("(i => [i.scrollWidth, i.clientWidth])(document.querySelector('#chat-image'))")
            assert image[0] <= image[1], f"the file input is clipped: {image}"
            no_sideways_scroll(page)

            page.fill("#prompt", "a red circle moving left on a black background")
            page.fill("#size", "65x64")
            page.click("#generate")
            page.wait_for_selector("#job-error:not([hidden])")
            page.focus("#seed")
            page.keyboard.type("3")  # another field: the message about the size stays
            assert page.is_visible("#job-error") and page.get_attribute("#size", "aria-invalid") == "true"
            page.focus("#size")
            page.keyboard.press("Backspace")  # the field the error names: the message goes with the change
            assert page.is_hidden("#job-error") and page.get_attribute("#size", "aria-invalid") is None

            page.focus("#prompt")
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.id") == "model"  # no video on screen: nothing to reach
            page.fill("#size", "64x64")
            page.fill("#steps", "1")
            page.click("#generate")
            wait_until(page, "document.querySelector('#live-status').textContent.startsWith('completed')")
            page.wait_for_selector("#result:not([hidden])")
            page.evaluate("window.scrollTo(0, document.querySelector('#prompt').getBoundingClientRect().top + scrollY)")
            page.focus("#prompt")
            page.keyboard.type(", then up")
            page.keyboard.press("Tab")
            assert page.evaluate("document.activeElement.id") == "to-result"
            page.keyboard.press("Enter")
            assert page.evaluate("document.activeElement.id") == "remix"
            box = page.evaluate("(b => [b.top, b.bottom, innerHeight])(document.activeElement.getBoundingClientRect())")
            assert 0 <= box[0] and box[1] <= box[2], f"Remix has focus but is out of view: {box}"
            page.screenshot(path=screens / f"short-{viewport['width']}.png", full_page=True)
