"""The playground plays videos while they are made, in headless Chromium against real servers:
a running job's HLS stream (Media Source Extensions, segments fetched with the key) plays before
the job ends, and a live session over the WebSocket plays as chunks arrive and is steered to a new
prompt, then stopped.

Like test_playground.py, these need Playwright and a Chromium binary, and skip without them.
Debian's Chromium decodes H.264 in Media Source Extensions; a browser that cannot shows its
error in the page, and the waits below report it."""

from __future__ import annotations

import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from polling import eventually
from servers import Server
from test_playground import browser, checked_page, page, wait_until  # noqa: F401 (fixtures, used by name)

KEY = "playground-stream-key"
# wan-tiny at 64x64: 20 s is ten chunks (33, then 32 frames at 16 fps); at 100 steps each takes a
# couple of seconds or more, so the job runs long enough to be watched while it is made.
LONG_JOB = {"#model": "wan-tiny", "#size": "64x64", "#seconds": "20", "#steps": "100"}
PLAY_SECONDS = 120  # a bound on a broken test; a loaded machine only makes the job slower
FIRST_CHUNK_SECONDS = 33 / 16


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """An open server and a keyed one, started side by side."""
    root = tmp_path_factory.mktemp("playground-stream")
    started = [Server(root / "open" / "data", extra=["--chat-model", ""]),
               Server(root / "keyed" / "data", extra=["--api-key", KEY, "--chat-model", ""])]
    for server in started:
        server.data_dir.parent.mkdir(parents=True)
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(), started))
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def http(servers):
    """HTTP clients of the open server and the keyed one, in that order, sending the key."""
    clients = [httpx.Client(base_url=s.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) for s in servers]
    yield clients
    for each in clients:
        each.close()


def open_page(page, server, key: str | None = None) -> None:
    if key:
        page.add_init_script(f"sessionStorage.setItem('vidserve.apiKey', {json.dumps(key)})")
    page.goto(server.url)
    wait_until(page, "document.querySelector('#model').options.length > 1")


def fill_form(page, prompt: str) -> None:
    page.fill("#prompt", prompt)
    for field, value in LONG_JOB.items():
        if field == "#model":
            page.select_option(field, value)
        else:
            page.fill(field, value)


# Where a live session's player is: in the result area at the top of the page, and in the window.
PLACED = """s => (el => ({inStage: document.querySelector('#stage').contains(el), top: el.getBoundingClientRect().top,
                        bottom: el.getBoundingClientRect().bottom, height: innerHeight}))(document.querySelector(s))"""


def assert_at_the_top_in_view(page, selector: str) -> None:
    placed = page.evaluate(PLACED, selector)
    assert placed["inStage"] and -1 < placed["top"] and placed["bottom"] < placed["height"] + 1, placed


def playing_past(page, player: str, error: str, seconds: float) -> None:
    """Wait until `player` has played past `seconds`; the page's error, if it shows one, is the reason it has not."""
    def played() -> bool:
        assert page.is_hidden(error), page.text_content(error)
        return page.evaluate(f"document.querySelector('{player}').currentTime > {seconds}")

    eventually(played, timeout=PLAY_SECONDS, what=f"{player} to play past {seconds} s")


def test_a_running_job_plays_its_stream_before_it_ends(servers, http, page):
    _, keyed = servers
    _, http = http
    open_page(page, keyed, KEY)
    fill_form(page, "a fox running through snow")
    page.click("#generate")
    page.wait_for_selector("#live:not([hidden])")
    video_id = page.text_content("#live-id")

    # Past the first chunk: the second segment was appended after it and plays on from it.
    playing_past(page, "#live-video", "#live-error", FIRST_CHUNK_SECONDS + 0.25)
    video = http.get(f"/v1/videos/{video_id}").json()
    assert video["status"] == "in_progress", video["status"]
    assert len(video["chunks"]) < 10
    assert "#EXT-X-ENDLIST" not in http.get(video["stream_url"]).text
    assert page.text_content("#live-status") == "in progress"
    player = page.evaluate("""(v => ({src: v.src, ranges: v.buffered.length, hidden: v.hidden}))(
        document.querySelector('#live-video'))""")
    assert player["src"].startswith("blob:") and not player["hidden"], player
    assert player["ranges"] == 1, f"the segments left gaps in the timeline: {player}"

    http.post(f"/v1/videos/{video_id}/cancel")  # seen enough: free the machine for the next test
    wait_until(page, "document.querySelector('#live-status').textContent === 'cancelled'")
    assert page.is_hidden("#live-error")


def test_a_live_session_plays_and_is_steered_to_a_new_prompt(servers, http, page):
    server, _ = servers
    http, _ = http
    open_page(page, server)
    fill_form(page, "a red square")
    page.click("#realtime summary")
    page.click("#realtime-start")
    wait_until(page, "document.querySelector('#realtime-id').textContent.startsWith('video_')")
    video_id = page.text_content("#realtime-id")

    playing_past(page, "#realtime-video", "#realtime-error", 0)
    assert http.get(f"/v1/videos/{video_id}").json()["status"] == "in_progress"
    assert_at_the_top_in_view(page, "#realtime-video")

    page.fill("#steer-prompt", "a blue circle")
    page.click("#steer")
    wait_until(page, "document.querySelector('#steer-status').textContent.includes('applies from chunk')")
    steered = int(re.search(r"chunk (\d+)", page.text_content("#steer-status"))[1]) - 1  # numbered from 1

    # Once the first steered chunk is made, stop: the video ends after the chunk under way.
    def steered_chunk_made() -> dict:
        video = http.get(f"/v1/videos/{video_id}").json()
        assert any(c["index"] == steered for c in video["chunks"]), video["chunks"]
        return video

    eventually(steered_chunk_made, timeout=PLAY_SECONDS, what=f"chunk {steered} of {video_id}")
    page.click("#realtime-stop")
    wait_until(page, "document.querySelector('#realtime-status').textContent.startsWith('completed')",
               timeout=PLAY_SECONDS)
    assert page.is_hidden("#realtime-error")

    video = http.get(f"/v1/videos/{video_id}").json()
    assert video["status"] == "completed"
    prompts = [c["prompt"] for c in sorted(video["chunks"], key=lambda c: c["index"])]
    assert 0 < steered < len(prompts) < 10, (steered, prompts)
    assert prompts == ["a red square"] * steered + ["a blue circle"] * (len(prompts) - steered), prompts
    # Every chunk's fragment reached the player: it holds the whole (stopped) video, in one range.
    player = page.evaluate("""(v => ({duration: v.duration, ranges: v.buffered.length}))(
        document.querySelector('#realtime-video'))""")
    assert player["ranges"] == 1 and abs(player["duration"] - video["num_frames"] / video["fps"]) < 0.1, player


def test_a_live_session_starts_on_a_keyed_server_at_the_top_of_a_phone(servers, browser):
    """At 400 px the form is far below the result area: the session's player and its steering come up
    from there, with focus in the new-prompt box."""
    _, keyed = servers
    with checked_page(browser, {"width": 400, "height": 800}) as page:
        open_page(page, keyed, KEY)
        fill_form(page, "a red square")
        page.click("#realtime summary")
        page.click("#realtime-start")
        assert_at_the_top_in_view(page, "#session .screen")
        assert page.evaluate("document.activeElement.id") == "steer-prompt"
        wait_until(page, "document.querySelector('#realtime-id').textContent || "
                         "!document.querySelector('#realtime-error').hidden")
        assert page.is_hidden("#realtime-error"), page.text_content("#realtime-error")  # closing the page cancels it
