"""API keys: who is calling, what they may see, and the limits that apply to them.

Keys come from `VIDSERVE_API_KEYS` (plain keys, each a `user` with the server's default
quotas) and from a keys file (`--keys-file`, TOML or JSON) that names each key, gives it a
role and its own quotas, and holds only the key's SHA-256:

    [[keys]]
    name = "team-a"
    sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    role = "user"                 # or "admin": sees every key's jobs
    max_active_jobs = 4           # queued + running
    requests_per_minute = 120
    max_streams = 16              # open event streams, per API process
    max_seconds = 10              # per video; also max_side, max_steps
    max_priority = "normal"       # the highest priority its jobs may ask for ("high" for admins by default)
    share = 1.0                   # its weight in the fair share of workers: 2.0 gets twice a 1.0 key's starts

A job records its owner's `name`, never the key. Keys are long random secrets, so a plain
SHA-256 (not a slow password hash) is enough to keep the file from leaking them.
`vidserve hash-key KEY` prints the line for a key. The file is read again when it changes, so a
key removed from it stops working (its stream links too) without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vidserve.errors import VidserveError, from_validation_error
from vidserve.priorities import Priority

log = logging.getLogger("vidserve.keys")

_NAME_CHARS = "[A-Za-z0-9_.@-]"
KEY_NAME = re.compile(rf"{_NAME_CHARS}{{1,64}}")  # what ApiKey.name accepts


def key_digest(key: str | bytes) -> str:
    raw = key if isinstance(key, bytes) else key.encode("utf-8", "surrogateescape")
    return hashlib.sha256(raw).hexdigest()


class Quotas(BaseModel):
    """Limits per key; None: the server's default (Settings), 0 where noted: unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_active_jobs: int | None = Field(None, ge=0, description="Queued + running jobs at once (0: unlimited).")
    requests_per_minute: int | None = Field(None, ge=0, description="Requests per minute, a burst of as many "
                                                                     "(0: unlimited).")
    max_streams: int | None = Field(None, ge=0, description="Event streams open at once, per API process "
                                                            "(0: unlimited).")
    max_seconds: float | None = Field(None, gt=0, description="Longest video one request may ask for.")
    max_side: int | None = Field(None, gt=0, description="Largest width or height one request may ask for.")
    max_steps: int | None = Field(None, gt=0, description="Most denoising steps one request may ask for.")
    max_priority: Priority | None = Field(None, description="The highest priority its jobs may ask for "
                                          "(None: high for admins, normal for users).")


class ApiKey(Quotas):
    name: str = Field(min_length=1, max_length=64, pattern=rf"^{_NAME_CHARS}+$")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    role: Literal["user", "admin"] = "user"
    share: float = Field(1.0, gt=0, description="Its weight in the fair share of workers among keys with "
                         "jobs waiting.")

    @field_validator("sha256", mode="before")
    @classmethod
    def _lower(cls, value):
        return value.lower() if isinstance(value, str) else value


_QUOTAS = set(Quotas.model_fields)


class Caller(BaseModel):
    """Who made a request. `name` None: the server has no keys, and everyone sees everything."""

    model_config = ConfigDict(frozen=True)

    name: str | None = None
    role: Literal["user", "admin"] = "admin"
    quotas: Quotas = Quotas()
    share: float = 1.0

    @classmethod
    def of(cls, key: "ApiKey") -> "Caller":
        return cls(name=key.name, role=key.role, quotas=Quotas.model_validate(key.model_dump(include=_QUOTAS)),
                   share=key.share)

    @property
    def max_priority(self) -> Priority:
        return self.quotas.max_priority or ("high" if self.role == "admin" else "normal")

    @property
    def scope(self) -> str | None:
        """Whose jobs this caller sees: its own, or None for all (an admin, or no keys at all)."""
        return None if self.role == "admin" else self.name

    def sees(self, owner: str | None) -> bool:
        return self.scope is None or owner == self.scope

    def limit(self, quota: str, default):
        """The caller's own value of a quota, or the server's default for keys that set none."""
        own = getattr(self.quotas, quota)
        return default if own is None else own


ANONYMOUS = Caller()


