"""Reading request bodies the way OpenAI's SDK sends them: JSON, or multipart/form-data
with files, JSON-valued fields and bracketed keys (`video[id]`), under a size limit."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from vidserve.errors import from_validation_error
from vidserve.media import decode_data_url

from .errors import APIError

# Multipart carries every field as a string; these hold JSON.
JSON_FIELDS = ("metadata", "attention", "cache", "prompts")


async def read_body(request: Request, limit: int, file_fields: tuple[str, ...]) -> tuple[dict[str, Any], dict]:
    """The fields of a JSON or form body, and the bytes of the named file fields present."""
    if int(request.headers.get("content-length") or 0) > limit + 64 * 1024:
        raise APIError(413, f"request body is larger than the {limit} byte upload limit", code="file_too_large")
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        return await _read_form(request, limit, file_fields)
    try:
        fields = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(fields, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    files = {}
    if "input_reference" in file_fields and fields.get("input_reference") is not None:
        files["input_reference"] = _reference_bytes(fields.pop("input_reference"), limit)
    return fields, files


async def _read_form(request: Request, limit: int, file_fields: tuple[str, ...]) -> tuple[dict[str, Any], dict]:
    form = await request.form(max_files=len(file_fields) or 1, max_fields=48)
    fields: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key not in file_fields:
                raise APIError(400, f"unexpected file field {key!r}", param=key)
            if value.size is not None and value.size > limit:
                raise APIError(413, f"{key} is larger than the {limit} byte limit", param=key, code="file_too_large")
            files[key] = await value.read()
        elif "[" in key and key.endswith("]"):  # video[id]=... is how the SDK sends {"video": {"id": ...}}
            outer, inner = key[:-1].split("[", 1)
            fields.setdefault(outer, {})[inner] = value
        elif key in JSON_FIELDS:
            try:
                fields[key] = json.loads(value)
            except ValueError:
                raise APIError(400, f"{key} must be JSON", param=key) from None
        else:
            fields[key] = value
    return fields, files


def _reference_bytes(reference: Any, limit: int) -> bytes:
    """JSON bodies may carry the first frame as {"image_url": "data:image/png;base64,..."}."""
    url = reference.get("image_url") if isinstance(reference, dict) else None
    if not isinstance(url, str) or not url.startswith("data:"):
        raise APIError(400, "input_reference in a JSON body must be {\"image_url\": \"data:image/...;base64,...\"}; "
                            "or upload the image as multipart/form-data", param="input_reference")
    return decode_data_url(url, "input_reference", limit)


def validate(model: type[BaseModel], fields: dict[str, Any]):
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def request_hash(fields: dict[str, Any], files: dict[str, bytes]) -> str:
    """Identifies a request body, to tell an Idempotency-Key retry from a reuse of the key."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode())
    for name in sorted(files):
        digest.update(name.encode() + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()
