"""The playground page at `/`, driven end to end in headless Chromium against real servers:
a wan-tiny job submitted with the keyboard (progress moves, the <video> plays the result,
chunks and the gallery show timings and drift), a second job cancelled, a chat answer
streamed in, the API's errors shown in the page, and a keyed server asking for its key.

The browser tests need Playwright's Python client and a Chromium binary (Debian's
`chromium`, or VIDSERVE_CHROMIUM; `.ci/run` installs both) and skip without them.
Screenshots go to each test's tmp_path."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from lora_files import random_lora
from PIL import Image, ImageStat
from polling import eventually
from servers import Server
from stores import TEST_BUCKET

CHROMIUM = os.environ.get("VIDSERVE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")

KEY = "playground-test-key"
WAIT_MS = 60_000


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """An open server (chat on) and a keyed one (no chat model), started side by side."""
    root = tmp_path_factory.mktemp("playground")
    open_server = Server(root / "open" / "data")
    keyed = Server(root / "keyed" / "data", extra=["--api-key", KEY, "--chat-model", ""])
    for server in (open_server, keyed):
        server.data_dir.parent.mkdir(parents=True)
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(), (open_server, keyed)))
        yield open_server, keyed
    finally:
        open_server.stop()
        keyed.stop()


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium; the browser tests skip without Playwright or a Chromium binary."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
    if CHROMIUM is None:
        pytest.skip("no Chromium binary (apt-get install chromium, or set VIDSERVE_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@contextmanager
def checked_page(browser, viewport: dict, **context_options):
    """A page in a context of its own; on leaving it, no uncaught errors in the page and nothing
    loaded from the network: every request went to the server under test, or is a blob: or data: URL."""
    context = browser.new_context(viewport=viewport, **context_options)
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors, hosts = [], set()
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda request: hosts.add(urlsplit(request.url).netloc or urlsplit(request.url).scheme))
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"uncaught errors in the page: {errors}"
    assert all(h.startswith("127.0.0.1:") or h in ("blob", "data") for h in hosts), hosts


@pytest.fixture
def page(browser):
    with checked_page(browser, {"width": 1280, "height": 1000}) as page:
        yield page


def tab_to(page, selector: str, limit: int = 60) -> None:
    """Press Tab until `selector` has focus: the way a keyboard user gets there."""
    for _ in range(limit):
        if page.evaluate("s => document.activeElement === document.querySelector(s)", selector):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached {selector}")


def wait_until(page, expression: str, timeout: float = WAIT_MS / 1000) -> None:
    """Poll a JavaScript expression until it is truthy. (Playwright's wait_for_function evaluates
    its predicate with eval, which the page's Content-Security-Policy rightly refuses.)"""
    eventually(lambda: page.evaluate(expression), timeout=timeout, what=expression)


def focused_id(page) -> str:
    return page.evaluate("document.activeElement.id")


SHOWN = """s => {  // a video's or image's own size, the size it is shown at, and how it is scaled
    const media = document.querySelector(s), box = media.getBoundingClientRect();
    return {width: media.videoWidth ?? media.naturalWidth, height: media.videoHeight ?? media.naturalHeight,
            shown: [box.width, box.height], rendering: getComputedStyle(media).imageRendering};
}"""


def assert_pixel_scaled(page, selector: str, factor: int, crisp: bool = True) -> None:
    """A small clip or still is shown `factor` times its own size, in both directions, with crisp pixels."""
    def scaled():  # the size is set once the media's own size is known
        media = page.evaluate(SHOWN, selector)
        expected = [media["width"] * factor, media["height"] * factor]
        assert media["width"] and all(abs(a - b) < 1 for a, b in zip(media["shown"], expected)), (selector, media)
        return media

    media = eventually(scaled, timeout=WAIT_MS / 1000, what=f"{selector} shown {factor}x")
    if crisp:
        assert media["rendering"] == "pixelated", (selector, media)


def assert_not_blank(png: Path, min_side: int = 64) -> None:
    assert png.stat().st_size > 1000, png
    with Image.open(png) as image:
        assert min(image.size) >= min_side, image.size
        assert max(ImageStat.Stat(image.convert("L")).stddev) > 5, f"{png} is one flat colour"


def test_page_and_assets_load_without_a_key(servers):
    _, keyed = servers
    with urllib.request.urlopen(f"{keyed.url}/") as response:
        assert response.status == 200 and "text/html" in response.headers["content-type"]
        assert "default-src 'self'" in response.headers["content-security-policy"]
        html = response.read().decode()
    for asset in ("style.css", "app.js", "api.js", "ui.js", "job.js", "gallery.js", "chat.js"):
        with urllib.request.urlopen(f"{keyed.url}/static/{asset}") as response:
            assert response.status == 200, asset
    assert "static/app.js" in html and "://" not in html  # no remote URLs
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"{keyed.url}/v1/models")
    assert denied.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{keyed.url}/static/../pyproject.toml")
    assert missing.value.code == 404


