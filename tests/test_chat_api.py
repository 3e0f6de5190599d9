"""/v1/chat/completions end to end: the official openai SDK against `vidserve serve`
(images, text, streaming, structured outputs), and the API's refusals, limits and
disconnect handling."""

from __future__ import annotations

import base64
import io
import json
import re

import httpx
import jsonschema
import openai
import pytest
from apps import app_client
from PIL import Image
from polling import eventually
from servers import Server


def data_url(colour=(200, 30, 30), size=(48, 40)) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("chat") / "data").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def metric(server, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics").text
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_chat_with_an_image(client):
    reply = client.chat.completions.create(
        model="vlm-tiny", max_tokens=12, seed=1,
        messages=[{"role": "user", "content": [{"type": "text", "text": "What colour is this?"},
                                               {"type": "image_url", "image_url": {"url": data_url()}}]}])
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "vlm-tiny"
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    # 16 image tokens replace the one placeholder: the prompt is longer than its text.
    text_only = client.chat.completions.create(model="vlm-tiny", max_tokens=1, messages=[
        {"role": "user", "content": [{"type": "text", "text": "What colour is this?"}]}])
    assert reply.usage.prompt_tokens == text_only.usage.prompt_tokens + 16
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_text_only_chat_is_reproducible_with_a_seed(client):
    ask = dict(model="vlm-tiny", max_tokens=16, seed=7, messages=[{"role": "system", "content": "Be brief."},
                                                                  {"role": "user", "content": "Hello!"}])
    first, second = client.chat.completions.create(**ask), client.chat.completions.create(**ask)
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.usage.completion_tokens <= 16


def test_streamed_chunks_arrive_in_order_with_usage_last(client):
    ask = dict(model="vlm-tiny", max_tokens=20, seed=3, messages=[{"role": "user", "content": "Count."}],
               extra_body={"ignore_eos": True, "repetition_detection": False})
    whole = client.chat.completions.create(**ask).choices[0].message.content
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])


SYSTEM = "You caption frames for a video studio, in one short sentence each. " * 4  # ~270 tokens


def image_chat(colour) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": data_url(colour)}}]}]


def cached(usage) -> int:
    return usage.prompt_tokens_details.cached_tokens


def test_a_repeated_request_is_answered_from_the_prefix_cache_the_same(server, client):
    ask = dict(model="vlm-tiny", max_tokens=12, seed=5, temperature=1.0, messages=image_chat((12, 34, 56)),
               extra_body={"ignore_eos": True, "repetition_detection": False})
    first = client.chat.completions.create(**ask)
    again = client.chat.completions.create(**ask)
    uncached = client.chat.completions.create(**{**ask, "extra_body": {**ask["extra_body"], "prefix_cache": False}})
    assert cached(first.usage) < 16  # at most the chat template's first tokens, which every prompt shares
    assert cached(again.usage) >= 0.9 * again.usage.prompt_tokens and cached(uncached.usage) == 0
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    assert cached(chunks[-1].usage) == cached(again.usage)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert first.choices[0].message.content == again.choices[0].message.content == streamed == \
        uncached.choices[0].message.content
    assert metric(server, "vidserve_chat_prompt_tokens_cached_total") >= 2 * cached(again.usage)
    assert 0 < metric(server, "vidserve_chat_prefix_cache_hit_rate") < 1
    assert metric(server, "vidserve_chat_kv_blocks") > 0
    eventually(lambda: metric(server, "vidserve_chat_kv_blocks_in_use") == 0, what="the answers' blocks given back")


def test_a_follow_up_turn_reuses_the_conversation_so_far(client):
    messages = image_chat((99, 0, 99))
    first = client.chat.completions.create(model="vlm-tiny", max_tokens=8, seed=1, messages=messages)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "And the background?"}]
    second = client.chat.completions.create(model="vlm-tiny", max_tokens=8, seed=1, messages=messages)
    assert cached(second.usage) >= (first.usage.prompt_tokens - 1) // 16 * 16


def test_prefix_caching_off_for_the_server(tmp_path):
    body = {"max_tokens": 4, "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}
    with app_client(tmp_path, chat_model="vlm-tiny", chat_prefix_cache=False) as (http, _):
        usages = [http.post("/v1/chat/completions", json=body).json()["usage"] for _ in range(2)]
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in usages] == [0, 0]


def test_raw_stream_ends_with_done(server):
    body = {"model": "vlm-tiny", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["object"] == "chat.completion.chunk" for e in events[:-1])


