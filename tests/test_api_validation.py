"""Bad input gets an OpenAI-shaped 4xx and never becomes a job; auth and limits."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from apps import app_client, idle_services
from PIL import Image
from polling import eventually


@pytest.fixture
def api(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path, max_upload_bytes=64 * 1024)) as (client, services):
        yield client, services


def png_bytes(size=(64, 64)):
    buffer = io.BytesIO()
    Image.new("RGB", size, (10, 200, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


BAD_JSON = {
    "unknown model": ({"model": "sora-9", "prompt": "x"}, 400, "model"),
    "bad size": ({"model": "wan-tiny", "prompt": "x", "size": "65x64"}, 400, "size"),
    "size not WxH": ({"model": "wan-tiny", "prompt": "x", "size": "big"}, 400, "size"),
    "frames not 4k+1": ({"model": "wan-tiny", "prompt": "x", "num_frames": 30}, 400, "num_frames"),
    "seconds not a number": ({"model": "wan-tiny", "prompt": "x", "seconds": "four"}, 400, "seconds"),
    "too long": ({"model": "wan-tiny", "prompt": "x", "seconds": "600"}, 400, "seconds"),
    "zero steps": ({"model": "wan-tiny", "prompt": "x", "num_inference_steps": 0}, 400, "num_inference_steps"),
    "empty prompt": ({"model": "wan-tiny", "prompt": ""}, 400, "prompt"),
    "prompt over the limit": ({"model": "wan-tiny", "prompt": "x" * 10_001}, 400, "prompt"),
    "empty model": ({"model": "", "prompt": "x"}, 400, "model"),
    "no prompt": ({"model": "wan-tiny"}, 400, "prompt"),
    "unknown field": ({"model": "wan-tiny", "prompt": "x", "colour": "red"}, 400, "colour"),
    "i2v without image": ({"model": "wan-tiny-i2v", "prompt": "x"}, 400, "image"),
    "webhook not http": ({"model": "wan-tiny", "prompt": "x", "webhook_url": "file:///etc/passwd"}, 400,
                         "webhook_url"),
    "unknown attention mode": ({"model": "wan-tiny", "prompt": "x", "attention": {"mode": "radial"}}, 400,
                               "attention.mode"),
    "density above 1": ({"model": "wan-tiny", "prompt": "x", "attention": {"density": 2}}, 400,
                         "attention.density"),
    "tile the GPU kernel cannot run": ({"model": "wan-tiny", "prompt": "x", "attention": {"tile": [4, 8, 8]}}, 400,
                                       "attention.tile"),
    "attention not an object": ({"model": "wan-tiny", "prompt": "x", "attention": "topk"}, 400, "attention"),
    "bad data url": ({"model": "wan-tiny-i2v", "prompt": "x", "input_reference": {"image_url": "data:image/png;"
                                                                                  "base64,@@@"}}, 400,
                     "input_reference"),
}


def assert_openai_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    if param:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("case", list(BAD_JSON))
def test_bad_json_fields(api, case):
    client, services = api
    body, status, param = BAD_JSON[case]
    assert_openai_error(client.post("/v1/videos", json=body), status, param)
    assert services.store.list()[0] == []  # nothing was queued, so nothing reaches a worker


def test_malformed_json(api):
    client, services = api
    response = client.post("/v1/videos", content=b'{"prompt": "x",', headers={"content-type": "application/json"})
    assert assert_openai_error(response, 400)["code"] == "invalid_json"
    response = client.post("/v1/videos", content=b'["a list"]', headers={"content-type": "application/json"})
    assert_openai_error(response, 400)
    assert services.store.list()[0] == []


def test_non_image_upload(api):
    client, services = api
    response = client.post("/v1/videos", data={"model": "wan-tiny-i2v", "prompt": "x"},
                           files={"input_reference": ("cat.png", b"%PDF-1.4 not an image", "image/png")})
    assert "could not read image" in assert_openai_error(response, 400, "image")["message"]
    assert services.store.list()[0] == []


def test_oversize_upload(api):
    client, services = api
    big = b"\x89PNG" + bytes(200 * 1024)
    response = client.post("/v1/videos", data={"model": "wan-tiny-i2v", "prompt": "x"},
                           files={"input_reference": ("big.png", big, "image/png")})
    assert assert_openai_error(response, 413)["code"] == "file_too_large"
    assert services.store.list()[0] == []


def test_image_for_text_only_model(api):
    client, _ = api
    response = client.post("/v1/videos", data={"model": "wan-tiny", "prompt": "x"},
                           files={"input_reference": ("a.png", png_bytes(), "image/png")})
    assert_openai_error(response, 400, "image")


def test_multipart_with_image_is_accepted(api):
    client, services = api
    response = client.post("/v1/videos", data={"model": "wan-tiny-i2v", "prompt": "x", "size": "64x64",
                                               "num_frames": "5", "num_inference_steps": "1",
                                               "metadata": '{"team": "a"}'},
                           files={"input_reference": ("a.png", png_bytes((80, 48)), "image/png")})
    assert response.status_code == 200, response.text
    video = response.json()
    assert video["has_input_reference"] and video["metadata"] == {"team": "a"} and video["num_frames"] == 5
    job = services.store.get(video["id"])
    assert services.storage.exists(job.input_image_key)


def test_unknown_video_and_variant(api):
    client, _ = api
    assert assert_openai_error(client.get("/v1/videos/video_nope"), 404)["code"] == "not_found"
    assert_openai_error(client.get("/v1/videos/video_nope/content?variant=../video"), 400, "variant")
    assert_openai_error(client.post("/v1/videos/video_nope/cancel"), 404)
    assert_openai_error(client.delete("/v1/videos/video_nope"), 404)
    assert_openai_error(client.get("/v1/videos?after=video_nope"), 400, "after")
    assert_openai_error(client.get("/v1/videos?limit=0"), 400, "limit")


def test_full_queue_answers_429_with_retry_after(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path, max_queued=2)) as (client, _):  # no worker: jobs stay queued
        body = {"model": "wan-tiny", "prompt": "x", "num_frames": 5, "num_inference_steps": 1}
        assert client.post("/v1/videos", json=body).status_code == 200
        assert client.post("/v1/videos", json=body).status_code == 200
        response = client.post("/v1/videos", json=body)
    assert assert_openai_error(response, 429)["code"] == "queue_full"
    assert int(response.headers["retry-after"]) > 0


def test_api_keys(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path, api_keys="k1, k2")) as (client, _):
        assert client.get("/healthz").status_code == 200
        error = assert_openai_error(client.get("/v1/models"), 401)
        assert error["code"] == "invalid_api_key"
        assert_openai_error(client.get("/v1/models", headers={"Authorization": "Bearer nope"}), 401)
        assert client.get("/v1/models", headers={"Authorization": "Bearer k2"}).status_code == 200
        assert_openai_error(client.post("/v1/videos", json={"prompt": "x"}), 401)


def test_models_lists_the_registry(api):
    client, _ = api
    models = client.get("/v1/models").json()
    ids = [m["id"] for m in models["data"]]
    assert models["object"] == "list" and "wan-tiny" in ids and "Wan2.2-I2V-A14B" in ids
    assert client.get("/readyz").json()["status"] == "ready"


def test_cancelling_a_queued_job_ends_it_at_once_and_announces_it(tmp_path):
    received = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    services = idle_services(tmp_path, allow_private_urls=True)  # the receiver is on loopback; no worker
    try:
        with app_client(tmp_path, services) as (client, _):
            hook = f"http://127.0.0.1:{receiver.server_port}/"
            video = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "x", "webhook_url": hook}).json()
            cancelled = client.post(f"/v1/videos/{video['id']}/cancel").json()
            assert cancelled["status"] == "cancelled"
            eventually(lambda: received, what="the video.cancelled webhook")
    finally:
        receiver.shutdown()
    assert [(e["type"], e["data"]["id"]) for e in received] == [("video.cancelled", video["id"])]


def test_the_api_layer_does_not_import_torch():
    code = "import sys, vidserve.api.app; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
