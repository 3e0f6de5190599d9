"""Reading request bodies the way OpenAI's SDK sends them: JSON, or multipart/form-data
with files, JSON-valued fields and bracketed keys (`video[id]`, `loras[][name]`), under a
size limit (the whole body's is `body_limit.BodyLimit`'s) and a nesting limit."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from types import UnionType
from typing import Any, Union, get_args, get_origin

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile

from vidserve.errors import ECHO_CHARS, echo, from_validation_error
from vidserve.media import decode_data_url

from .errors import APIError
from .protocol.json_values import MAX_JSON_DEPTH, nesting_depth
from .protocol.videos import VideoCreate, VideoExtend


def _structured_fields(*models: type[BaseModel]) -> frozenset[str]:
    """The fields whose values are lists or objects."""

    def structured(annotation) -> bool:
        kinds = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else (annotation,)
        return any(get_origin(kind) in (list, dict, tuple) or kind in (list, dict) or
                   (isinstance(kind, type) and issubclass(kind, BaseModel)) for kind in kinds)
    return frozenset(name for model in models for name, field in model.model_fields.items()
                     if structured(field.annotation))


# Multipart carries every field as a string; these hold JSON.
JSON_FIELDS = _structured_fields(VideoCreate, VideoExtend)


async def read_body(request: Request, limit: int, file_fields: tuple[str, ...]) -> tuple[dict[str, Any], dict]:
    """The fields of a JSON or form body, and the bytes of the named file fields present."""
    content_type = request.headers.get("content-type", "")
    if content_type.startswith(("multipart/form-data", "application/x-www-form-urlencoded")):
        return await _read_form(request, limit, file_fields)
    fields = _parse_object(await request.body() or b"{}")
    require_unicode(fields)
    files = {}
    if "input_reference" in file_fields and fields.get("input_reference") is not None:
        files["input_reference"] = reference_bytes(fields.pop("input_reference"), limit)
    return fields, files


async def _read_form(request: Request, limit: int, file_fields: tuple[str, ...]) -> tuple[dict[str, Any], dict]:
    form = await request.form(max_files=len(file_fields) or 1, max_fields=48)
    fields: dict[str, Any] = {}
    files: dict[str, bytes] = {}
    bracketed: set[str] = set()  # names given as name[...]: one may not also come plain
    items = form.multi_items()
    keys = iter(_index_field_by_field_lists([key for key, value in items if not isinstance(value, UploadFile)]))
    for key, value in items:
        if isinstance(value, UploadFile):
            if key not in file_fields:
                raise APIError(400, f"unexpected file field {echo(key)}", param=key[:ECHO_CHARS])
            if value.size is not None and value.size > limit:
                raise APIError(413, f"{key} is larger than the {limit} byte limit", param=key, code="file_too_large")
            files[key] = await value.read()
            continue
        key = next(keys)
        name = key.partition("[")[0]
        if name in fields and (name not in bracketed or "[" not in key):
            # Which of two values to take is no choice to make silently: the last? the first?
            how = "plain and bracketed" if (name in bracketed) != ("[" in key) else "twice"
            raise APIError(400, f"form field {echo(name)} is given {how}; give it once", param=name[:ECHO_CHARS])
        if "[" in key:
            bracketed.add(name)
            _assign_bracketed(fields, key, value)
        elif key in JSON_FIELDS:
            fields[key] = _parse_field(key, value)
        else:
            fields[key] = value
    require_unicode(fields)  # a JSON-valued field may hold "\ud800" (plain ones are decoded as latin-1 if not UTF-8)
    return fields, files


_SEGMENT = re.compile(r"\[([^\[\]]*)\]")
_INDEX = re.compile(r"[0-9]+")
_ITEM_FIELD = re.compile(r"([^\[\]]+)\[\](\[.*)")  # name[][field]...: a field of an item of the list `name`


def _index_field_by_field_lists(keys: list[str]) -> list[str]:
    """The form's keys, in order, with each list of objects written field by field given indexes.

    OpenAI's SDK writes a list of objects field by field: [{"format": "webm", "fps": 30},
    {"format": "mov", "fps": 16}] as outputs[][format] twice, then outputs[][fps] twice; a client
    writing item by item sends outputs[][format], outputs[][fps], outputs[][format], ... A list
    whose fields each come in one run, every run as long, is read field by field: the k-th value
    of each field is item k (outputs[k][field]). Runs of different lengths are refused: after
    outputs[][format] three times, one outputs[][fps] may belong to any of the three. Any other
    order is read item by item (`_assign_bracketed`)."""
    runs: dict[str, list[tuple[str, int]]] = {}  # list name -> (its item's field, how many in a row)
    for key in keys:
        if match := _ITEM_FIELD.fullmatch(key):
            name, field = match.groups()
            fields = runs.setdefault(name, [])
            if fields and fields[-1][0] == field:
                fields[-1] = (field, fields[-1][1] + 1)
            else:
                fields.append((field, 1))
    field_by_field = set()
    for name, fields in runs.items():
        if len({field for field, _ in fields}) < len(fields):
            continue  # a field comes back after another: item by item
        if len({count for _, count in fields}) > 1:
            raise _ambiguous_list(name, fields)
        field_by_field.add(name)
    indexed, written = [], Counter[str]()  # written: how many values of each key came before
    for key in keys:
        match = _ITEM_FIELD.fullmatch(key)
        if match and match[1] in field_by_field:
            indexed.append(f"{match[1]}[{written[key]}]{match[2]}")
            written[key] += 1
        else:
            indexed.append(key)
    return indexed


def _ambiguous_list(name: str, fields: list[tuple[str, int]]) -> APIError:
    name = name[:ECHO_CHARS]
    counts = ", ".join(f"{echo(name + '[]' + field)} {f'{count} times' if count > 1 else 'once'}"
                       for field, count in fields[:3])
    more = ", ..." if len(fields) > 3 else ""
    return APIError(400, f"{name} is a list of objects written field by field with different counts ({counts}{more}), "
                         f"so which item each value belongs to cannot be told; send {name} as JSON: a JSON body, or "
                         f"one form field {name} holding the JSON list (with the OpenAI SDK, "
                         f"extra_body={{\"{name}\": json.dumps([...])}})", param=name, code="ambiguous_form_field")


def _assign_bracketed(fields: dict[str, Any], key: str, value: str) -> None:
    """Put a bracketed form field where its key says, as OpenAI's SDK writes nested values in a
    form: {"video": {"id": V}} as video[id]=V, and [{"name": A}, {"name": B}] under loras as
    loras[][name]=A, loras[][name]=B (a key already set in the last item starts the next; a list
    written field by field has been given indexes by `_index_field_by_field_lists`), or as other
    clients write lists, with indexes counting from 0: loras[0][name]=A, loras[1][name]=B."""
    name, _, rest = key.partition("[")
    segments = _SEGMENT.findall("[" + rest)
    if not name or "".join(f"[{segment}]" for segment in segments) != "[" + rest:
        raise APIError(400, f"form field {echo(key)} is not name[key][...], name[] or name[0]",
                       param=(name or key)[:ECHO_CHARS])
    if len(segments) > MAX_JSON_DEPTH:
        raise _too_deep(name)
    path, node = [name, *segments], fields
    for here, next_segment in zip(path, path[1:]):
        kind = list if next_segment == "" or _INDEX.fullmatch(next_segment) else dict
        if here == "":  # node is a list: a new item, unless the last one still lacks this key
            last = node[-1] if node else None
            if not (isinstance(last, kind) and kind is dict and next_segment not in last):
                node.append(kind())
            node = node[-1]
        elif isinstance(node, list):  # an index
            node = _item(node, here, key, name, kind)
        else:
            node = node.setdefault(here, kind())
        if not isinstance(node, kind):
            raise APIError(400, f"{name} is given in two shapes (as {echo(key)} and otherwise)", param=name)
    leaf = path[-1]
    if leaf == "":
        node.append(value)
    elif isinstance(node, list):
        if _index(leaf, node, key, name) < len(node):
            raise APIError(400, f"form field {echo(key)} is given twice", param=name)
        node.append(value)
    elif leaf in node:
        raise APIError(400, f"form field {echo(key)} is given twice", param=name)
    else:
        node[leaf] = value


def _item(items: list, segment: str, key: str, name: str, kind: type) -> Any:
    """The item `segment` indexes in `items`, made (as a `kind`) when it is the next one."""
    index = _index(segment, items, key, name)
    if index == len(items):
        items.append(kind())
    return items[index]


def _index(segment: str, items: list, key: str, name: str) -> int:
    """An index into `items` that is one of them or the next: indexes count from 0 without gaps."""
    if not _INDEX.fullmatch(segment):
        raise APIError(400, f"{name} is given in two shapes (as {echo(key)} and otherwise)", param=name)
    if len(segment) > len(str(len(items))) or int(segment) > len(items):
        raise APIError(400, f"form field {echo(key)}: index {segment[:8]} skips ahead of the {len(items)} items "
                            "given so far; indexes count from 0 without gaps", param=name)
    return int(segment)


def _parse_object(raw: bytes) -> dict[str, Any]:
    """A JSON body: an object whose fields each nest at most MAX_JSON_DEPTH levels."""
    try:
        fields = json.loads(raw)
    except RecursionError:
        raise _too_deep(_field_too_deep_to_parse(raw)) from None
    except ValueError as exc:
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(fields, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    for key, value in fields.items():
        if nesting_depth(value) > MAX_JSON_DEPTH:
            raise _too_deep(key)
    return fields


def _parse_field(key: str, value: str) -> Any:
    try:
        parsed = json.loads(value)
    except RecursionError:
        raise _too_deep(key) from None
    except ValueError:
        raise APIError(400, f"{key} must be JSON", param=key) from None
    if nesting_depth(parsed) > MAX_JSON_DEPTH:
        raise _too_deep(key)
    return parsed


_SPACE = re.compile(r"[ \t\n\r]*")


def _field_too_deep_to_parse(raw: bytes) -> str | None:
    """Which field of a JSON object nests too deep for json to parse at all: the fields are
    decoded one at a time until one fails. None if the body is no object to tell."""
    text, decoder = raw.decode("utf-8", "replace"), json.JSONDecoder()
    pos = _SPACE.match(text).end()
    if not text.startswith("{", pos):
        return None
    try:
        while True:
            key, pos = decoder.raw_decode(text, _SPACE.match(text, pos + 1).end())  # past "{" or ","
            pos = _SPACE.match(text, pos).end() + 1  # past ":"
            try:
                _, pos = decoder.raw_decode(text, _SPACE.match(text, pos).end())
            except RecursionError:
                return key if isinstance(key, str) else None
            pos = _SPACE.match(text, pos).end()
    except (ValueError, RecursionError):  # not an object json could read, or a key nested that deep
        return None


# Lone UTF-16 surrogates: JSON's \ud800 escapes, unpaired, decode to them, and no UTF-8 encoder (the job
# store's, the tokenizer's, a response's) can write them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def require_unicode(value: Any, whole: str = "the body") -> None:
    """Refuse decoded JSON holding text that is not valid Unicode, with a 400 naming the first
    such field by its dotted path (`metadata.k`, `messages.0.content`; `whole` for the value
    itself), before anything keeps, encodes or echoes it. Walked without recursion, keys included."""
    pending: list[tuple[Any, str | None]] = [(value, None)]
    while pending:
        item, path = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise _not_unicode(path, f"{path or whole} is not valid Unicode")
        elif isinstance(item, dict):
            for key in item:
                if isinstance(key, str) and _SURROGATE.search(key):
                    raise _not_unicode(path, f"{path or whole} has a key that is not valid Unicode")
            pending.extend((child, _join(path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            pending.extend((child, _join(path, index)) for index, child in reversed(list(enumerate(item))))


async def unicode_json_body(request: Request) -> None:
    """A route dependency for a body FastAPI decodes: `require_unicode` on the JSON it read
    (`request.json()` keeps it), before the body model is validated."""
    try:
        body = await request.json() if await request.body() else None
    except (ValueError, RecursionError):
        return  # not JSON: FastAPI's own parse of the body answers that
    require_unicode(body)


def _join(path: str | None, part: str | int) -> str:
    part = str(part)[:ECHO_CHARS]  # a client's key, cut as error messages quote input
    return f"{path}.{part}" if path else part


def _not_unicode(param: str | None, what: str) -> APIError:
    return APIError(400, f"{what}: it holds an unpaired surrogate (such as \\ud800), which is no character; "
                         "send text as UTF-8, or as JSON escapes of whole characters", param=param,
                    code="invalid_unicode")


def _too_deep(param: str | None) -> APIError:
    what = param or "request body"
    return APIError(400, f"{what} nests deeper than {MAX_JSON_DEPTH} levels of lists and objects", param=param,
                    code="json_too_deep")


def reference_bytes(reference: Any, limit: int) -> bytes:
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
