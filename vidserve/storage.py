"""Where job files (inputs, videos, thumbnails) live, addressed by keys like "video_abc/video.mp4".

Callers write, read, open, copy and delete through `Storage` and never see where a file
is: `LocalStorage` keeps files under a directory, `S3Storage` (vidserve/storage_s3.py) in a
bucket; `open_storage` picks one from the settings.
"""

from __future__ import annotations

import os
import secrets
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable
from urllib.parse import urlsplit

from vidserve.errors import VidserveError

if TYPE_CHECKING:
    from vidserve.config import Settings


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


class LocalStorage(Storage):
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.location = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def put_file(self, key: str, src_path: str | Path) -> str:
        dest = self._path(key)
        # Move next to the destination first (a copy if src is on another filesystem), then
        # rename into place: readers see either no file or the whole file, never a partial one.
        self._replace(dest, lambda tmp: shutil.move(os.fspath(src_path), tmp))
        return key

    def put_bytes(self, key: str, data: bytes) -> str:
        self._replace(self._path(key), lambda tmp: tmp.write_bytes(data))
        return key

    @staticmethod
    def _replace(dest: Path, write: Callable[[Path], object]) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
        try:
            write(tmp)
            os.replace(tmp, dest)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def open(self, key: str) -> BinaryIO:
        return self._path(key).open("rb")

    def size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete_prefix(self, prefix: str) -> None:
        # Locally a prefix is a folder ("video_abc" or "video_abc/"), so this cannot
        # catch "video_abcd" the way a raw string prefix in an object store would.
        target = self._path(prefix.rstrip("/"))
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)


def open_storage(settings: Settings) -> Storage:
    """The storage `settings.storage` names: "local" (data_dir/files) or "s3://BUCKET[/PREFIX]"."""
    if settings.storage == "local":
        return LocalStorage(settings.data_dir / "files")
    from vidserve.storage_s3 import S3Storage  # boto3 loads only where S3 is used

    return S3Storage.from_url(settings.storage, endpoint_url=settings.s3_endpoint_url)