def test_video_job_with_the_keyboard_then_cancel_one(servers, page, tmp_path):
    server, _ = servers
    page.goto(server.url)
    wait_until(page, "document.querySelector('#model').options.length > 1")

    # An empty prompt: the API's own message, and focus on the field it names.
    tab_to(page, "#generate")
    assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") != "none"  # visible focus
    page.keyboard.press("Enter")
    page.wait_for_selector("#job-error:not([hidden])")
    assert "prompt" in page.text_content("#job-error")
    assert focused_id(page) == "prompt"

    page.keyboard.type("a red fox in snow")
    page.keyboard.press("Tab")
    assert focused_id(page) == "model"
    page.keyboard.type("wan-tiny")  # type-to-select in a closed <select>
    assert page.input_value("#model") == "wan-tiny"
    tab_to(page, "#size")
    page.keyboard.type("65x64")
    page.keyboard.press("Enter")  # implicit submission from a text field
    wait_until(page, "document.querySelector('#job-error').textContent.includes('multiples of 16')")
    assert focused_id(page) == "size" and page.get_attribute("#size", "aria-invalid") == "true"
    page.keyboard.press("Control+A")
    page.keyboard.type("64x64")
    # 8 steps: few enough to be quick, enough that the stream (polled every 0.2 s) shows some.
    for field, value in (("#seconds", "2"), ("#seed", "7"), ("#steps", "8")):
        tab_to(page, field)
        page.keyboard.type(value)
    page.evaluate("""() => {  // record every value the progress bar shows
        window.progressSeen = [];
        const bar = document.querySelector('#live-progress');
        new MutationObserver(() => window.progressSeen.push(bar.value)).observe(bar, {attributes: true});
    }""")
    page.keyboard.press("Enter")
    page.wait_for_selector("#live:not([hidden])")
    job_id = page.text_content("#live-id")
    assert job_id.startswith("video_")
    assert page.is_hidden("#job-error")

    wait_until(page, "document.querySelector('#live-status').textContent.startsWith('completed')")
    wait_until(page, "(v => v.readyState >= 2 && v.duration > 0)(document.querySelector('#live-video'))")
    duration = page.evaluate("document.querySelector('#live-video').duration")
    assert 1.5 < duration < 3, duration  # 33 frames at 16 fps
    seen = page.evaluate("window.progressSeen")
    assert seen == sorted(seen) and seen[-1] == 100, seen
    assert any(0 < v < 100 for v in seen), f"progress never moved between 0 and 100: {seen}"
    assert page.locator("#live-chunks li").count() == 1  # 2 s of wan-tiny is one 33-frame chunk
    assert "luma" in page.text_content("#live-chunks li p")
    wait_until(page, "document.querySelector('#live-chunks video').duration > 0")
    assert "denoise" in page.text_content("#live-timings")
    assert page.get_attribute("#live-download", "download") == f"{job_id}.mp4"
    # The 64x64 clip fills the panel by a whole factor, up to 480 px high; the chunk is 3x.
    assert_pixel_scaled(page, "#live-video", 7)
    assert_pixel_scaled(page, "#live-chunks video", 3)

    row = page.locator(f"#gallery-rows tr[data-id='{job_id}']")
    row.locator("td.status.completed").wait_for()
    assert "denoise" in row.text_content() and "luma" in row.text_content()
    row.locator("img").wait_for()
    assert_pixel_scaled(page, f"#gallery-rows tr[data-id='{job_id}'] img", 2)

    page.evaluate("document.querySelector('#live-video').pause()")
    shots = tmp_path / "job-completed.png", tmp_path / "job-video.png"
    page.screenshot(path=shots[0], full_page=True)
    page.locator("#live-video").screenshot(path=shots[1])
    for shot in shots:
        assert_not_blank(shot)

    # A long image-to-video job with top-k attention, cancelled from the keyboard.
    image = tmp_path / "first.png"
    Image.radial_gradient("L").convert("RGB").resize((64, 64)).save(image)
    page.focus("#prompt")
    page.keyboard.press("Control+A")
    page.keyboard.type("a long one")
    tab_to(page, "#model")
    page.keyboard.type("wan-tiny-i2v")
    assert page.input_value("#model") == "wan-tiny-i2v"
    for field, value in (("#seconds", "20"), ("#steps", "100")):
        tab_to(page, field)
        page.keyboard.press("Control+A")
        page.keyboard.type(value)
    tab_to(page, "#advanced summary")  # attention is under the form's "Advanced" fold
    page.keyboard.press("Enter")
    tab_to(page, "input[name=attention]:checked")
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # arrows move through a radio group: dense, then sparse
    assert page.evaluate("document.activeElement.value") == "sparse"
    page.keyboard.press("Tab")
    assert focused_id(page) == "density"
    page.keyboard.type("0.25")
    page.set_input_files("#input_reference", str(image))  # the OS file dialog is beyond a browser test
    page.keyboard.press("Enter")
    wait_until(page, f"(id => id && id !== {json.dumps(job_id)})(document.querySelector('#live-id').textContent)")
    second = page.text_content("#live-id")
    tab_to(page, "#cancel")
    page.keyboard.press("Enter")
    wait_until(page, "document.querySelector('#live-status').textContent === 'cancelled'")
    assert page.get_attribute("#cancel", "aria-disabled") == "true"
    page.locator(f"#gallery-rows tr[data-id='{second}'] td.status.cancelled").wait_for()
    with urllib.request.urlopen(f"{server.url}/v1/videos/{second}") as response:
        video = json.load(response)
    assert video["model"] == "wan-tiny-i2v" and video["has_input_reference"]
    assert (video["seconds"], video["num_inference_steps"]) == ("20", 100)
    assert video["attention"]["mode"] == "sparse" and video["attention"]["density"] == 0.25
    page.screenshot(path=tmp_path / "job-cancelled.png", full_page=True)
    assert_not_blank(tmp_path / "job-cancelled.png")

    # The gallery's Show puts the finished job back in the player.
    tab_to(page, f"button[data-id='{job_id}'][data-action='show']")
    page.keyboard.press("Enter")
    wait_until(page, f"document.querySelector('#live-id').textContent === {json.dumps(job_id)}")
    assert focused_id(page) == "live-h"
    wait_until(page, "document.querySelector('#live-video').duration > 0")
    assert page.locator("#live-chunks li").count() == 1


