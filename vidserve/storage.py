"""Where job files (inputs, videos, thumbnails) live, addressed by keys like "video_abc/video.mp4".

`Storage` is the seam for an object store later; `LocalStorage` keeps files under a directory.
"""

from __future__ import annotations

import os
import secrets
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable


class Storage(ABC):
    @abstractmethod
    def put_file(self, key: str, src_path: str | Path) -> str:
        """Store the finished file at `src_path` (consumed) under `key`; return the key."""

    @abstractmethod
    def put_bytes(self, key: str, data: bytes) -> str: ...

    @abstractmethod
    def path(self, key: str) -> Path:
        """A local path to read the file from (for serving it)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove every file under `prefix`, e.g. all of one job's files."""


class LocalStorage(Storage):
    def __init__(self, root: str | Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        # Keys come from job ids and API input; none may name the root itself or reach outside it.
        # Rejecting empty parts covers "", absolute keys and "a//b"; "." and ".." are never needed.
        parts = key.split("/")
        if "\\" in key or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"invalid storage key {key!r}")
        return self.root.joinpath(*parts)

    def put_file(self, key: str, src_path: str | Path) -> str:
        dest = self.path(key)
        # Move next to the destination first (a copy if src is on another filesystem), then
        # rename into place: readers see either no file or the whole file, never a partial one.
        self._replace(dest, lambda tmp: shutil.move(os.fspath(src_path), tmp))
        return key

    def put_bytes(self, key: str, data: bytes) -> str:
        self._replace(self.path(key), lambda tmp: tmp.write_bytes(data))
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

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete_prefix(self, prefix: str) -> None:
        # Locally a prefix is a folder ("video_abc" or "video_abc/"), so this cannot
        # catch "video_abcd" the way a raw string prefix in an object store would.
        target = self.path(prefix.rstrip("/"))
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
