"""Realtime sessions, `WS /v1/realtime/video`, through the `websockets` client against a real
server process on loopback: steering a running video, stopping it, closing the socket, and
every bad message answered with an error while the session goes on."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from pathlib import Path

import httpx
import pytest
import websockets
from apps import app_client, idle_services
from polling import eventually
from servers import Server
from starlette.websockets import WebSocketDisconnect

from vidserve.media import ffmpeg_exe

TINY = {"model": "wan-tiny", "size": "64x64"}
# Four chunks of 33, 32, 32, 32 frames at 16 fps; enough steps that a chunk is not over before
# the client's message about the one before it arrives.
LONG = {**TINY, "seconds": 8, "num_inference_steps": 24}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data = tmp_path_factory.mktemp("realtime") / "data"
    server = Server(data, env={"VIDSERVE_REALTIME_MAX_SECONDS": "8", "VIDSERVE_CHAT_MODEL": ""}).start()
    yield server
    server.stop()


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime/video"


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, timeout=300))


async def receive_json(ws) -> dict:
    message = await ws.recv()
    assert isinstance(message, str), "expected a text message, got a binary one"
    return json.loads(message)


async def until(ws, kind: str, binary: list[bytes] | None = None, seen: list[dict] | None = None) -> dict:
    """Read messages until one of type `kind`; binary ones are kept in `binary`, text ones in `seen`."""
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            assert binary is not None, "a binary message where none was expected"
            binary.append(message)
            continue
        message = json.loads(message)
        assert message["type"] != "error", message
        if seen is not None:
            seen.append(message)
        if message["type"] == kind:
            return message


def decoded_frames(data: bytes, tmp_path) -> int:
    path = tmp_path / "session.mp4"
    path.write_bytes(data)
    run_ = subprocess.run([ffmpeg_exe(), "-hide_banner", "-i", str(path), "-f", "rawvideo", "-pix_fmt", "rgb24", "-"],
                          capture_output=True, check=True)
    return len(run_.stdout) // (64 * 64 * 3)


def test_a_prompt_update_steers_the_chunks_not_yet_begun(server, tmp_path):
    async def session():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.create", **LONG, "prompt": "a red square"}))
            created = await receive_json(ws)
            assert created["type"] == "video.created" and created["video"]["status"] == "queued"
            binary, seen = [], []
            first = await until(ws, "chunk.done", binary, seen)
            assert first["index"] == 0 and first["frames"] == 33
            await ws.send(json.dumps({"type": "prompt.update", "prompt": "a blue circle"}))
            updated = await until(ws, "prompt.updated", binary, seen)
            done = await until(ws, "video.completed", binary, seen)
            return created, updated, done, binary, seen

    created, updated, done, binary, seen = run(session())
    video = done["video"]
    assert video["id"] == created["video"]["id"] and video["num_frames"] == 129
    # Chunk 1 was under way when the update came: it applies from chunk 2 on.
    start = updated["from_chunk"]
    assert 1 <= start < 4, updated
    assert [c["prompt"] for c in video["chunks"]] == ["a red square"] * start + ["a blue circle"] * (4 - start)
    assert [m["index"] for m in seen if m["type"] == "chunk.done"] == [0, 1, 2, 3]
    # The init segment, then one fragment per chunk; together, the whole video.
    assert len(binary) == 5
    assert decoded_frames(b"".join(binary), tmp_path) == 129
    # An ordinary job: retrievable and downloadable afterwards.
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get(f"/v1/videos/{video['id']}").json()["chunks"] == video["chunks"]
        assert http.get(f"/v1/videos/{video['id']}/content").status_code == 200


def test_stop_ends_the_video_after_the_chunk_under_way(server, tmp_path):
    async def session():
        async with websockets.connect(ws_url(server)) as ws:
            # No seconds: an open-ended session, as long as VIDSERVE_REALTIME_MAX_SECONDS.
            await ws.send(json.dumps({"type": "session.create", **TINY, "prompt": "on and on",
                                      "num_inference_steps": 24}))
            created = await receive_json(ws)
            binary = []
            await until(ws, "chunk.done", binary)
            await ws.send(json.dumps({"type": "session.stop"}))
            stopping = await until(ws, "session.stopping", binary)
            await ws.send(json.dumps({"type": "prompt.update", "prompt": "too late"}))
            refused = await until_error(ws, binary)
            done = await until(ws, "video.completed", binary)
            with pytest.raises(websockets.ConnectionClosedOK):
                await ws.recv()  # the server closes once the video has ended
            return created, stopping, refused, done, binary

    created, stopping, refused, done, binary = run(session())
    assert created["video"]["num_frames"] == 129 and created["video"]["seconds"] == "8"
    assert refused["code"] == "session_stopped"
    video = done["video"]
    made = stopping["after_chunks"]
    assert 1 <= made < 4 and len(video["chunks"]) == made
    assert video["num_frames"] == sum(c["frames"] for c in video["chunks"]) < 129
    assert decoded_frames(b"".join(binary), tmp_path) == video["num_frames"]


async def until_error(ws, binary: list[bytes]) -> dict:
    while True:
        message = await ws.recv()
        if isinstance(message, bytes):
            binary.append(message)
            continue
        message = json.loads(message)
        if message["type"] == "error":
            return message


def test_closing_the_socket_cancels_the_video(server):
    async def session():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.create", **LONG, "prompt": "abandoned"}))
            return (await receive_json(ws))["video"]["id"]

    wait_cancelled(server, run(session()))


BAD_MESSAGES = [
    ("not json", "invalid_json"),
    ('["a list"]', "invalid_message"),
    ('{"type": "dance"}', "unknown_type"),
    ('{"type": "prompt.update", "prompt": "x"}', "no_session"),
    ('{"type": "session.stop"}', "no_session"),
    ('{"type": "session.create", "prompt": "x", "size": "7x7"}', None),
    ('{"type": "session.create", "prompt": "x", "seconds": 60}', None),
    ('{"type": "session.create", "prompt": "x", "unknown_field": 1}', None),
    ('{"type": "session.create", "prompt": "x", "image": "data:image/png;base64,AAAA"}', None),
]


def test_bad_messages_get_errors_and_the_session_goes_on(server):
    async def session():
        answers = []
        async with websockets.connect(ws_url(server)) as ws:
            for text, _ in BAD_MESSAGES:
                await ws.send(text)
                answers.append(await receive_json(ws))
            await ws.send(b"\x00binary")
            answers.append(await receive_json(ws))
            # Still open: a good session.create goes through, and a second one is refused.
            await ws.send(json.dumps({"type": "session.create", **TINY, "prompt": "fine", "seconds": 2,
                                      "num_inference_steps": 1}))
            created = await receive_json(ws)
            await ws.send(json.dumps({"type": "session.create", **TINY, "prompt": "again"}))
            again = await until_error(ws, [])
            await until(ws, "video.completed", [])
        return answers, created, again

    answers, created, again = run(session())
    assert all(answer["type"] == "error" and answer["message"] for answer in answers), answers
    for (text, code), answer in zip(BAD_MESSAGES, answers):
        if code is not None:
            assert answer["code"] == code, (text, answer)
    assert answers[-1]["code"] == "binary_not_accepted"
    assert [a["param"] for a in answers[5:9]] == ["size", "seconds", "unknown_field", "image"]
    assert created["type"] == "video.created"
    assert again["code"] == "session_exists"


def test_an_oversized_message_closes_with_1009_and_the_server_stays_healthy(server):
    async def session():
        async with websockets.connect(ws_url(server), max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.create", "prompt": "x" * (25 * 1024 * 1024)}))
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                await ws.recv()
            return closed.value.rcvd.code if closed.value.rcvd else closed.value.sent.code

    assert run(session()) == 1009
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200


def test_keys_quotas_and_the_queue_apply_at_session_create(tmp_path):
    """On a server with keys (its queue runs nothing here, so sessions wait): no key, no
    session; a browser's key as a subprotocol works; the key's active-job quota holds; a
    waiting session hears its place in the queue."""
    key = "key-realtime-0123456789"
    services = idle_services(tmp_path, api_keys=key, key_max_active_jobs=2)
    with app_client(tmp_path, services) as (client, _):
        with pytest.raises(WebSocketDisconnect) as refused:
            with client.websocket_connect("/v1/realtime/video") as ws:
                ws.receive_text()
        assert refused.value.code == 1008
        create = {"type": "session.create", **TINY, "prompt": "waiting", "seconds": 2}
        with client.websocket_connect("/v1/realtime/video", headers={"Authorization": f"Bearer {key}"}) as first:
            first.send_text(json.dumps(create))
            assert json.loads(first.receive_text())["type"] == "video.created"
            assert json.loads(first.receive_text()) == {"type": "video.queued", "position": 1,
                                                        "estimated_start_at": None}
            with client.websocket_connect("/v1/realtime/video", subprotocols=["vidserve", f"vidserve.key.{key}"]) \
                    as second:
                assert second.accepted_subprotocol == "vidserve"  # the key is never echoed
                second.send_text(json.dumps(create))
                assert json.loads(second.receive_text())["type"] == "video.created"
                assert json.loads(second.receive_text()) == {"type": "video.queued", "position": 2,
                                                             "estimated_start_at": None}
                second.send_text(json.dumps({"type": "prompt.update", "prompt": "still waiting"}))
                assert json.loads(second.receive_text()) == {"type": "prompt.updated", "from_chunk": 0}
                bearer = {"Authorization": f"Bearer {key}"}
                with client.websocket_connect("/v1/realtime/video", headers=bearer) as third:
                    third.send_text(json.dumps(create))
                    over = json.loads(third.receive_text())
                    assert over["type"] == "error" and over["code"] == "quota_exceeded"


def test_a_session_may_start_from_an_image_sent_as_a_data_url(tmp_path):
    image = base64.b64encode(Path("examples/first.png").read_bytes()).decode()
    with app_client(tmp_path, idle_services(tmp_path)) as (client, services):
        with client.websocket_connect("/v1/realtime/video") as ws:
            ws.send_text(json.dumps({"type": "session.create", "model": "wan-tiny-i2v", "prompt": "it moves up",
                                     "seconds": 2, "image": f"data:image/png;base64,{image}"}))
            created = json.loads(ws.receive_text())
        assert created["type"] == "video.created" and created["video"]["has_input_reference"]
        assert services.storage.exists(services.store.get(created["video"]["id"]).input_image_key)


# What once raised inside the session, dropping the socket with no close frame and leaving the
# video running: each is an error now, and the session goes on.
HOSTILE_MESSAGES = [
    ('{"type": "prompt.update", "prompt": "x", "n": ' + "1" * 5000 + "}", "invalid_json", None),  # > 4300 digits
    ("[" * 100_000, "json_too_deep", None),  # past what Python's json reader can nest
    ('{"type": "prompt.update", "prompt": "x"', "invalid_json", None),
    ('{"type": "prompt.update", "prompt": "steer \\ud800"}', "invalid_unicode", "prompt"),  # a lone surrogate
    ('{"type": "session.create", "prompt": "x", "metadata": {"k": "\\udfff"}}', "invalid_unicode", "metadata.k"),
    ('{"type": "prompt.update", "prompt": "x", "\\ud800": 1}', "invalid_unicode", None),
]


def test_hostile_messages_mid_session_get_errors_and_closing_still_cancels_the_video(server):
    async def session():
        async with websockets.connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.create", **LONG, "prompt": "under attack"}))
            video_id = (await receive_json(ws))["video"]["id"]
            errors = []
            for text, _, _ in HOSTILE_MESSAGES:
                await ws.send(text)
                errors.append(await until_error(ws, []))
            await ws.send(json.dumps({"type": "prompt.update", "prompt": "still steering"}))
            updated = await until(ws, "prompt.updated", [])
            return video_id, errors, updated

    video_id, errors, updated = run(session())
    assert [(e["code"], e["param"]) for e in errors] == [(code, param) for _, code, param in HOSTILE_MESSAGES], errors
    assert all(e["message"] for e in errors)
    assert updated["from_chunk"] >= 0
    wait_cancelled(server, video_id)


def reply(ws) -> dict:
    """The next text message that answers the client: a waiting session's `video.queued` is skipped."""
    while (message := json.loads(ws.receive_text()))["type"] == "video.queued":
        pass
    return message


