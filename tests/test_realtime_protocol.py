"""The realtime protocol is its models (`api/protocol/realtime.py`): the docs page is generated
from them and names no other message, and what a session sends on the wire is those models."""

from __future__ import annotations

import json
import re
from pathlib import Path

from apps import app_client, idle_services
from pydantic import TypeAdapter

from vidserve import jobs
from vidserve.api.protocol.realtime import CLIENT_MESSAGES, CLIENT_MODELS, PATH, SERVER_MODELS, ServerMessage
from vidserve.api.protocol.realtime_docs import GENERATED_BY, render

PAGE = Path(__file__).resolve().parents[1] / "docs" / "realtime-protocol.md"
SERVER_MESSAGES = TypeAdapter(ServerMessage)


def message_types(model) -> tuple[str, ...]:
    return model.model_fields["type"].annotation.__args__


def test_the_page_is_generated_from_the_models():
    assert PAGE.read_text() == render(), f"docs/realtime-protocol.md is stale: run `{GENERATED_BY}`"


def test_the_page_names_every_message_and_field_and_no_message_that_is_not_a_model():
    page = PAGE.read_text()
    for model in (*CLIENT_MODELS, *SERVER_MODELS):
        assert f"`{model.__name__}`" in page
        for kind in message_types(model):
            assert f"### `{kind}`" in page or f"/ `{kind}`" in page, kind
        for name, field in model.model_fields.items():
            assert f"`{name}`" in page, (model.__name__, name)
    known = {kind for model in (*CLIENT_MODELS, *SERVER_MODELS) for kind in message_types(model)}
    named = set(re.findall(r"`([a-z]+\.[a-z_]+)`", page))
    assert named - {"realtime.py"} <= known, named - known


def test_what_a_session_sends_is_its_models(tmp_path):
    """Each text message, parsed as the documented union and written back, is the same JSON: no
    field outside the models, none missing."""
    services = idle_services(tmp_path)
    sent = [{"type": "session.create", "model": "wan-tiny", "size": "64x64", "prompt": "waiting", "seconds": 2},
            {"type": "prompt.update", "prompt": "still waiting"}, {"type": "dance"}, {"type": "session.stop"}]
    with app_client(tmp_path, services) as (client, _):
        with client.websocket_connect(PATH) as ws:
            texts = []
            for message in sent:
                if message["type"] in ("session.create", "prompt.update", "session.stop"):
                    CLIENT_MESSAGES.validate_python(message)
                ws.send_text(json.dumps(message))
                texts.append(ws.receive_text())
            texts.append(ws.receive_text())  # the waiting video's place in line, after video.created
            video_id = json.loads(texts[0])["video"]["id"]
            services.store.update(video_id, jobs.request_cancel)  # heard through the job's events, not asked for
            while json.loads(texts[-1])["type"] != "video.cancelled":
                texts.append(ws.receive_text())
    parsed = [SERVER_MESSAGES.validate_json(text) for text in texts]
    assert {message.type for message in parsed} >= {"video.created", "video.queued", "prompt.updated", "error",
                                                     "session.stopping", "video.cancelled"}
    for text, message in zip(texts, parsed):
        assert json.loads(message.model_dump_json()) == json.loads(text)
