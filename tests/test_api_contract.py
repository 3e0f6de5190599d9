"""The Videos API contract, run through real server processes on loopback against each
topology (embedded queue; Celery + Redis on one machine; two API processes and two workers
sharing only Redis and an S3 bucket, reached through a round-robin balancer), with the
official OpenAI SDK where it applies."""

from __future__ import annotations

import io
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import openai
import pytest
from PIL import Image
from polling import eventually

from vidserve.media import ffmpeg_exe, read_video
from vidserve.webhooks import verify

# The SDK marks its videos methods deprecated (OpenAI's own service); they still speak the API.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SMALL = {"model": "wan-tiny", "size": "64x64"}


@pytest.fixture
def client(backend):
    return openai.OpenAI(base_url=f"{backend.url}/v1", api_key="unused-on-loopback", max_retries=0,
                         http_client=httpx.Client(transport=backend.transport()))


@pytest.fixture
def http(backend):
    with httpx.Client(base_url=backend.url, timeout=30, transport=backend.transport()) as c:
        yield c


def wait_for(http, video_id, statuses=("completed", "failed", "cancelled"), timeout=120):
    def reached() -> dict:
        video = http.get(f"/v1/videos/{video_id}").json()
        assert video["status"] in statuses, f"{video_id} still {video['status']}"
        return video

    return eventually(reached, timeout=timeout, what=f"{video_id} to be {' or '.join(statuses)}")


def test_openai_sdk_round_trip(client, backend, tmp_path):
    video = client.videos.create(model="wan-tiny", prompt="a red fox in snow", seconds="2", size="64x64")
    assert video.object == "video" and video.status == "queued" and video.seconds == "2" and video.size == "64x64"
    video = eventually(lambda: (v := client.videos.retrieve(video.id)).status in ("completed", "failed") and v,
                       what="the SDK to see the video finish")
    assert video.status == "completed" and video.progress == 100 and video.completed_at >= video.created_at
    assert video.id in [v.id for v in client.videos.list()]
    client.videos.download_content(video.id, variant="video").write_to_file(tmp_path / "fox.mp4")
    frames, fps = read_video(tmp_path / "fox.mp4")
    assert frames.shape == (33, 64, 64, 3) and fps == 16
    thumbnail = client.videos.download_content(video.id, variant="thumbnail").read()
    assert thumbnail[:4] == b"RIFF" and thumbnail[8:12] == b"WEBP"
    # The video, its stills, and its stream (the init segment and its one chunk's segment).
    assert {name.rsplit("/", 1)[-1] for name in backend.stored_files(video.id)} == {
        "video.mp4", "thumbnail.webp", "spritesheet.jpg", "init.mp4", "0.m4s"}
    deleted = client.videos.delete(video.id)
    assert deleted.deleted and deleted.id == video.id
    with pytest.raises(openai.NotFoundError):
        client.videos.retrieve(video.id)
    assert backend.stored_files(video.id) == []


def test_an_uploaded_first_frame_and_a_byte_range(http, backend, tmp_path):
    if backend.models is not None and "wan-tiny-i2v" not in backend.models:
        pytest.skip("no worker of this topology holds the image-to-video model")
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (250, 20, 20)).save(buffer, format="PNG")
    job = http.post("/v1/videos", data={**SMALL, "model": "wan-tiny-i2v", "prompt": "a red wall", "seconds": "1",
                                        "num_inference_steps": "2"},
                    files={"input_reference": ("first.png", buffer.getvalue(), "image/png")})
    assert job.status_code == 200, job.text
    assert job.json()["has_input_reference"]
    assert wait_for(http, job.json()["id"])["status"] == "completed"
    assert "input.png" in {name.rsplit("/", 1)[-1] for name in backend.stored_files(job.json()["id"])}
    url = f"/v1/videos/{job.json()['id']}/content"
    whole = http.get(url).content
    (tmp_path / "video.mp4").write_bytes(whole)
    assert read_video(tmp_path / "video.mp4")[0].shape == (17, 64, 64, 3)
    ranged = http.get(url, headers={"Range": "bytes=100-999"})
    assert ranged.status_code == 206 and ranged.content == whole[100:1000]
    assert ranged.headers["content-range"] == f"bytes 100-999/{len(whole)}"


