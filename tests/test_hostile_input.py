"""No input gets a 5xx: each hostile request below is an OpenAI-shaped 4xx (or a 503 while
the job store is away), and the server still answers /healthz afterwards."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import sqlite3
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient
from imageio_ffmpeg import get_ffmpeg_exe
from apps import app_client, idle_services
from polling import eventually
from servers import Server, free_port

from vidserve.api import submission
from vidserve.api.content import _byte_range
from vidserve.config import Settings
from vidserve.errors import echo
from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.media import VideoInfo, encode_mp4, probe_video
from vidserve.registry import resolve, resolve_local

KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}
SMALL_UPLOADS = 1 << 20  # max_upload_bytes where a test sends bodies past the cap
VIDEO = {"prompt": "a fox", "size": "64x64", "num_frames": 5, "num_inference_steps": 1}


@contextmanager
def client_for(tmp_path: Path, store=None, **settings) -> Iterator[TestClient]:
    services = idle_services(tmp_path, store=store, **settings)
    with app_client(tmp_path, services, raise_server_exceptions=False) as (client, _):
        yield client


@pytest.fixture
def client(tmp_path) -> Iterator[TestClient]:
    with client_for(tmp_path, max_upload_bytes=SMALL_UPLOADS) as client:
        yield client


def assert_openai_error(response, status: int, param: str | None = None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


def assert_healthy(client) -> None:
    assert client.get("/healthz").status_code == 200


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def mp4_bytes(tmp_path: Path, frames: int, size: str, fps: int = 24) -> bytes:
    """A static colour at a low bitrate: a few KB however many frames it holds."""
    path = tmp_path / f"colour-{frames}-{size}.mp4"
    subprocess.run([get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-f", "lavfi",
                    "-i", f"color=c=blue:s={size}:r={fps}", "-frames:v", str(frames), "-c:v", "libx264",
                    "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-y", str(path)], check=True)
    return path.read_bytes()


# --- 1. a non-ASCII byte in the Authorization header -----------------------------------

@pytest.mark.parametrize("header", [b"Bearer k\xe9", b"Bearer \xff\xfe", "Bearer kä".encode()])
def test_a_non_ascii_bearer_key_is_a_401(tmp_path, header):
    with client_for(tmp_path, api_keys=KEY) as client:
        for method, path in (("get", "/v1/models"), ("get", "/v1/videos"), ("post", "/v1/chat/completions")):
            response = client.request(method, path, headers={"Authorization": header}, json={})
            assert_openai_error(response, 401, code="invalid_api_key")
        assert client.get("/v1/models", headers=AUTH).status_code == 200
        assert_healthy(client)


# --- 2. JSON nested past the depth limit -------------------------------------------------

@pytest.mark.parametrize("field", ["metadata", "attention"])
@pytest.mark.parametrize("depth", [33, 500, 10_000])
def test_deep_json_in_a_json_body_is_a_400_naming_the_field(client, field, depth):
    body = f'{{"prompt": "x", "{field}": {nested(depth)}, "size": "64x64"}}'
    response = client.post("/v1/videos", content=body, headers={"content-type": "application/json"})
    assert_openai_error(response, 400, param=field, code="json_too_deep")
    assert_healthy(client)


@pytest.mark.parametrize("depth", [33, 10_000])
def test_deep_metadata_in_a_multipart_body_is_a_400_naming_it(client, depth):
    response = client.post("/v1/videos", data={"prompt": "x", "metadata": nested(depth)},
                           files={"input_reference": ("a.png", b"\x89PNG", "image/png")})
    assert_openai_error(response, 400, param="metadata", code="json_too_deep")
    response = client.post("/v1/videos/extensions", data={"prompt": "x", "seconds": "1", "attention": nested(depth)},
                           files={"video": ("v.mp4", b"not a video", "video/mp4")})
    assert_openai_error(response, 400, param="attention", code="json_too_deep")
    assert_healthy(client)


@pytest.mark.parametrize(("key", "code"), [("metadata" + "[a]" * 40, "json_too_deep"),
                                           ("loras[][name", None), ("[]", None), ("prompt[x]", None)])
def test_odd_bracketed_form_keys_are_a_400(client, key, code):
    response = client.post("/v1/videos", data={**{k: str(v) for k, v in VIDEO.items()}, key: "x"},
                           files={"input_reference": ("a.png", b"\x89PNG", "image/png")})
    assert_openai_error(response, 400, code=code)
    assert_healthy(client)


def test_json_nested_within_the_limit_still_reads(client):
    response = client.post("/v1/videos", json={**VIDEO, "metadata": {"a": "b"}})
    assert response.status_code == 200, response.text


def test_a_deep_chat_body_is_a_400(client):
    deep_schema = {"messages": [{"role": "user", "content": "hi"}],
                   "response_format": {"type": "json_schema",
                                       "json_schema": {"name": "x", "schema": {"items": json.loads(nested(40))}}}}
    assert_openai_error(client.post("/v1/chat/completions", json=deep_schema), 400,
                        param="response_format.json_schema.schema")
    body = '{"messages": ' + nested(10_000) + "}"
    assert_openai_error(client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"}),
                        400)
    assert_healthy(client)


# --- 3. integers past what the server can use --------------------------------------------

@pytest.mark.parametrize("seed", [2**64, 2**63, -1])
def test_a_chat_seed_out_of_range_is_a_400(client, seed):
    body = {"messages": [{"role": "user", "content": "hi"}], "seed": seed}
    assert_openai_error(client.post("/v1/chat/completions", json=body), 400, param="seed")
    assert_healthy(client)


@pytest.mark.parametrize("field", ["seed", "num_inference_steps", "fps", "num_frames", "seconds", "guidance_scale"])
def test_huge_numbers_in_a_video_request_are_a_400(client, field):
    huge = 4 * 10**30 + 1  # 4k+1, so num_frames fails on its size, not its form
    for value in (huge, -huge):
        body = {**VIDEO, field: value}
        if field == "seconds":
            del body["num_frames"]
        assert_openai_error(client.post("/v1/videos", json=body), 400, param=field)
    assert_healthy(client)


# --- 4. digits that are not ASCII --------------------------------------------------------

@pytest.mark.parametrize("size", ["⁶⁴x⁶⁴", "٦٤x٦٤", "６４x６４", "1" * 5000 + "x64", "64x64x64", "x64", "64 by 64"])
def test_a_size_in_other_digits_is_a_400(client, size):
    assert_openai_error(client.post("/v1/videos", json={**VIDEO, "size": size}), 400, param="size")
    assert_healthy(client)


def test_a_plain_size_still_reads(client):
    assert client.post("/v1/videos", json={**VIDEO, "size": " 64X64 "}).status_code == 200


def test_a_range_of_thousands_of_digits_is_served_whole():
    assert _byte_range("bytes=" + "9" * 5000 + "-", 100) is None
    assert _byte_range("bytes=" + "٣" + "-", 100) is None
    assert _byte_range("bytes=10-19", 100) == (10, 19)


# --- 5. the job store away ---------------------------------------------------------------

def assert_store_unavailable(response) -> None:
    assert_openai_error(response, 503, code="store_unavailable")
    assert int(response.headers["retry-after"]) > 0


@contextmanager
def redis_server(workdir: Path, port: int) -> Iterator[subprocess.Popen]:
    """A redis-server of this test's own, so stopping it leaves the session's alone."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    with (workdir / f"redis-{port}.log").open("ab") as log:
        proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--dir", str(workdir)], cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
        def answering() -> bool:
            assert proc.poll() is None, "redis-server exited"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    assert s.recv(16).startswith(b"+PONG")
            except OSError as exc:
                raise AssertionError(f"not answering yet: {exc}") from exc
            return True

        eventually(answering, timeout=10, what=f"redis-server to answer on port {port}")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_redis_down_is_a_503_and_the_server_recovers(tmp_path):
    port = free_port()
    with client_for(tmp_path, RedisJobStore(f"redis://127.0.0.1:{port}/0")) as client:
        with redis_server(tmp_path, port) as redis:
            created = client.post("/v1/videos", json=VIDEO)
            assert created.status_code == 200, created.text
            video_id = created.json()["id"]
            redis.terminate()
            redis.wait(timeout=10)
            for response in (client.post("/v1/videos", json=VIDEO), client.get("/v1/videos"),
                             client.get(f"/v1/videos/{video_id}"), client.delete(f"/v1/videos/{video_id}"),
                             client.post(f"/v1/videos/{video_id}/remix", json={"prompt": "y"})):
                assert_store_unavailable(response)
            assert_openai_error(client.get("/readyz"), 503, code="store_unavailable")
            assert_healthy(client)
        with redis_server(tmp_path, port):  # Redis back: the same app serves again
            assert client.post("/v1/videos", json=VIDEO).status_code == 200
            assert client.get("/readyz").status_code == 200