def test_small_media_keep_their_shape_when_scaled(servers, page):
    """fitPixels on a 96x80 still: the largest whole factor that fits the room, the aspect ratio kept."""
    server, _ = servers
    page.goto(server.url)
    page.evaluate("""async () => {
        const { fitPixels } = await import("./static/ui.js");
        const canvas = Object.assign(document.createElement("canvas"), { width: 96, height: 80 });
        const blob = await new Promise((resolve) => canvas.toBlob(resolve));
        const box = document.createElement("div");
        box.style.width = "500px";
        const img = fitPixels(Object.assign(document.createElement("img"), { id: "probe", alt: "" }), 480);
        box.append(img);
        document.body.prepend(box);
        img.src = URL.createObjectURL(blob);
    }""")
    # 5 x 96 = 480 fits the 500 px box (6 x 80 = 480 would fit the height). The page's own stills and
    # clips are checked for crisp pixels in the job test; this one is outside the styled elements.
    assert_pixel_scaled(page, "#probe", 5, crisp=False)


def test_gallery_shows_loading_then_the_list_or_the_error(servers, page):
    server, _ = servers
    with urllib.request.urlopen(f"{server.url}/v1/videos?limit=10") as response:
        count = len(json.load(response)["data"])
    held = []  # the list requests, kept waiting until the test lets them go
    is_list = lambda url: urlsplit(url).path == "/v1/videos"  # noqa: E731
    page.route(is_list, lambda route: held.append(route))
    page.goto(server.url)
    rows = "#gallery-rows"
    eventually(lambda: page.wait_for_timeout(10) or held, what="the gallery's list request")  # waiting lets routes run
    assert page.text_content(rows) == "Loading videos…"
    assert page.get_attribute(rows, "aria-busy") == "true"
    assert page.is_hidden("#gallery-error")

    for route in held:
        route.continue_()
    page.unroute(is_list)
    wait_until(page, "!document.querySelector('#gallery-rows').hasAttribute('aria-busy')")
    if count:
        assert page.locator(f"{rows} tr[data-id]").count() == count
        assert "Loading" not in page.text_content(rows)
    else:
        assert page.text_content(rows) == "No videos yet."

    # A list that fails to load says so, in the table and with the API's message above it.
    page.route(is_list, lambda route: route.fulfill(status=503, json={"error": {"message": "the job store is down"}}))
    page.reload()
    page.wait_for_selector("#gallery-error:not([hidden])")
    assert "the job store is down" in page.text_content("#gallery-error")
    assert page.text_content(rows) == "Could not load videos."
    assert page.get_attribute(rows, "aria-busy") is None


