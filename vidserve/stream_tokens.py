"""Signed stream URLs. Players (a <video>, hls.js, ffmpeg, a CDN) cannot send an Authorization
header, so on a server with keys a video's HLS URLs carry a token instead: `EXPIRES.KEY.MAC`, its
expiry, the name of the API key it was issued for, and an HMAC-SHA256 of the video id, that name
and that expiry. The expiry is fixed when the link is issued: the playlist hands its segments the
token it was read with, never a later one, so a link ends when it says (and the same URLs across
reloads let URL-keyed caches work); the API refuses a token whose key is gone. Every API process of
a deployment must share the secret (`VIDSERVE_STREAM_SECRET`), or each makes and keeps its own in its
data directory.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import secrets
import time
from pathlib import Path

from vidserve.keys import KEY_NAME

log = logging.getLogger("vidserve.stream_tokens")


class StreamTokens:
    def __init__(self, secret: str, seconds: int):
        self._key = secret.encode()
        self.seconds = seconds

    def sign(self, video_id: str, key_name: str, now: float | None = None) -> str:
        """A token for the video's stream on behalf of key `key_name`, good for `seconds` from `now`."""
        expires = int(time.time() if now is None else now) + self.seconds
        return f"{expires}.{key_name}.{self._mac(video_id, key_name, expires)}"

    def check(self, video_id: str, token: str, now: float | None = None) -> str | None:
        """The name of the key `token` was issued for, if it was signed for this video and has not
        expired; else None."""
        expires, _, named = token.partition(".")
        key_name, _, mac = named.rpartition(".")  # key names may hold dots; the MAC (base64url) never does
        if not expires.isascii() or not expires.isdigit() or len(expires) > 12 or not KEY_NAME.fullmatch(key_name):
            return None
        if int(expires) < (time.time() if now is None else now):
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(video_id, key_name, int(expires)).encode()):
            return None
        return key_name

    def _mac(self, video_id: str, key_name: str, expires: int) -> str:
        # Newlines apart: no key name or expiry holds one, so no two (video, key, expiry) sign the same text.
        signed = f"{video_id}\n{key_name}\n{expires}".encode("utf-8", "surrogatepass")
        digest = hmac.new(self._key, signed, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def kept_secret(path: Path, what: str, make=lambda: secrets.token_urlsafe(32)) -> str:
    """The secret kept in `path`, made there on first use, so it survives restarts and every
    process sharing the folder uses the same."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: when two processes start at once, one writes and both read the same secret
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(make() + "\n")
        log.info("made a %s in %s", what, path)
    return path.read_text().strip()


def stream_tokens(settings) -> StreamTokens:
    secret = settings.stream_secret or kept_secret(Path(settings.data_dir) / "stream_secret", "stream URL secret")
    return StreamTokens(secret, settings.stream_url_seconds)