def test_a_locked_sqlite_store_is_a_503(tmp_path):
    path = tmp_path / "jobs.sqlite"
    with client_for(tmp_path, SQLiteJobStore(path, busy_timeout_ms=100)) as client:
        assert client.post("/v1/videos", json=VIDEO).status_code == 200
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process holding the write lock
        try:
            assert_store_unavailable(client.post("/v1/videos", json=VIDEO))
            assert_healthy(client)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        assert client.post("/v1/videos", json=VIDEO).status_code == 200


# --- 6. bodies past the cap --------------------------------------------------------------

@pytest.mark.parametrize("method, path", [("post", "/v1/videos"), ("post", "/v1/videos/extensions"),
                                          ("post", "/v1/videos/abc/remix"), ("post", "/v1/chat/completions"),
                                          ("get", "/v1/videos"), ("get", "/healthz")])
def test_a_body_over_the_cap_is_a_413_on_every_route(client, method, path):
    body = b" " * (SMALL_UPLOADS + 128 * 1024)
    response = client.request(method, path, content=body, headers={"content-type": "application/json"})
    assert_openai_error(response, 413, code="file_too_large")

    def chunks():  # no Content-Length: read until the cap, then refused
        for _ in range(40):
            yield b" " * (64 * 1024)

    if method == "post":
        response = client.post(path, content=chunks(), headers={"content-type": "application/json"})
        assert_openai_error(response, 413, code="file_too_large")
    assert_healthy(client)