def test_chat_streams_an_answer(servers, page, tmp_path):
    server, _ = servers
    image = tmp_path / "frame.png"
    Image.radial_gradient("L").convert("RGB").resize((64, 64)).save(image)
    page.goto(server.url)
    wait_until(page, "document.querySelector('#chat-model').textContent.includes('vlm-tiny')")

    tab_to(page, "#chat-input")
    page.keyboard.type("What is in this picture?")
    page.set_input_files("#chat-image", str(image))  # the OS file dialog is beyond a browser test
    page.evaluate("""() => {  // record the answer's length each time the page changes it
        window.answerLengths = [];
        const log = document.querySelector('#chat-log');
        new MutationObserver(() => {
            const answer = log.querySelector('li.assistant:last-child .text');
            if (answer) window.answerLengths.push(answer.textContent.length);
        }).observe(log, {childList: true, subtree: true, characterData: true});
    }""")
    page.focus("#chat-input")
    page.keyboard.press("Enter")
    page.wait_for_selector("#chat-log li.assistant .text:not([aria-busy])")
    answer = page.text_content("#chat-log li.assistant .text")
    lengths = [n for n in page.evaluate("window.answerLengths") if n]
    assert answer and lengths[-1] == len(answer)
    assert len(set(lengths)) >= 2, f"the answer arrived in one piece, not streamed: {lengths}"
    assert page.locator("#chat-log li.user img").count() == 1
    assert page.input_value("#chat-input") == ""
    assert page.is_hidden("#chat-error")

    # An error from the API (max_tokens over the server's limit) is shown, and the message kept.
    page.fill("#chat-max", "1000000")
    page.focus("#chat-input")
    page.keyboard.type("again")
    page.keyboard.press("Enter")
    page.wait_for_selector("#chat-error:not([hidden])")
    assert "max_tokens" in page.text_content("#chat-error")
    assert page.input_value("#chat-input") == "again"
    page.screenshot(path=tmp_path / "chat.png", full_page=True)
    assert_not_blank(tmp_path / "chat.png")


def test_keyed_server_asks_for_the_key(servers, page, tmp_path):
    _, keyed = servers
    page.goto(keyed.url)
    # The job form and the gallery ask the server separately; either may answer first.
    page.wait_for_selector("#job-error:not([hidden])")
    page.wait_for_selector("#gallery-error:not([hidden])")
    assert "missing or invalid API key" in page.text_content("#job-error")
    assert "missing or invalid API key" in page.text_content("#gallery-error")
    assert page.get_attribute("#key-box", "open") is not None
    assert "needs an API key" in page.text_content("#key-status")
    page.screenshot(path=tmp_path / "key-needed.png", full_page=True)
    assert_not_blank(tmp_path / "key-needed.png")

    tab_to(page, "#api-key")
    page.keyboard.type("wrong-key")
    page.keyboard.press("Enter")
    wait_until(page, "document.querySelector('#key-status').textContent.includes('refused')")

    page.focus("#api-key")
    page.keyboard.type(KEY)
    page.keyboard.press("Enter")
    wait_until(page, "document.querySelector('#model').options.length > 1")
    wait_until(page, "document.querySelector('#gallery-rows').textContent === 'No videos yet.'")
    assert page.is_hidden("#job-error") and page.is_hidden("#gallery-error")
    assert "no chat model" in page.text_content("#chat-model")
    assert page.is_disabled("#chat-input")
    assert page.evaluate("sessionStorage.getItem('vidserve.apiKey')") == KEY
    assert page.evaluate("localStorage.getItem('vidserve.apiKey')") is None
    assert KEY not in page.url

    # The key is sent with the form's calls too: a bad size is the API's 400, not a 401.
    page.fill("#prompt", "x")
    page.fill("#size", "64x65")
    page.focus("#size")
    page.keyboard.press("Enter")
    wait_until(page, "document.querySelector('#job-error').textContent.includes('multiples of 16')")


