"""The served OpenAPI schema, made true to what the server does where FastAPI cannot see it.

Each route names its own answers (`response_model=`, and `responses=` for its error statuses,
`protocol.errors.errors`, and what is not JSON, `protocol.media`); what is left is done here.
The video routes read their bodies themselves (JSON, or multipart with files, see
`forms.read_body`), so their request bodies are added from the same pydantic models
`forms.validate` checks. Errors are OpenAI-shaped 400s, never FastAPI's 422, which goes. The
models only event streams carry are added to the components their `$ref`s name.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from .forms import JSON_FIELDS
from .protocol.media import STREAMED_MODELS
from .protocol.videos import VideoCreate, VideoExtend, VideoRemix

_VALIDATION_ERROR = "#/components/schemas/HTTPValidationError"

# (path, method) -> (body model, its file fields in multipart). Remix takes JSON only.
BODIES: dict[tuple[str, str], tuple[type[BaseModel], tuple[str, ...]]] = {
    ("/v1/videos", "post"): (VideoCreate, ("input_reference",)),
    ("/v1/videos/extensions", "post"): (VideoExtend, ("video",)),
    ("/v1/videos/{video_id}/remix", "post"): (VideoRemix, ()),
}


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi


def build(app: FastAPI) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    _, bodies = models_json_schema([(model, "validation") for model, _ in BODIES.values()],
                                   ref_template="#/components/schemas/{model}")
    components.update(bodies.get("$defs", {}))
    # What only event streams carry; a model some route answers with keeps the definition FastAPI gave it.
    _, streamed = models_json_schema([(model, "serialization") for model in STREAMED_MODELS],
                                     ref_template="#/components/schemas/{model}")
    for name, definition in streamed.get("$defs", {}).items():
        components.setdefault(name, definition)
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer",
                                                          "description": "An API key, when the server has any."}}
    # A JSON body may carry the first frame too, as a data URL (forms.read_body takes it out).
    components["VideoCreate"]["properties"]["input_reference"] = {
        "type": "string", "description": "The first frame as a data: URL (image/png, image/jpeg, image/webp)."}
    for (path, method), (model, files) in BODIES.items():
        schema["paths"][path][method]["requestBody"] = _request_body(model, files)
    for path, operations in schema["paths"].items():
        for operation in operations.values():
            responses = operation["responses"]
            if _VALIDATION_ERROR in str(responses.get("422")):  # FastAPI's; ours are 400s (a route's own 422 stays)
                del responses["422"]
            if path.startswith("/v1/"):
                operation["security"] = [{"bearer": []}, {}]  # {}: a server without keys takes anyone
    return schema


def _request_body(model: type[BaseModel], files: tuple[str, ...]) -> dict[str, Any]:
    """JSON as the model says; multipart with every field a string (JSON text for the
    structured ones) and the files as binary parts."""
    json_body: dict[str, Any] = {"$ref": f"#/components/schemas/{model.__name__}"}
    content = {"application/json": {"schema": json_body}}
    if files:
        fields = model.model_json_schema()["properties"]
        form = {name: {"type": "string", "description": "JSON" if name in JSON_FIELDS
                       else field.get("description", "")} for name, field in fields.items()}
        form.update({name: {"type": "string", "format": "binary"} for name in files})
        content["multipart/form-data"] = {"schema": {
            "type": "object", "properties": form, "required": sorted(model.model_json_schema().get("required", []))}}
    return {"required": True, "content": content}