@dataclass(frozen=True)
class _Keys:
    """One reading of the keys, swapped whole when the keys file changes."""

    keys: tuple[ApiKey, ...]
    callers: dict[str, Caller]  # made once per reading: requests look them up

    @classmethod
    def of(cls, keys: list[ApiKey]) -> "_Keys":
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise VidserveError(f"API key names must be unique; repeated: {', '.join(repeated)}")
        return cls(tuple(keys), {key.name: Caller.of(key) for key in keys})


class KeyRing:
    """The configured keys; `find` compares every digest in constant time, whatever the input.

    A keys file is read again once it changes (looked at no more than every RECHECK_SECONDS), so
    removing a key revokes it without a restart. A file that no longer reads keeps the keys read
    before it (logged): a half-saved edit must not lock everyone out. A server started with keys
    always requires one, whatever the file later holds."""

    RECHECK_SECONDS = 1.0

    def __init__(self, keys: list[ApiKey], keys_file: Path | None = None):
        self._fixed = keys  # from VIDSERVE_API_KEYS: they never change
        self._file = keys_file
        self._stamp = _stamp(keys_file)  # taken before reading: a change during the read is read next time
        self._current = _Keys.of(keys + (_read_keys_file(keys_file) if keys_file is not None else []))
        self._next_look = time.monotonic() + self.RECHECK_SECONDS
        self._reading = threading.Lock()
        self.enabled = bool(self._current.keys)

    @classmethod
    def from_settings(cls, api_keys: frozenset[str], keys_file: str | Path | None) -> "KeyRing":
        keys = [ApiKey(name=f"key-{key_digest(k)[:8]}", sha256=key_digest(k)) for k in sorted(api_keys)]
        return cls(keys, None if keys_file is None else Path(keys_file))

    @property
    def keys(self) -> tuple[ApiKey, ...]:
        return self._fresh().keys

    def find(self, token: bytes) -> ApiKey | None:
        return self._find(self._fresh(), token)

    def caller(self, token: bytes) -> Caller | None:
        """The caller a key belongs to, or None for an unknown key."""
        current = self._fresh()
        key = self._find(current, token)
        return None if key is None else current.callers[key.name]

    def named(self, name: str) -> Caller | None:
        """The caller of the key named `name`, or None when no key has that name (any more)."""
        return self._fresh().callers.get(name)

    @staticmethod
    def _find(current: _Keys, token: bytes) -> ApiKey | None:
        digest = key_digest(token).encode()
        found = None
        for key in current.keys:  # no early exit: the time taken does not say which key matched
            if hmac.compare_digest(digest, key.sha256.encode()):
                found = key
        return found

    def _fresh(self) -> _Keys:
        """The keys, read again first if the keys file has changed since they were read."""
        if self._file is None or time.monotonic() < self._next_look:
            return self._current
        # One caller looks while the rest go on with the keys they have (the event loop never waits here).
        if self._reading.acquire(blocking=False):
            try:
                self._next_look = time.monotonic() + self.RECHECK_SECONDS
                stamp = _stamp(self._file)
                if stamp != self._stamp:
                    self._stamp = stamp
                    self._reread()
            finally:
                self._reading.release()
        return self._current

    def _reread(self) -> None:
        try:
            current = _Keys.of(self._fixed + _read_keys_file(self._file))
        except VidserveError as exc:
            log.error("%s; keeping the %d keys read before", exc, len(self._current.keys))
            return
        self._current = current
        log.info("keys file %s read again: %d keys", self._file, len(current.keys))


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    """What changes when a file is written or replaced: its inode, size and modification time."""
    try:
        stat = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if stat is None else (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _read_keys_file(path: Path) -> list[ApiKey]:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise VidserveError(f"keys file {path} could not be read: {exc}") from None
    entries = data.get("keys") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise VidserveError(f"keys file {path} must hold a list of keys under 'keys' ([[keys]] in TOML)")
    keys = []
    for index, entry in enumerate(entries):
        try:
            keys.append(ApiKey.model_validate(entry))
        except ValidationError as exc:
            raise VidserveError(f"keys file {path}: {from_validation_error(exc, f'keys[{index}]')}") from None
    return keys
