"""Serving a stored file over HTTP, read through the Storage interface, with single byte
ranges (206) so a browser's <video> can seek; or a 307 to the storage's own presigned URL,
so the bytes skip the API."""

from __future__ import annotations

import re
from typing import BinaryIO, Iterator

from fastapi.responses import RedirectResponse, Response, StreamingResponse

from vidserve.errors import echo
from vidserve.storage import Storage

from .errors import error_response

CHUNK_BYTES = 256 * 1024
# ASCII digits, at most 18, past any file's size: int() raises on a run of thousands.
_RANGE = re.compile(r"bytes=([0-9]{0,18})-([0-9]{0,18})")


def stored_file_response(storage: Storage, key: str, media_type: str, filename: str,
                         range_header: str | None, redirect_seconds: int | None = None) -> Response:
    """The file under `key` (FileNotFoundError if it is gone): whole, or the one range asked for.
    A header this does not serve (several ranges, another unit) gets the whole file, as HTTP allows.
    With `redirect_seconds`, a storage that presigns URLs answers 307 to one that works that long."""
    size = storage.size(key)  # before any redirect too: a file that is gone is a 404, not a dead link
    url = storage.url(key, redirect_seconds, filename) if redirect_seconds is not None else None
    if url is not None:
        # The URL expires: no cache may keep the redirect past it.
        return RedirectResponse(url, status_code=307, headers={"cache-control": "no-store"})
    headers = {"accept-ranges": "bytes", "content-disposition": f'attachment; filename="{filename}"'}
    span = _byte_range(range_header, size) if range_header else None
    if span == "unsatisfiable":
        return error_response(416, f"range {echo(range_header)} is not satisfiable: the file has {size} bytes",
                              param="Range", code="range_not_satisfiable",
                              headers={**headers, "content-range": f"bytes */{size}"})
    start, end = span or (0, size - 1)
    length = end - start + 1
    file = storage.open(key)
    try:
        file.seek(start)
        # The first bytes now, before the response begins: a storage that cannot serve them is
        # then an error response (503 for an outage), not a response cut off after its headers.
        first = file.read(min(CHUNK_BYTES, length))
    except BaseException:
        file.close()
        raise
    headers["content-length"] = str(length)
    if span is not None:
        headers["content-range"] = f"bytes {start}-{end}/{size}"
    return StreamingResponse(_read(file, first, length), status_code=200 if span is None else 206,
                             media_type=media_type, headers=headers)


def _byte_range(header: str, size: int) -> tuple[int, int] | str | None:
    """(first, last) byte of `bytes=A-B`, `bytes=A-` or `bytes=-N`; None to serve it all."""
    match = _RANGE.fullmatch(header.strip())
    if match is None or match.group(1) == match.group(2) == "":
        return None
    first, last = match.groups()
    if first == "":  # the last N bytes
        start, end = max(size - int(last), 0), size - 1
    else:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return "unsatisfiable"
    return start, end


def _read(file: BinaryIO, first: bytes, length: int) -> Iterator[bytes]:
    """`first`, then the rest of `length` bytes from `file`."""
    try:
        chunk = first
        while chunk:
            yield chunk
            length -= len(chunk)
            chunk = file.read(min(CHUNK_BYTES, length)) if length > 0 else b""
    finally:
        file.close()
