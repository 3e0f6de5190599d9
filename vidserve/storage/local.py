"""`LocalStorage`: job files under a directory, for one machine or a shared disk."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path
from typing import BinaryIO, Callable

from .base import Storage, check_key


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
