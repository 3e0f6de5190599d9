"""Every answer the served schema documents names what it carries, so a client generated from
`/openapi.json` gets a type for each success, not an empty schema.

"Names a schema" means: JSON is a `$ref` to a model in the components (or one of several such); a
file, a playlist, the
metrics page or an event stream (not JSON) is a schema with a `type` (a file a binary string; an
event stream an object whose `data` names the models it carries), described. Every `$ref` in a
response resolves.

And the one route that answers one of two models, `/v1/models/{model}`, works from OpenAI's SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from apps import app_client, idle_services, settings_for

from vidserve.api.app import create_app

REF = "#/components/schemas/"


@pytest.fixture(scope="module")
def schema(tmp_path_factory) -> dict[str, Any]:
    return create_app(settings_for(tmp_path_factory.mktemp("schema"))).openapi()


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"]
        for value in node.values():
            yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def unnamed(schema: dict[str, Any], status: str, response: dict[str, Any]) -> list[str]:
    """What a success leaves unnamed (nothing, where it names everything)."""
    problems = []
    content = response.get("content")
    if not content:
        problems.append(f"{status} has no content")
    for media_type, body in (content or {}).items():
        body_schema = body.get("schema") or {}
        if media_type == "application/json":
            models = body_schema.get("anyOf") or body_schema.get("oneOf") or [body_schema]
            if not all(model.get("$ref", "").startswith(REF) for model in models):
                problems.append(f"{status} {media_type} is not a $ref to a model: {body_schema}")
        elif "type" not in body_schema:
            problems.append(f"{status} {media_type} has no type: {body_schema}")
        elif not (body_schema.get("description") or response.get("description")):
            problems.append(f"{status} {media_type} is not described")
    components = schema["components"]["schemas"]
    problems += [f"{status} names {ref}, which the schema does not define"
                 for ref in refs(response) if ref.removeprefix(REF) not in components]
    return problems


def test_every_success_in_the_served_schema_names_its_schema(schema):
    problems = [f"{method.upper()} {path}: {problem}"
                for path, operations in schema["paths"].items() for method, operation in operations.items()
                for status, response in operation["responses"].items() if status.startswith("2")
                for problem in unnamed(schema, status, response)]
    assert not problems, "\n".join(problems)


def test_every_operation_documents_a_success_and_its_errors_as_error_responses(schema):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            statuses = operation["responses"]
            route = f"{method.upper()} {path}"
            assert any(status.startswith("2") for status in statuses), f"{route} documents no success"
            # Every route caps its body; every /v1 route authenticates, rate-limits and reads the store.
            expected = {"413", *(("400", "401", "429", "500", "503") if path.startswith("/v1/") else ())}
            assert expected <= set(statuses), f"{route} documents only {sorted(statuses)}"
            for status, response in statuses.items():
                if status[0] in "45":
                    body = response["content"]["application/json"]["schema"]
                    assert body == {"$ref": f"{REF}ErrorResponse"}, f"{route} {status}: {body}"
            assert "HTTPValidationError" not in str(statuses), f"{route} documents FastAPI's 422, never answered"


def test_the_event_streams_name_the_models_their_events_carry(schema):
    def event_data(path: str, method: str) -> list[str]:
        content = schema["paths"][path][method]["responses"]["200"]["content"]["text/event-stream"]
        return sorted(ref.removeprefix(REF) for ref in refs(content["schema"]["properties"]["data"]))

    assert event_data("/v1/videos/{video_id}/events", "get") == [
        "VideoChunkEvent", "VideoDeleted", "VideoObject", "VideoProgress"]
    assert event_data("/v1/chat/completions", "post") == ["ChatCompletionChunk", "ErrorResponse"]


def test_the_openai_sdk_retrieves_a_model_of_the_list_and_is_told_of_one_that_is_not(tmp_path):
    with app_client(tmp_path, idle_services(tmp_path)) as (client, _):
        sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="unused", http_client=client, max_retries=0)
        listed = {model.id: model for model in sdk.models.list()}
        tiny = sdk.models.retrieve("wan-tiny")
        assert tiny == listed["wan-tiny"] and tiny.model_extra["kind"] == "t2v"
        with pytest.raises(openai.NotFoundError) as refused:
            sdk.models.retrieve("wan-huge")
        assert refused.value.code == "model_not_found" and "GET /v1/models lists them" in refused.value.message