def test_a_keyed_server_downloads_with_the_key_and_no_snippet_holds_it(servers, page):
    """A link cannot send the key: with one, the page fetches the file with it and saves it. The
    copied requests read the key from $VIDSERVE_API_KEY, never from the page."""
    _, keyed = servers
    page.add_init_script(f"sessionStorage.setItem('vidserve.apiKey', {json.dumps(KEY)})")
    page.goto(keyed.url)
    wait_until(page, "document.querySelector('#model').options.length > 1")
    page.fill("#prompt", "a fox")
    page.select_option("#model", "wan-tiny")
    for field, value in (("#size", "64x64"), ("#seconds", "1"), ("#steps", "2")):
        page.fill(field, value)
    page.click("#generate")
    page.wait_for_selector("#live:not([hidden])")
    video_id = page.text_content("#live-id")
    wait_until(page, "document.querySelector('#live-status').textContent.startsWith('completed')")
    with page.expect_download() as saved:
        page.click("#live-download")
    assert saved.value.suggested_filename == f"{video_id}.mp4"
    assert Path(saved.value.path()).read_bytes()[4:8] == b"ftyp"
    snippets = page.text_content("#snippet-curl") + page.text_content("#snippet-python")
    assert KEY not in snippets and '-H "Authorization: Bearer $VIDSERVE_API_KEY"' in snippets


def test_videos_play_from_presigned_storage_urls(seaweedfs, browser, tmp_path):
    """With S3 storage and content redirects, the page's media fetches follow the 307 to the
    bucket (which the page's policy allows, and only it), with the key sent to the API only."""
    env = {"VIDSERVE_STORAGE": f"s3://{TEST_BUCKET}/playground-{secrets.token_hex(6)}",
           "VIDSERVE_S3_ENDPOINT_URL": seaweedfs.endpoint, "VIDSERVE_CONTENT_REDIRECT": "1"}
    server = Server(tmp_path / "data", env=env, extra=["--api-key", KEY, "--chat-model", ""]).start()
    try:
        auth = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=server.url, headers=auth, timeout=30) as http:
            video = http.post("/v1/videos", json={"model": "wan-tiny", "prompt": "a fox", "size": "64x64",
                                                  "seconds": "2", "num_inference_steps": 2}).json()
            eventually(lambda: http.get(f"/v1/videos/{video['id']}").json()["status"] == "completed",
                       what="the video to complete")
            redirect = http.get(f"/v1/videos/{video['id']}/content")
            assert redirect.status_code == 307 and redirect.headers["location"].startswith(seaweedfs.endpoint)
            csp = http.get("/").headers["content-security-policy"]
            assert f"connect-src 'self' {seaweedfs.endpoint};" in csp

        context = browser.new_context(viewport={"width": 1280, "height": 1000})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        errors, storage_requests = [], []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("request", lambda request: request.url.startswith(seaweedfs.endpoint)
                and storage_requests.append(request.headers))
        page.add_init_script(f"sessionStorage.setItem('vidserve.apiKey', {json.dumps(KEY)})")
        page.goto(server.url)
        row = f"#gallery-rows tr[data-id='{video['id']}']"
        wait_until(page, f"(i => i && i.complete && i.naturalWidth > 0)(document.querySelector(\"{row} img\"))")
        page.click(f"{row} button")
        wait_until(page, "(v => v.readyState >= 2 && v.duration > 0)(document.querySelector('#live-video'))")
        assert not errors, errors
        assert len(storage_requests) >= 2  # the thumbnail and the video, each fetched from the bucket
        assert all("authorization" not in headers for headers in storage_requests)  # the key stays with the API
        context.close()
    finally:
        server.stop()


def test_the_form_applies_a_chosen_adapter(browser, tmp_path):
    (tmp_path / "loras" / "tiny-style").mkdir(parents=True)
    random_lora(tmp_path / "loras" / "tiny-style", seed=5)
    server = Server(tmp_path / "data", extra=["--lora-dir", str(tmp_path / "loras"), "--chat-model", ""]).start()
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        page.goto(server.url)
        wait_until(page, "[...document.querySelector('#lora').options].some(o => o.value === 'tiny-style')")
        page.fill("#prompt", "a fox")
        page.select_option("#model", "wan-tiny")
        page.select_option("#lora", "tiny-style")
        page.fill("#lora-scale", "0.5")
        page.fill("#steps", "2")
        page.click("#generate")
        page.wait_for_selector("#live:not([hidden])")
        video_id = page.text_content("#live-id")
        wait_until(page, "document.querySelector('#live-status').textContent.startsWith('completed')")
        with urllib.request.urlopen(f"{server.url}/v1/videos/{video_id}") as response:
            video = json.load(response)
        assert video["loras"] == [{"name": "tiny-style", "scale": 0.5, "target": "both"}]
        # The playground's own process ran it, so the adapter now shows as loaded.
        with urllib.request.urlopen(f"{server.url}/v1/loras") as response:
            assert {a["id"]: a["loaded"] for a in json.load(response)["data"]}["tiny-style"] is True
    finally:
        context.close()
        server.stop()