def test_progress_streams_in_order(http):
    job = http.post("/v1/videos", json={**SMALL, "prompt": "a slow fox", "size": "128x128", "num_frames": 33,
                                        "num_inference_steps": 100}).json()
    events = []
    with http.stream("GET", f"/v1/videos/{job['id']}/events", timeout=120) as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                events.append((kind, json.loads(line[len("data: "):])))
    assert [data["index"] for kind, data in events if kind == "video.chunk"] == [0]
    events = [(kind, data) for kind, data in events if kind.startswith("video.") and kind != "video.chunk"]
    kinds = [k for k, _ in events]
    progress = [data["progress"] for _, data in events]
    assert kinds[-1] == "video.completed" and progress[-1] == 100
    assert "video.in_progress" in kinds and "video.progress" in kinds
    assert progress == sorted(progress)
    assert len({p for p in progress if 0 < p < 100}) >= 3, progress


def test_cancel_stops_a_running_job_within_a_step_and_the_next_starts(http):
    long = http.post("/v1/videos", json={**SMALL, "prompt": "a long fox", "size": "256x256", "num_frames": 81,
                                         "num_inference_steps": 100}).json()
    short = http.post("/v1/videos", json={**SMALL, "prompt": "a short fox", "num_frames": 9,
                                          "num_inference_steps": 2}).json()

    def past_five_percent() -> dict:
        running = http.get(f"/v1/videos/{long['id']}").json()
        if running["status"] not in ("queued", "in_progress"):  # final: fail now, where an assert would be retried
            pytest.fail(f"the long job ended before it could be cancelled: {running}")
        assert running["progress"] >= 5, running
        return running

    eventually(past_five_percent, timeout=60, interval=0.02, what="the long job to pass 5%")
    cancelling = http.post(f"/v1/videos/{long['id']}/cancel").json()
    assert cancelling["status"] == "in_progress"
    final = wait_for(http, long["id"], timeout=30)
    assert final["status"] == "cancelled"
    assert final["progress"] - cancelling["progress"] <= 2  # one step is ~1 point of 100 steps
    assert wait_for(http, short["id"])["status"] == "completed"
    again = http.post(f"/v1/videos/{long['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "video_not_cancellable"
    assert http.get(f"/v1/videos/{long['id']}/content").status_code == 409


def test_remix_keeps_parameters_and_seed(http, tmp_path):
    source = http.post("/v1/videos", json={**SMALL, "prompt": "a fox", "num_frames": 9, "seed": 42,
                                           "num_inference_steps": 2}).json()
    assert wait_for(http, source["id"])["status"] == "completed"
    remix = http.post(f"/v1/videos/{source['id']}/remix", json={"prompt": "a wolf"}).json()
    assert remix["remixed_from_video_id"] == source["id"] and remix["prompt"] == "a wolf"
    for field in ("seed", "size", "num_frames", "fps", "num_inference_steps", "guidance_scale", "model"):
        assert remix[field] == source[field]
    assert wait_for(http, remix["id"])["status"] == "completed"
    a = http.get(f"/v1/videos/{source['id']}/content").content
    b = http.get(f"/v1/videos/{remix['id']}/content").content
    (tmp_path / "a.mp4").write_bytes(a)
    (tmp_path / "b.mp4").write_bytes(b)
    assert not np.array_equal(read_video(tmp_path / "a.mp4")[0], read_video(tmp_path / "b.mp4")[0])


def test_idempotency_key(http):
    body = {**SMALL, "prompt": "once", "num_frames": 5, "num_inference_steps": 1}
    first = http.post("/v1/videos", json=body, headers={"Idempotency-Key": "k-1"}).json()
    second = http.post("/v1/videos", json=body, headers={"Idempotency-Key": "k-1"}).json()
    assert first["id"] == second["id"]
    other = http.post("/v1/videos", json={**body, "prompt": "twice"}, headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 422 and other.json()["error"]["param"] == "Idempotency-Key"


def test_list_pages_with_cursor(http, client):
    ids = [http.post("/v1/videos", json={**SMALL, "prompt": f"page {i}", "num_frames": 5,
                                         "num_inference_steps": 1}).json()["id"] for i in range(3)]
    page = http.get("/v1/videos", params={"limit": 2}).json()
    assert page["object"] == "list" and page["has_more"] and [v["id"] for v in page["data"]] == ids[::-1][:2]
    assert page["first_id"] == ids[2] and page["last_id"] == ids[1]
    rest = http.get("/v1/videos", params={"limit": 2, "after": page["last_id"]}).json()
    assert rest["data"][0]["id"] == ids[0]
    oldest_first = [v.id for v in client.videos.list(order="asc", limit=1)]  # SDK auto-pagination
    assert oldest_first.index(ids[0]) < oldest_first.index(ids[1]) < oldest_first.index(ids[2])


def test_delete_cancels_a_running_job_and_removes_its_files(http, backend):
    job = http.post("/v1/videos", json={**SMALL, "prompt": "doomed", "size": "256x256", "num_frames": 81,
                                        "num_inference_steps": 100}).json()
    wait_for(http, job["id"], statuses=("in_progress",))
    assert http.delete(f"/v1/videos/{job['id']}").json() == {"id": job["id"], "object": "video.deleted",
                                                             "deleted": True}
    assert http.get(f"/v1/videos/{job['id']}").status_code == 404
    follow = http.post("/v1/videos", json={**SMALL, "prompt": "next", "num_frames": 5, "num_inference_steps": 1})
    assert wait_for(http, follow.json()["id"])["status"] == "completed"
    # The API removes the files at once, but the worker can still write a chunk before its next step
    # stops it, and removes that as it stops.
    eventually(lambda: backend.stored_files(job["id"]) == [], timeout=30,
               what=f"the files of deleted {job['id']} to be gone")


class _Receiver(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        self.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def webhook_url():
    """A receiver on loopback for the test's webhooks; what it got is in `_Receiver.received`."""
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    _Receiver.received = []
    yield f"http://127.0.0.1:{receiver.server_port}/hook"
    receiver.shutdown()


def test_webhook_is_signed_and_delivered(http, backend, webhook_url):
    job = http.post("/v1/videos", json={**SMALL, "prompt": "hooked", "num_frames": 5,
                                        "num_inference_steps": 1, "webhook_url": webhook_url}).json()
    wait_for(http, job["id"])
    eventually(lambda: _Receiver.received, what="the webhook to arrive")
    headers, body = _Receiver.received[0]
    secret = backend.webhook_secret()
    assert verify(secret, headers, body)
    event = json.loads(body)
    assert event["type"] == "video.completed" and event["data"]["id"] == job["id"]
    assert headers["webhook-id"] == event["id"]


def test_a_webhook_subscribed_to_chunks_hears_each_segment(http, backend, webhook_url):
    job = http.post("/v1/videos", json={**SMALL, "prompt": "heard", "seconds": 6, "num_inference_steps": 1,
                                        "webhook_url": webhook_url,
                                        "webhook_events": ["video.chunk", "video.completed"]})
    assert job.status_code == 200, job.text
    video_id = job.json()["id"]
    wait_for(http, video_id)
    eventually(lambda: len(_Receiver.received) == 4, what="three chunk events and the end")
    events = [json.loads(body) for _, body in _Receiver.received]
    assert [e["type"] for e in events] == ["video.chunk"] * 3 + ["video.completed"]
    assert [(e["data"]["index"], e["data"]["segment"]) for e in events[:3]] == \
        [(i, f"/v1/videos/{video_id}/stream/{i}.m4s") for i in range(3)]
    assert all(verify(backend.webhook_secret(), headers, body) for headers, body in _Receiver.received)


def test_metrics_count_jobs(http):
    job = http.post("/v1/videos", json={**SMALL, "prompt": "counted", "num_frames": 5,
                                        "num_inference_steps": 1}).json()
    wait_for(http, job["id"])
    text = http.get("/metrics").text
    completed = [line for line in text.splitlines() if line.startswith('vidserve_jobs{status="completed"}')]
    assert completed and float(completed[0].split()[-1]) >= 1
    assert "vidserve_queue_depth" in text


def test_long_video_streams_chunks_as_they_finish(http, tmp_path):
    job = http.post("/v1/videos", json={**SMALL, "prompt": "a long walk", "seconds": 6,
                                        "num_inference_steps": 100, "prompts": ["a walk", "a run"]}).json()
    assert job["num_frames"] == 97 and job["prompts"] == ["a walk", "a run"]
    chunk_events, first_chunk_checked = [], False
    with http.stream("GET", f"/v1/videos/{job['id']}/events", timeout=180) as stream:
        kind = None
        for line in stream.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: ") and kind == "video.chunk":
                event = json.loads(line[len("data: "):])
                chunk_events.append(event["index"])
                if not first_chunk_checked:
                    # Chunk 1 downloads while chunk 2 is still being generated.
                    content = http.get(event["url"])
                    assert content.status_code == 200
                    assert http.get(f"/v1/videos/{job['id']}").json()["status"] == "in_progress"
                    (tmp_path / "chunk0.mp4").write_bytes(content.content)
                    first_chunk_checked = True
    assert chunk_events == [0, 1, 2]
    assert read_video(tmp_path / "chunk0.mp4")[0].shape[0] == 33
    done = http.get(f"/v1/videos/{job['id']}").json()
    assert done["status"] == "completed" and done["attempts"] == 1
    assert [c["frames"] for c in done["chunks"]] == [33, 32, 32]
    assert all("luma_change" in c["drift"] for c in done["chunks"])
    (tmp_path / "all.mp4").write_bytes(http.get(f"/v1/videos/{job['id']}/content").content)
    assert read_video(tmp_path / "all.mp4")[0].shape[0] == 97
    missing = http.get(f"/v1/videos/{job['id']}/content", params={"variant": "chunk", "index": 7})
    assert missing.status_code == 404


def test_extend_a_completed_video_and_an_uploaded_one(client, http, tmp_path):
    source = client.videos.create(model="wan-tiny", prompt="a fox", seconds="2", size="64x64")
    source = wait_for(http, source.id)
    # The SDK's extend() cannot send video={"id": ...} itself (its multipart encoder takes only
    # files there), so the reference goes in extra_body, as the SDK's own escape hatch allows.
    extension = client.videos.extend(prompt="the fox runs", seconds="2", video=openai.omit,
                                     extra_body={"video": {"id": source["id"]}})
    assert extension.extends_video_id == source["id"] and extension.seconds == "4"
    done = wait_for(http, extension.id)
    assert done["status"] == "completed" and done["num_frames"] == 33 + 32
    client.videos.download_content(source["id"]).write_to_file(tmp_path / "source.mp4")
    client.videos.download_content(extension.id).write_to_file(tmp_path / "extended.mp4")
    original, extended = read_video(tmp_path / "source.mp4")[0], read_video(tmp_path / "extended.mp4")[0]
    assert extended.shape[0] == 65
    assert np.abs(extended[:33].astype(int) - original).mean() < 4  # the source, re-encoded once
    # Continuous at the seam: the first new frame follows the source's last frame.
    seam = np.abs(extended[33].astype(int) - extended[32]).mean()
    inside = np.abs(extended[40].astype(int) - extended[39]).mean()
    assert seam < 3 * inside + 10

    uploaded = client.videos.extend(prompt="and stops", seconds="1", video=(tmp_path / "extended.mp4").open("rb"),
                                    extra_body={"model": "wan-tiny"})
    done = wait_for(http, uploaded.id)
    assert done["status"] == "completed" and done["num_frames"] == 65 + 16 and done["seconds"] == "5"
    bad = http.post("/v1/videos/extensions", data={"prompt": "x", "seconds": "1"},
                    files={"video": ("a.mp4", b"not a video", "video/mp4")})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "video"


def test_a_video_streams_from_any_api_process_until_deleted(backend, tmp_path):
    """Made through one API process, streamed (HLS) from another: the segments are in the
    shared storage (the bucket, on several machines), and deleting the video removes them."""
    made_on, streamed_from = backend.servers[0].url, backend.servers[-1].url
    with httpx.Client(base_url=made_on, timeout=30) as first, httpx.Client(base_url=streamed_from, timeout=30) as other:
        video = first.post("/v1/videos", json={**SMALL, "prompt": "far away", "seconds": 6,
                                               "num_inference_steps": 2}).json()
        done = wait_for(other, video["id"])
        assert done["status"] == "completed" and done["num_frames"] == 97
        stored = [path.rsplit("/", 2)[-2:] for path in backend.stored_files(video["id"])]
        assert [["stream", name] for name in ("0.m4s", "1.m4s", "2.m4s", "init.mp4")] == \
            sorted(p for p in stored if p[0] == "stream")
        run = subprocess.run([ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", streamed_from + done["stream_url"],
                              "-f", "rawvideo", "-pix_fmt", "rgb24", "-"], capture_output=True, timeout=120)
        assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
        streamed = np.frombuffer(run.stdout, np.uint8).reshape(-1, 64, 64, 3)
        (tmp_path / "video.mp4").write_bytes(first.get(f"/v1/videos/{video['id']}/content").content)
        assert np.array_equal(streamed, read_video(tmp_path / "video.mp4")[0])  # the same encoded frames
        first.delete(f"/v1/videos/{video['id']}")
        assert other.get(done["stream_url"]).status_code == 404
        assert other.get(f"/v1/videos/{video['id']}/stream/0.m4s").status_code == 404
    eventually(lambda: backend.stored_files(video["id"]) == [], timeout=30, what="the stream's files to be gone")
