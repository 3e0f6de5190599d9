"""Chat images are bounded before any processor sees them (decoded size, aspect ratio, the
size the model's processor would scale them to, an image media type), and a request whose
client goes away stops at the next engine step while its images are encoded or its
prompt prefilled."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading

import pytest
from apps import app_client
from PIL import Image
from polling import eventually
from transformers import CLIPImageProcessorPil, LlavaNextImageProcessorPil, Qwen2VLImageProcessorPil

from vidserve.chat import Message, data_url, to_model_messages
from vidserve.errors import InvalidRequest
from vidserve.pipelines.llm.vision_size import processed_size


def png(size: tuple[int, int], colour=(200, 30, 30)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def image_part(data: bytes, media_type: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64," + base64.b64encode(data).decode()}}


def ask(*images: dict, text: str = "What is this?", **body) -> dict:
    return {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *images]}],
            **body}


def status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def peak_rss_growth_mb(call) -> float:
    """How far this process's resident memory peaked above what it held before `call`, in MB
    (the kernel's peak is reset first, so memory taken and given back within the call counts)."""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    before = status_kb("VmRSS")
    call()
    return (status_kb("VmHWM") - before) / 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    # Small prefill rows, so that a prompt of a few hundred characters takes several passes.
    tmp_path = tmp_path_factory.mktemp("chat-images")
    with app_client(tmp_path, chat_model="vlm-tiny", chat_prefill_tokens=16) as (client, _):
        yield client, client.app


def assert_refused(response, param: str, code: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    return error["message"]


# --- bounds -------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(100000, 1), (1, 100000), (2100, 100)], ids=["wide strip", "tall strip", "21:1"])
def test_an_elongated_image_is_refused_before_the_model_sees_it(api, size):
    client, app = api
    engine = app.state.services.chat.engine
    encoded, steps = engine.model.vision_calls, engine.decode_steps
    responses = []
    growth = peak_rss_growth_mb(lambda: responses.append(client.post("/v1/chat/completions",
                                                                     json=ask(image_part(png(size))))))
    message = assert_refused(responses[0], "messages[0].content[1].image_url", "image_aspect_ratio")
    assert f"{size[0]}x{size[1]}" in message and "20 times" in message
    assert growth < 100, f"peak RSS grew {growth:.0f} MB"
    assert (engine.model.vision_calls, engine.decode_steps) == (encoded, steps)


def test_the_longest_allowed_aspect_ratio_is_answered(api):
    client, _ = api
    response = client.post("/v1/chat/completions", json=ask(image_part(png((400, 20)))))
    assert response.status_code == 200, response.text


def test_an_image_the_processor_would_scale_past_the_limit_is_refused(api, monkeypatch):
    client, app = api
    # vlm-tiny's processor scales the short side to 32: 400x20 becomes 640x32 = 20480 pixels.
    monkeypatch.setattr(app.state.services.settings, "chat_max_vision_pixels", 64 * 64)
    message = assert_refused(client.post("/v1/chat/completions", json=ask(image_part(png((400, 20))))),
                             "messages[0].content[1].image_url", "image_too_large")
    assert "400x20" in message and "640x32 = 20480 pixels" in message and "4096" in message
    assert client.post("/v1/chat/completions", json=ask(image_part(png((40, 30))))).status_code == 200


def test_the_scaled_size_alone_refuses_the_thin_strip(api):
    _, app = api
    model = app.state.services.chat.engine.model
    with pytest.raises(InvalidRequest, match="3200000x32"):
        model.check_image(Image.new("RGB", (100000, 1)), 4096 * 4096)


@pytest.mark.parametrize("processor", [
    CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size=32),
    Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=84 * 84),
    LlavaNextImageProcessorPil(),
], ids=["clip", "qwen2-vl", "llava-next"])
@pytest.mark.parametrize("size", [(40, 30), (400, 20), (30, 500), (640, 480)])
def test_the_scaled_size_is_the_largest_array_the_processor_makes(monkeypatch, processor, size):
    made = []

    def recorded(method):
        return lambda image, *a, **kw: made.append(method(image, *a, **kw)) or made[-1]

    # LLaVA-NeXT pads the scaled image out to its grid pinpoint: that array is the largest.
    for name in ("resize", "_pad_for_patching"):
        if hasattr(processor, name):
            monkeypatch.setattr(processor, name, recorded(getattr(processor, name)))
    processor(images=[Image.new("RGB", size)])
    largest = max(made, key=lambda array: array.shape[-1] * array.shape[-2])
    assert processed_size(processor, *size) == (largest.shape[-1], largest.shape[-2])


