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
`vidserve hash-key KEY` prints the line for a key.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from vidserve.errors import VidserveError, from_validation_error
from vidserve.priorities import Priority


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
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
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


class KeyRing:
    """The configured keys; `find` compares every digest in constant time, whatever the input."""

    def __init__(self, keys: list[ApiKey]):
        names = [k.name for k in keys]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise VidserveError(f"API key names must be unique; repeated: {', '.join(repeated)}")
        self.keys = keys
        self._callers = {key.name: Caller.of(key) for key in keys}  # made once: requests look them up

    @classmethod
    def from_settings(cls, api_keys: frozenset[str], keys_file: str | Path | None) -> "KeyRing":
        keys = [ApiKey(name=f"key-{key_digest(k)[:8]}", sha256=key_digest(k)) for k in sorted(api_keys)]
        if keys_file is not None:
            keys += _read_keys_file(Path(keys_file))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def find(self, token: bytes) -> ApiKey | None:
        digest = key_digest(token).encode()
        found = None
        for key in self.keys:  # no early exit: the time taken does not say which key matched
            if hmac.compare_digest(digest, key.sha256.encode()):
                found = key
        return found

    def caller(self, token: bytes) -> Caller | None:
        """The caller a key belongs to, or None for an unknown key."""
        key = self.find(token)
        return None if key is None else self._callers[key.name]


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
