"""What a user reads is what matters: a 1-second clip's event stream sends the whole video
object on status changes and small typed updates between them, and `vidserve export-tiny`
prints the folder it wrote and nothing of the libraries it loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from apps import app_client

from vidserve.jobs.video_object import VideoObject, VideoProgress

STREAM_BUDGET = 5000  # bytes for a 1-second clip; whole objects on every step made it about 20 KB


@pytest.fixture(scope="module")
def one_second_stream(tmp_path_factory):
    """A 1-second wan-tiny clip's event stream, read to its end: (its bytes, its events)."""
    with app_client(tmp_path_factory.mktemp("events")) as (client, _):
        created = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "a red circle moving left",
                                                  "seconds": 1})
        assert created.status_code == 200, created.text
        with client.stream("GET", f"/v1/videos/{created.json()['id']}/events") as stream:
            raw = b"".join(stream.iter_bytes())
    events = []
    for block in raw.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if not line.startswith(":"))
        if fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return raw, events


def test_a_one_second_clip_streams_in_under_5_kb(one_second_stream):
    raw, events = one_second_stream
    assert len(raw) < STREAM_BUDGET, (len(raw), [(kind, len(json.dumps(data))) for kind, data in events])
    assert events[-1][0] == "video.completed"


def test_the_whole_object_comes_only_with_status_changes(one_second_stream):
    _, events = one_second_stream
    statuses = [kind for kind, _ in events if kind not in ("video.progress", "video.chunk")]
    assert statuses[-1] == "video.completed" and len(statuses) == len(set(statuses)), statuses
    for kind, data in events:
        if kind in statuses:
            assert VideoObject.model_validate(data).status == kind.removeprefix("video.")
    updates = [data for kind, data in events if kind == "video.progress"]
    assert updates, [kind for kind, _ in events]
    for data in updates:
        # Typed and small: what moved, never the object's other fields.
        assert set(data) <= set(VideoProgress.model_fields) and {"progress", "steps_done"} <= set(data), data
    steps = [data["steps_done"] for data in updates]
    assert steps == sorted(steps) and [data["progress"] for data in updates] == sorted(d["progress"] for d in updates)


def test_export_tiny_prints_only_the_folder_it_wrote(tmp_path):
    folder = tmp_path / "wan-tiny"
    result = subprocess.run([sys.executable, "-m", "vidserve.cli", "export-tiny", str(folder)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == f"{folder}\n" and result.stderr == "", result.stderr
    assert (folder / "model_index.json").exists()