@pytest.mark.parametrize("size", [(1280, 16), (16, 1280)], ids=["wide", "tall"])
def test_an_elongated_video_frame_is_padded_to_an_image_chat_takes(size):
    frame = Image.new("RGB", size, (255, 255, 255))
    _, [image] = to_model_messages([Message.model_validate({"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(frame)}}]})], max_pixels=2**31, max_bytes=2**31,
        remote_images=False)
    width, height = image.image.size
    assert sorted((width, height)) == [64, 1280]
    left, top = (width - size[0]) // 2, (height - size[1]) // 2
    assert image.image.getbbox() == (left, top, left + size[0], top + size[1])  # the whole frame, centred


@pytest.mark.parametrize("media_type", ["text/plain", ""], ids=["text", "none"])
def test_a_data_url_that_is_not_an_image_type_is_refused(api, media_type):
    client, _ = api
    response = client.post("/v1/chat/completions", json=ask(image_part(png((40, 30)), media_type)))
    message = assert_refused(response, "messages[0].content[1].image_url", "unsupported_media_type")
    assert "data:image/png;base64" in message


# --- a client that goes away --------------------------------------------------------------

def post_then_leave(app, body: dict, leave: threading.Event) -> int:
    """POST to the app as an ASGI server would, and report the client gone once `leave` is set;
    the status the app answered with."""
    data = json.dumps(body).encode()
    sent, messages = False, []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        while not leave.is_set():  # the server's wait for the socket to close
            await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions", "query_string": b"",
             "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode())]}
    asyncio.run(app(scope, receive, send))
    return next(m["status"] for m in messages if m["type"] == "http.response.start")


def leave_then_wait_for_abort(leave: threading.Event, seq) -> None:
    """On the engine thread: the client goes away now, and the step goes on once the API has
    aborted its sequence."""
    leave.set()
    eventually(lambda: seq.aborted, timeout=30, what="the API to abort the sequence of the client that left")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_client_that_leaves_during_a_long_prefill_stops_it_within_one_pass(api, monkeypatch, stream):
    _, app = api
    engine = app.state.services.chat.engine
    model, leave = engine.model, threading.Event()
    passes, aborted = engine.prefill_passes, engine.aborted_sequences
    forward = model.forward

    def third_pass_loses_its_client(*args, **kwargs):
        if kwargs.get("inputs_embeds") is not None and engine.prefill_passes == passes + 2:
            leave_then_wait_for_abort(leave, engine.prefill.queue[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", third_pass_loses_its_client)
    body = ask(text="a long question " * 100, stream=stream)  # some 1,600 prompt tokens, 8 x 16 a pass
    assert post_then_leave(app, body, leave) == 499
    eventually(lambda: engine.aborted_sequences == aborted + 1, timeout=30, what="the engine to drop the sequence")
    assert engine.prefill_passes == passes + 3  # the pass under way when the client left, and no more
    assert engine.running == 0


def test_a_client_that_leaves_while_its_images_are_encoded_stops_the_encoder_within_one_image(api, monkeypatch):
    _, app = api
    engine = app.state.services.chat.engine
    model, leave = engine.model, threading.Event()
    encoded, aborted = model.vision_calls, engine.aborted_sequences
    image_features = model.image_features

    def first_image_loses_its_client(image):
        features = image_features(image)
        if model.vision_calls == encoded + 1:
            leave_then_wait_for_abort(leave, engine.encoding.seqs[0])
        return features

    monkeypatch.setattr(model, "image_features", first_image_loses_its_client)
    images = [image_part(png((40, 30), (11 * i, 7, 190))) for i in range(4)]  # colours no other test sends
    assert post_then_leave(app, ask(*images), leave) == 499
    eventually(lambda: engine.aborted_sequences == aborted + 1, timeout=30, what="the engine to drop the sequence")
    assert model.vision_calls == encoded + 1  # the other three images were never encoded
    assert engine.running == 0
