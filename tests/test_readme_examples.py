"""The examples of README.md and of the docs/ pages are true: every ```bash, ```sh and ```python
block in them runs, in order (the README's, then each page's by name), against a real server,
unless the line above it says `<!-- not run: REASON -->`.

The blocks run as the README says (commands from the virtualenv on PATH, `examples/` beside
them, the server at VIDSERVE_URL) in a temporary directory, with the switch to fast settings
that docs/videos.md describes: VIDSERVE_DEFAULT_MODEL=wan-tiny-ti2v, a random-weight model that takes an
image like wan-shapes does. The chat examples get the real vlm-shapes, the server's default.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import httpx
import openai
import pytest
from probe import probe

from servers import Server
from vidserve.media import read_video

ROOT = Path(__file__).resolve().parents[1]
# Every page whose examples run: the README, then the docs site's pages.
PAGES = {path.relative_to(ROOT).as_posix(): path.read_text()
         for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]}
BLOCK = re.compile(r"^(?:<!-- not run: (?P<reason>.*?) -->\n)?```(?P<lang>bash|sh|python)\n(?P<code>.*?)^```$",
                   re.M | re.S)
RUN = {"bash": ["bash", "-e", "-c"], "sh": ["sh", "-e", "-c"], "python": [sys.executable, "-c"]}
FAST = {"VIDSERVE_DEFAULT_MODEL": "wan-tiny-ti2v"}
BLOCKS = [pytest.param(m, id=f"{page}:{text.count(chr(10), 0, m.start('lang')) + 1}")
          for page, text in PAGES.items() for m in BLOCK.finditer(text)]


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A working directory holding examples/, and the environment the blocks run in."""
    tmp = tmp_path_factory.mktemp("readme")
    server = Server(tmp / "data", env={**FAST, "VIDSERVE_CHAT_MODEL": "vlm-shapes"}).start(timeout=180)
    work = tmp / "work"
    work.mkdir()
    (work / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, **FAST, "VIDSERVE_URL": server.url, "VIDSERVE_DATA_DIR": str(tmp / "cli-data"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        yield work, env, server
    finally:
        server.stop()


def test_markers_sit_on_blocks():
    """A marker anywhere but just above a block would silently run nothing, or everything."""
    for page, text in PAGES.items():
        marked = [b for b in BLOCK.finditer(text) if b["reason"] is not None]
        assert text.count("<!-- not run") == len(marked), page
    assert sum(b.values[0]["reason"] is None for b in BLOCKS) >= 3


def test_each_checked_example_is_one_block_that_runs():
    """An edit that moved or marked a checked example would silently drop its check."""
    for marker in CHECKS:
        holding = [b.values[0] for b in BLOCKS if marker in b.values[0]["code"]]
        assert len(holding) == 1 and holding[0]["reason"] is None, marker


@pytest.mark.timeout(900)
@pytest.mark.parametrize("block", BLOCKS)
def test_readme_block(block, sandbox):
    if block["reason"] is not None:
        assert block["reason"].strip(), "a not-run marker must give its reason"
        pytest.skip(f"not run: {block['reason']}")
    work, env, server = sandbox
    before = {p: p.stat().st_mtime_ns for p in work.rglob("*.mp4")}
    done = subprocess.run([*RUN[block["lang"]], block["code"]], cwd=work, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"{block['code']}\n--- exit {done.returncode}:\n{done.stdout[-3000:]}" \
                                 f"\n{done.stderr[-3000:]}\n--- server log:\n{server.logs()}"
    # The SDK snippets filter OpenAI's notice about its own service, which would print at every call.
    assert "The Sora API" not in done.stderr, done.stderr[-3000:]
    for video in work.rglob("*.mp4"):  # curl writes a 409's JSON as happily as an MP4
        if before.get(video) != video.stat().st_mtime_ns:
            assert video.read_bytes()[4:8] == b"ftyp", f"{video.name} is not an MP4: {video.read_bytes()[:200]!r}"
    assert_git_status_stays_clean(work)
    for marker, check in CHECKS.items():
        if marker in block["code"]:
            check(work, server)


def newest_video(server: Server, prompt: str) -> dict:
    videos = httpx.get(f"{server.url}/v1/videos", params={"limit": 100}, timeout=30).json()["data"]
    return next(video for video in videos if video["prompt"] == prompt)


def check_outputs_example(work: Path, server: Server) -> None:
    """The Outputs example's files are what it asked for: WebM at 30 fps, MOV and PNG frames at the
    video's rate. And its list sent as the SDK writes lists, field by field, is refused, not misread."""
    video = newest_video(server, "a red circle moving right on a black background")
    asked = [("webm", 30), ("mov", video["fps"]), ("frames", video["fps"])]
    assert [(output["format"], output["fps"]) for output in video["outputs"]] == asked, video["outputs"]
    webm, mov, frames = (work / "out" / output["filename"] for output in video["outputs"])
    assert webm.read_bytes()[:4] == b"\x1a\x45\xdf\xa3" and probe(webm).codec == "vp9"  # EBML: Matroska/WebM
    assert mov.read_bytes()[4:12] == b"ftypqt  " and probe(mov).codec == "prores"  # QuickTime's brand
    assert (probe(webm).fps, probe(webm).frames) == (30, video["outputs"][0]["frames"])
    assert (probe(mov).fps, probe(mov).frames) == (video["fps"], video["num_frames"])
    with zipfile.ZipFile(frames) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        pngs = [name for name in archive.namelist() if name.endswith(".png")]
    assert manifest["fps"] == video["fps"] and len(pngs) == manifest["frames"] == video["num_frames"], manifest
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused-on-loopback")
    with pytest.raises(openai.BadRequestError) as refused, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The Sora API")  # OpenAI's notice about its own service
        client.videos.create(prompt="a red circle", seconds="1", extra_body={
            "outputs": [{"format": "webm", "fps": 30}, {"format": "mov"}, {"format": "frames"}]})
    assert refused.value.body["param"] == "outputs" and refused.value.body["code"] == "ambiguous_form_field"


def check_stream_example(work: Path, server: Server) -> None:
    """ffmpeg read the whole HLS stream: every frame of the video, not the live edge's."""
    video = newest_video(server, "a blue circle moving down on a gray background")
    assert video["status"] == "completed" and len(video["chunks"]) >= 2, video
    assert len(read_video(work / "out" / "stream.mp4")[0]) == video["num_frames"]


# A block holding the marker is checked by the function after it has run.
CHECKS = {'extra_body={"outputs": json.dumps(outputs)}': check_outputs_example,
          "out/stream.mp4": check_stream_example}


def assert_git_status_stays_clean(work: Path) -> None:
    """What the examples wrote in the folder they ran in (the repository root, as the README runs
    them) is all ignored by the repository's .gitignore, and each file says what it is by its suffix."""
    written = [path.relative_to(work) for path in work.rglob("*")
               if path.is_file() and path.relative_to(work).parts[0] != "examples"]
    tracked = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--verbose", "--non-matching",
                              *map(str, written)], capture_output=True, text=True).stdout.splitlines()
    shown = [line.split("\t")[-1] for line in tracked if line.startswith("::")]  # "::\tPATH": no ignore rule matched
    assert not shown, f"the examples leave files that git status shows: {shown}"
    assert all(path.suffix for path in written), [str(path) for path in written if not path.suffix]


def test_example_frame_is_the_shapes_world_render():
    """examples/first.png is what examples/first_frame.py renders from training/shapes_world.py."""
    from PIL import Image, ImageChops

    sys.path.insert(0, str(ROOT / "examples"))
    from first_frame import first_frame

    with Image.open(ROOT / "examples" / "first.png") as committed:
        assert ImageChops.difference(committed.convert("RGB"), first_frame()).getbbox() is None