def test_a_body_within_the_cap_still_reads(client):
    padded = json.dumps(VIDEO) + " " * (SMALL_UPLOADS // 2)
    assert client.post("/v1/videos", content=padded, headers={"content-type": "application/json"}).status_code == 200


# --- 7. an upload to extend, probed before it is decoded ----------------------------------

def test_the_probe_reads_size_and_frames_without_decoding(tmp_path):
    assert probe_video(mp4_bytes(tmp_path, 480, "640x480")) == VideoInfo(width=640, height=480, frames=480, fps=24)
    small = encode_mp4(np.full((9, 64, 96, 3), 90, np.uint8), tmp_path / "small.mp4", fps=12).read_bytes()
    assert probe_video(small) == VideoInfo(width=96, height=64, frames=9, fps=12)


@pytest.mark.parametrize("case", ["no video", "text", "playlist", "too many frames", "too large a side"])
def test_an_upload_over_the_limits_is_refused_before_decoding(tmp_path, case):
    audio = tmp_path / "audio.mp4"
    subprocess.run([get_ffmpeg_exe(), "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i",
                    "sine=d=1", "-c:a", "aac", "-y", str(audio)], check=True)
    upload = {"no video": audio.read_bytes(), "text": b"hello",
              "playlist": b"#EXTM3U\n#EXTINF:1,\nfile:///etc/passwd\n",
              "too many frames": mp4_bytes(tmp_path, 40, "64x64"),
              "too large a side": mp4_bytes(tmp_path, 5, "640x480")}[case]
    with client_for(tmp_path, max_frames=33, max_side=320) as client:
        response = client.post("/v1/videos/extensions", data={"prompt": "more", "seconds": "1"},
                               files={"video": ("v.mp4", upload, "video/mp4")})
        assert_openai_error(response, 400, param="video", code="invalid_video")
        assert_healthy(client)


def test_an_upload_within_the_limits_is_extended(tmp_path):
    source = encode_mp4(np.full((9, 64, 96, 3), 90, np.uint8), tmp_path / "source.mp4", fps=16).read_bytes()
    with client_for(tmp_path) as client:
        response = client.post("/v1/videos/extensions", data={"prompt": "more", "seconds": "1"},
                               files={"video": ("v.mp4", source, "video/mp4")})
        assert response.status_code == 200, response.text
        assert response.json()["size"] == "96x64"


@pytest.mark.parametrize("limit", [{"max_frames": 33}, {"max_seconds": 2.5}])
def test_an_extension_past_the_limits_is_a_400_before_decoding(tmp_path, monkeypatch, limit):
    decoded = []
    monkeypatch.setattr(submission, "read_last_frame", decoded.append)
    source = mp4_bytes(tmp_path, 29, "64x64", fps=16)  # one second more: 29 + 16 frames, 2.75 s
    with client_for(tmp_path, **limit) as client:
        response = client.post("/v1/videos/extensions", data={"prompt": "more", "seconds": "1"},
                               files={"video": ("v.mp4", source, "video/mp4")})
        assert_openai_error(response, 400, param="seconds")
    assert decoded == []


# --- 8. model names are registry entries or folders in model_dirs ------------------------

def fake_model_folder(folder: Path) -> Path:
    """The configs `spec_from_folder` reads (no weights: nothing loads them here)."""
    for name, config in {"model_index.json": {"_class_name": "WanPipeline"},
                         "transformer/config.json": {"patch_size": [1, 2, 2]}, "vae/config.json": {},
                         "scheduler/scheduler_config.json": {"flow_shift": 3.0},
                         "vidserve.json": {"base": "wan-tiny"}}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(config))
    return folder