def test_prompt_updates_are_capped_in_count_and_size_and_the_session_goes_on(tmp_path):
    services = idle_services(tmp_path, realtime_max_prompt_updates=3, max_prompt_chars=40)
    with app_client(tmp_path, services) as (client, _):
        with client.websocket_connect("/v1/realtime/video") as ws:
            ws.send_text(json.dumps({"type": "session.create", **TINY, "prompt": "waiting", "seconds": 2}))
            video_id = reply(ws)["video"]["id"]
            ws.send_text(json.dumps({"type": "prompt.update", "prompt": "x" * 41}))
            too_long = reply(ws)
            answers = []
            for n in range(4):
                ws.send_text(json.dumps({"type": "prompt.update", "prompt": f"update {n}"}))
                answers.append(reply(ws))
            ws.send_text(json.dumps({"type": "session.stop"}))
            stopping = reply(ws)
        updates = services.store.get(video_id).prompt_updates
    assert too_long["type"] == "error" and too_long["param"] == "prompt" and "40 characters" in too_long["message"]
    assert [a["type"] for a in answers] == ["prompt.updated"] * 3 + ["error"]
    over = answers[-1]
    assert over["code"] == "too_many_prompt_updates" and over["param"] == "prompt", over
    assert "VIDSERVE_REALTIME_MAX_PROMPT_UPDATES" in over["message"]
    assert stopping["type"] == "session.stopping"
    assert [u.prompt for u in updates] == ["update 0", "update 1", "update 2"]


