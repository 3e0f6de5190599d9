"""README.md's examples are true: every ```bash, ```sh and ```python block in it runs, in
order, against a real server, unless the line above it says `<!-- not run: REASON -->`.

The blocks run as the README says (commands from the virtualenv on PATH, `examples/` beside
them, the server at VIDSERVE_URL) in a temporary directory, with the README's own switch to
fast settings: VIDSERVE_DEFAULT_MODEL=wan-tiny-ti2v, a random-weight model that takes an
image like wan-shapes does. The chat examples get the real vlm-shapes, the server's default.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from servers import Server

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"^(?:<!-- not run: (?P<reason>.*?) -->\n)?```(?P<lang>bash|sh|python)\n(?P<code>.*?)^```$",
                   re.M | re.S)
RUN = {"bash": ["bash", "-e", "-c"], "sh": ["sh", "-e", "-c"], "python": [sys.executable, "-c"]}
FAST = {"VIDSERVE_DEFAULT_MODEL": "wan-tiny-ti2v"}
BLOCKS = [pytest.param(m, id=f"README.md:{README.count(chr(10), 0, m.start('lang')) + 1}") for m in BLOCK.finditer(README)]


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
    marked = [b for b in BLOCKS if b.values[0]["reason"] is not None]
    assert README.count("<!-- not run") == len(marked) and len(BLOCKS) - len(marked) >= 3


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
    for video in work.rglob("*.mp4"):  # curl writes a 409's JSON as happily as an MP4
        if before.get(video) != video.stat().st_mtime_ns:
            assert video.read_bytes()[4:8] == b"ftyp", f"{video.name} is not an MP4: {video.read_bytes()[:200]!r}"
    assert_git_status_stays_clean(work)


def assert_git_status_stays_clean(work: Path) -> None:
    """What the examples wrote in the folder they ran in (the repository root, as the README runs
    them) is all ignored by the repository's .gitignore, and each file says what it is by its suffix."""
    written = [path.relative_to(work) for path in work.rglob("*")
               if path.is_file() and path.relative_to(work).parts[0] != "examples"]
    tracked = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--verbose", "--non-matching",
                              *map(str, written)], capture_output=True, text=True).stdout.splitlines()
    shown = [line.split("\t")[-1] for line in tracked if line.startswith("::")]  # "::\tPATH": no ignore rule matched
    assert not shown, f"the README's examples leave files that git status shows: {shown}"
    assert all(path.suffix for path in written), [str(path) for path in written if not path.suffix]


def test_example_frame_is_the_shapes_world_render():
    """examples/first.png is what examples/first_frame.py renders from training/shapes_world.py."""
    from PIL import Image, ImageChops

    sys.path.insert(0, str(ROOT / "examples"))
    from first_frame import first_frame

    with Image.open(ROOT / "examples" / "first.png") as committed:
        assert ImageChops.difference(committed.convert("RGB"), first_frame()).getbbox() is None
