"""The Storage interface: what every place job files live offers, and the outage error."""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

from vidserve.errors import VidserveError


def check_key(key: str) -> str:
    """`key`, if it is a relative path of non-empty parts; ValueError otherwise."""
    # Keys come from job ids and API input; none may name the root itself or reach outside it.
    # Rejecting empty parts covers "", absolute keys and "a//b"; "." and ".." are never needed.
    if "\\" in key or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid storage key {key!r}")
    return key


class StorageUnavailable(VidserveError):
    """The storage cannot be reached (a server down, a network cut): nothing is wrong with the
    request or the job, and the same call may work in a moment."""

    code = "storage_unavailable"


class Storage(ABC):
    #: Where the files are, for people: a directory, or s3://BUCKET/PREFIX.
    location: str = ""

    @abstractmethod
    def put_file(self, key: str, src_path: str | Path) -> str:
        """Store the finished file at `src_path` (consumed) under `key`; return the key."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """The file, open for reading (seekable); FileNotFoundError if there is none."""

    @abstractmethod
    def size(self, key: str) -> int:
        """The file's length in bytes; FileNotFoundError if there is none."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    def url(self, key: str, seconds: int, filename: str | None = None) -> str | None:
        """A URL that downloads the file for `seconds` (saved as `filename`) without this server,
        or None where the storage has no such URLs (the API then streams the file itself)."""
        return None

    def url_origin(self) -> str | None:
        """The scheme://host[:port] that `url` points to (None where there are no URLs): what a
        page must be allowed to fetch from to follow them."""
        url = self.url("origin", 60)
        if url is None:
            return None
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"

    def read_bytes(self, key: str) -> bytes:
        with self.open(key) as file:
            return file.read()

    def copy(self, src_key: str, dest_key: str) -> str:
        return self.put_bytes(dest_key, self.read_bytes(src_key))

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove every file under `prefix`, e.g. all of one job's files."""

    def probe(self) -> None:
        """Write, read back and delete a small file: the storage works for this process, or this
        raises (StorageUnavailable when it cannot be reached, the storage's own error otherwise)."""
        key = f"vidserve-probe/{secrets.token_hex(8)}"
        data = b"vidserve storage probe"
        try:
            self.put_bytes(key, data)
            if self.read_bytes(key) != data:
                raise OSError(f"{self.location}: a probe file read back different bytes")
        finally:
            self.delete_prefix(key)