def test_a_failure_in_the_server_closes_the_socket_with_1011_and_cancels_the_video(tmp_path):
    services = idle_services(tmp_path)
    video_object, looks = services.video, []

    def broken(job, places_in_line=None):
        looks.append(job.id)
        if len(looks) > 1:
            raise RuntimeError("a bug in the video object")
        return video_object(job, places_in_line)

    # `video.created` is made; the session's next look at its waiting video fails. Broken before the
    # session starts: a waiting session looks again only when its place in line moves, which it never
    # does here, so a look made before the test could break it would be the last.
    services.video = broken
    with app_client(tmp_path, services) as (client, _):
        with client.websocket_connect("/v1/realtime/video") as ws:
            ws.send_text(json.dumps({"type": "session.create", **TINY, "prompt": "doomed", "seconds": 2}))
            video_id = reply(ws)["video"]["id"]
            with pytest.raises(WebSocketDisconnect) as closed:
                while True:
                    ws.receive_text()
        assert closed.value.code == 1011

        def cancelled() -> bool:
            status = services.store.get(video_id).status
            assert status.value == "cancelled", status
            return True

        eventually(cancelled, timeout=30, what=f"{video_id} to be cancelled once its socket closed")


def wait_cancelled(server, video_id: str) -> None:
    """Until the video is cancelled: what closing its session, however it closes, must do."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        def cancelled() -> bool:
            status = http.get(f"/v1/videos/{video_id}").json()["status"]
            assert status == "cancelled", status
            return True

        eventually(cancelled, timeout=120, what=f"{video_id} to be cancelled once its socket closed")