def test_model_dirs_setting_splits_on_commas_and_pathsep(tmp_path):
    settings = Settings(model_dirs=f"{tmp_path / 'a'},{tmp_path / 'b'}{os.pathsep} {tmp_path / 'c'} ")
    assert settings.model_directories == (tmp_path / "a", tmp_path / "b", tmp_path / "c")
    assert Settings().model_directories == ()


def test_a_model_names_only_the_registry_or_a_folder_in_model_dirs(tmp_path):
    models = tmp_path / "models"
    inside = fake_model_folder(models / "mytiny")
    outside = fake_model_folder(tmp_path / "elsewhere")
    (models / "not-a-model").mkdir()
    with client_for(tmp_path, model_dirs=str(models)) as client:
        for name in ("mytiny", str(inside)):  # by folder name, or the full path a job records
            response = client.post("/v1/videos", json={**VIDEO, "model": name})
            assert response.status_code == 200, response.text
            assert response.json()["model"] == str(inside.resolve())
        refused = {}
        for name in (str(outside), str(tmp_path / "no-such-folder"), "../elsewhere", "mytiny/..", ".", "/etc",
                     "/", "~", "mytiny/transformer", "my\x00tiny", "not-a-model"):
            error = assert_openai_error(client.post("/v1/videos", json={**VIDEO, "model": name}), 400,
                                        param="model", code="model_not_found")
            refused[name] = error["message"].replace(echo(name), "NAME")
        assert len(set(refused.values())) == 1, refused  # an existing path is told apart from none
        assert_healthy(client)
    with client_for(tmp_path) as client:  # no model_dirs: no folder at all
        assert_openai_error(client.post("/v1/videos", json={**VIDEO, "model": str(inside)}), 400,
                            code="model_not_found")


def test_the_cli_side_still_takes_any_folder(tmp_path):
    folder = fake_model_folder(tmp_path / "mine")
    assert resolve_local(str(folder)).source == str(folder)
    assert resolve("wan-tiny") is resolve_local("wan-tiny")
    with pytest.raises(Exception, match="unknown model"):
        resolve(str(folder))


# --- a bug is still a 500, but OpenAI-shaped ----------------------------------------------

def test_an_unexpected_error_is_a_shaped_500(tmp_path):
    services = idle_services(tmp_path)

    def broken(video_id):
        raise RuntimeError("a bug")

    services.store.get = broken
    with app_client(tmp_path, services, raise_server_exceptions=False) as (client, _):
        assert_openai_error(client.get("/v1/videos/abc"), 500, code="internal_error")
        assert_healthy(client)