def test_json_schema_output_parses_and_validates(client):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 0},
                                               "label": {"type": "string", "maxLength": 10}},
              "required": ["colour", "count", "label"], "additionalProperties": False}
    for seed in range(3):
        reply = client.chat.completions.create(
            model="vlm-tiny", seed=seed, max_tokens=300, messages=[{"role": "user", "content": "Describe it."}],
            response_format={"type": "json_schema", "json_schema": {"name": "shape", "schema": schema,
                                                                    "strict": True}})
        assert reply.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_models_lists_the_chat_model(client):
    models = {m.id: m for m in client.models.list()}
    assert models["vlm-tiny"].model_extra["kind"] == "chat" and models["vlm-tiny"].model_extra["vision"]
    assert models["wan-tiny"].model_extra["kind"] == "t2v"


def test_latency_metrics_are_exported(server, client):
    client.chat.completions.create(model="vlm-tiny", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert metric(server, "vidserve_chat_time_to_first_token_seconds_count") >= 1
    assert metric(server, "vidserve_chat_inter_token_latency_seconds_count") >= 1
    assert metric(server, "vidserve_chat_generation_tokens_total") >= 4
    assert metric(server, "vidserve_chat_prompt_tokens_total") >= 1


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
def test_a_client_that_goes_away_frees_its_slot(server, stream):
    aborted = 'vidserve_chat_request_seconds_count{finish_reason="abort"}'
    before = metric(server, aborted)
    body = {"model": "vlm-tiny", "max_tokens": 2000, "stream": stream, "ignore_eos": True,
            "repetition_detection": False, "messages": [{"role": "user", "content": "Go on forever."}]}
    if stream:
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body) as response:
            for i, _ in enumerate(response.iter_lines()):
                if i == 6:
                    break  # leaving the block closes the connection mid-answer
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=0.5)
    eventually(lambda: metric(server, aborted) != before, what="the server to count the abort")
    assert metric(server, aborted) == before + 1
    assert metric(server, "vidserve_chat_running") == 0


# --- refusals, in-process ------------------------------------------------------------------

@pytest.fixture(scope="module")
def api(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("chat-api")
    with app_client(tmp_path, chat_model="vlm-tiny", chat_max_tokens=500) as (client, services):
        yield client, services


BAD = {
    "no messages": ({"messages": []}, "messages"),
    "unknown role": ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
    "unsupported field": ({"tools": [], "messages": [{"role": "user", "content": "hi"}]}, "tools"),
    "n above 1": ({"n": 2, "messages": [{"role": "user", "content": "hi"}]}, "n"),
    "temperature": ({"temperature": 3, "messages": [{"role": "user", "content": "hi"}]}, "temperature"),
    "five stops": ({"stop": list("abcde"), "messages": [{"role": "user", "content": "hi"}]}, "stop"),
    "too many tokens": ({"max_tokens": 501, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    "bad base64": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}]}]},
        "messages[0].content[0].image_url"),
    "not an image": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"hello").decode()}}]}]},
        "messages[0].content[0].image_url"),
    "remote image, fetching off": ({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/cat.png"}}]}]},
        "messages[0].content[0].image_url"),
    "schema without schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}},
                               "messages": [{"role": "user", "content": "hi"}]}, "response_format.json_schema.schema"),
    "unknown format": ({"response_format": {"type": "yaml"}, "messages": [{"role": "user", "content": "hi"}]},
                       "response_format.type"),
    "stop inside JSON": ({"response_format": {"type": "json_object"}, "stop": ["}"],
                          "messages": [{"role": "user", "content": "hi"}]}, "response_format"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_requests_get_openai_shaped_400s(api, case):
    client, services = api
    body, param = BAD[case]
    steps = services.chat.engine.decode_steps
    response = client.post("/v1/chat/completions", json={"model": "vlm-tiny", **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert services.chat.engine.decode_steps == steps  # nothing reached the model


def test_unknown_chat_model_is_404(api):
    client, _ = api
    response = client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": [{"role": "user",
                                                                                          "content": "hi"}]})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"


def test_a_full_engine_answers_429(api, monkeypatch):
    client, services = api
    monkeypatch.setattr(services.chat.engine, "max_waiting", 0)
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 429 and response.headers["retry-after"] == "1"
    assert response.json()["error"]["type"] == "rate_limit_error"


def test_repetition_stop_reason_in_the_response(api, force_token):
    client, services = api
    force_token(services.chat.engine.model, "S")
    body = {"max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == \
        ("SSSS", "stop", "repetition")
    choice = client.post("/v1/chat/completions", json={**body, "repetition_detection": False}).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("S" * 50, "length")


def test_a_loop_inside_json_is_closed_and_max_tokens_is_length(api, force_token):
    client, services = api
    force_token(services.chat.engine.model, "S")
    schema = {"type": "object", "properties": {"label": {"type": "string"}, "count": {"type": "integer"}},
              "required": ["label", "count"]}
    body = {"max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
    choice = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "repetition")
    assert json.loads(choice["message"]["content"]) == {"label": "SSSS", "count": 0}
    choice = client.post("/v1/chat/completions", json={**body, "max_tokens": 5}).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == \
        ('{"lab', "length", None)
