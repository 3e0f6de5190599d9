"""Where job files (inputs, videos, thumbnails) live, addressed by keys like "video_abc/video.mp4".

Callers write, read, open, copy and delete through `Storage` and never see where a file
is, so an object store can take the place of `LocalStorage`, which keeps files under a
directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import BinaryIO, Callable


class Storage(ABC):
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

    def read_bytes(self, key: str) -> bytes:
        with self.open(key) as file:
            return file.read()

    def copy(self, src_key: str, dest_key: str) -> str:
        return self.put_bytes(dest_key, self.read_bytes(src_key))

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove every file under `prefix`, e.g. all of one job's files."""


class LocalStorage(Storage):
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        # Keys come from job ids and API input; none may name the root itself or reach outside it.
        # Rejecting empty parts covers "", absolute keys and "a//b"; "." and ".." are never needed.
        parts = key.split("/")
        if "\\" in key or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"invalid storage key {key!r}")
        return self.root.joinpath(*parts)

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