# --- the same, on a real server: raw bytes, chunked uploads, memory ----------------------

@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    data = tmp_path_factory.mktemp("hostile") / "data"
    server = Server(data, env={"VIDSERVE_CHAT_MODEL": "", "VIDSERVE_API_KEYS": KEY}).start()
    try:
        yield server
    finally:
        server.stop()


def exchange(port: int, head: bytes, chunk_bytes: int = 0, total_bytes: int = 0) -> tuple[bytes, int]:
    """Send a request (a chunked body of `total_bytes`, if given) until the server answers;
    (the response, bytes of body sent by then)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head)
        sent = 0
        piece = f"{chunk_bytes:x}\r\n".encode() + b" " * chunk_bytes + b"\r\n" if chunk_bytes else b""
        while sent < total_bytes and not select.select([s], [], [], 0)[0]:
            try:
                s.sendall(piece)
            except OSError:  # it answered and closed while we were still sending
                break
            sent += chunk_bytes
        response = b""
        try:
            while not response.endswith(b"}}") and (data := s.recv(65536)):
                response += data
        except OSError:
            pass
        return response, sent


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def body_of(response: bytes) -> dict:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


def server_healthy(server: Server) -> None:
    response, _ = exchange(server.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(response) == 200, response


def _status_kb(pid: int, field: str) -> int:
    return int(Path(f"/proc/{pid}/status").read_text().split(f"{field}:")[1].split()[0])


@contextmanager
def peak_growth(pid: int) -> Iterator[list[float]]:
    """MB by which the process's peak RSS rose over what it used when the block began (the
    peak is reset first, so an older, higher peak cannot hide a new one)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pytest.skip("cannot reset the peak RSS of the server (/proc/PID/clear_refs)")
    before, grown = _status_kb(pid, "VmRSS"), []
    yield grown
    grown.append((_status_kb(pid, "VmHWM") - before) / 1024)


def test_a_real_server_refuses_a_non_ascii_key(server):
    response, _ = exchange(server.port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\xe9\r\n"
                                        b"Connection: close\r\n\r\n")
    assert status_of(response) == 401, response
    assert body_of(response)["error"]["code"] == "invalid_api_key"
    server_healthy(server)


@pytest.mark.parametrize("path", ["/v1/videos", "/v1/videos/extensions", "/v1/chat/completions"])
def test_a_real_server_stops_reading_a_chunked_body_at_the_cap(server, path):
    total = 80 * 1024 * 1024
    head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    with peak_growth(server.pid) as grown:
        response, sent = exchange(server.port, head, 64 * 1024, total)
    assert status_of(response) == 413, response
    assert body_of(response)["error"]["code"] == "file_too_large"
    assert sent < total / 2  # answered after the cap (20 MiB) plus socket buffers, not after 80 MiB
    assert grown[0] < 80, f"peak RSS grew {grown[0]:.0f} MB"  # the body up to the cap, not 80 MB of it
    server_healthy(server)


def test_a_real_server_refuses_a_small_file_of_many_large_frames_in_little_memory(server, tmp_path):
    """10 KB of MP4 holding 480 frames of 640x480: decoded whole, 440 MB. The probe finds the
    extended video past the limits before a frame is decoded."""
    upload = mp4_bytes(tmp_path, 480, "640x480")
    assert len(upload) < 32 * 1024

    def extend(video: bytes) -> bytes:
        boundary = "hostile-boundary"
        body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nmore\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"seconds\"\r\n\r\n1\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"video\"; filename=\"v.mp4\"\r\n"
                "Content-Type: video/mp4\r\n\r\n").encode() + video + f"\r\n--{boundary}--\r\n".encode()
        head = (f"POST /v1/videos/extensions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        return exchange(server.port, head + body)[0]

    warm = extend(b"not a video")  # the first upload's imports and buffers, before measuring
    assert status_of(warm) == 400, warm
    with peak_growth(server.pid) as grown:
        response = extend(upload)
    print(f"peak RSS grew {grown[0]:.1f} MB for the 480-frame 640x480 upload")
    assert status_of(response) == 400, response
    assert body_of(response)["error"]["param"] == "seconds"
    assert grown[0] < 50
    server_healthy(server)
