"""Webhook delivery for video-job events, signed per the Standard Webhooks spec.

Every request carries `webhook-id`, `webhook-timestamp` (unix seconds) and
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed with the
base64-decoded part of a `whsec_...` secret. The body is an OpenAI-shaped event:

    {"id": "evt_...", "object": "event", "type": "video.completed", "created_at": 1700000000,
     "data": {...the video object...}}

and the event id doubles as `webhook-id`, so a receiver can dedupe retries on either.

`WebhookSender.send` only enqueues: a GPU worker must never wait on someone else's server.
One daemon thread delivers from a heap ordered by due time, so a retry waits its backoff
in the heap instead of in a sleep, and other events go out meanwhile.
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import itertools
import json
import logging
import os
import random
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import httpx

from vidserve.config import Settings
from vidserve.jobs import Job, video_object

log = logging.getLogger("vidserve.webhooks")

SECRET_PREFIX = "whsec_"
EVENT_TYPES = frozenset({"video.completed", "video.failed", "video.cancelled"})


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def _secret_key(secret: str) -> bytes:
    if not secret.startswith(SECRET_PREFIX):
        raise ValueError(f"webhook secret must start with {SECRET_PREFIX!r}")
    try:
        return base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except ValueError as exc:  # binascii.Error is a ValueError; re-raise without echoing the secret
        raise ValueError("webhook secret is not valid base64 after the whsec_ prefix") from exc


def _signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one delivery attempt."""
    return "v1," + _signature(_secret_key(secret), msg_id, timestamp, body)


def verify(secret: str, headers: Mapping[str, str], body: bytes, tolerance_s: float = 300) -> bool:
    """True if `body` was signed with `secret` within `tolerance_s` of now (either side).

    The signature header may list several space-separated signatures (the sender is
    rotating secrets); one match is enough. Header names are matched case-insensitively.
    """
    key = _secret_key(secret)
    lowered = {k.lower(): v for k, v in headers.items()}
    msg_id = lowered.get("webhook-id")
    try:
        timestamp = int(lowered.get("webhook-timestamp", ""))
    except ValueError:
        return False
    # A stale (or far-future) timestamp means a replayed request, even if correctly signed.
    if not msg_id or abs(time.time() - timestamp) > tolerance_s:
        return False
    expected = _signature(key, msg_id, timestamp, body).encode()
    for entry in lowered.get("webhook-signature", "").split():
        version, _, sig = entry.partition(",")
        if version == "v1" and hmac.compare_digest(sig.encode(), expected):
            return True
    return False


@dataclass
class _Delivery:
    url: str
    event_id: str
    body: bytes  # fixed for the event's life, so every retry is byte-identical
    attempts: int = 0


class WebhookSender:
    """Delivers events in the background with retries; see the module docstring.

    `delivered` and `failed` count events (not attempts) that ended in a 2xx or were given up.
    """

    def __init__(
        self,
        secret: str,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 60.0,
        timeout_s: float = 10.0,
    ):
        self._key = _secret_key(secret)  # fail at startup on a bad secret, not on the first event
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.delivered = 0
        self.failed = 0
        self._client = httpx.Client(timeout=timeout_s)  # used by the worker thread only
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Delivery]] = []
        self._seq = itertools.count()  # tie-breaker so the heap never compares _Delivery objects
        self._deadline: float | None = None  # set by close()
        self._thread = threading.Thread(target=self._run, name="vidserve-webhooks", daemon=True)
        self._thread.start()

    def send(self, url: str, event_type: str, data: dict[str, Any]) -> None:
        """Queue one event for delivery to `url` and return at once."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"webhook URL must be an absolute http(s) URL, got {url!r}")
        if event_type not in EVENT_TYPES:
            raise ValueError(f"unknown webhook event type {event_type!r}")
        event_id = "evt_" + secrets.token_hex(16)
        event = {"id": event_id, "object": "event", "type": event_type, "created_at": int(time.time()), "data": data}
        # Serialise here so unserialisable data fails in the caller, not silently in the thread.
        body = json.dumps(event, separators=(",", ":")).encode()
        with self._cond:
            if self._deadline is not None:
                raise RuntimeError("WebhookSender is closed")
            self._push(time.monotonic(), _Delivery(url, event_id, body))

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what can be delivered within `timeout` seconds, then stop the thread.

        Events still waiting at the deadline are dropped and counted as failed.
        """
        with self._cond:
            if self._deadline is None:
                self._deadline = time.monotonic() + timeout
            self._cond.notify()
        self._thread.join(timeout)

    def _push(self, due: float, delivery: _Delivery) -> None:
        """Schedule a delivery; the caller holds `self._cond`."""
        heapq.heappush(self._heap, (due, next(self._seq), delivery))
        self._cond.notify()

    def _run(self) -> None:
        with self._client:
            while (delivery := self._next_due()) is not None:
                self._attempt(delivery)

    def _next_due(self) -> _Delivery | None:
        """Block until a delivery is due; None once closing and nothing more can go out in time."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._deadline is not None:
                    # Nothing left, the deadline passed, or the next event is due after it.
                    if not self._heap or max(now, self._heap[0][0]) > self._deadline:
                        if self._heap:
                            log.error("webhook sender closed with %d event(s) undelivered", len(self._heap))
                            self.failed += len(self._heap)
                            self._heap.clear()
                        return None
                if self._heap and self._heap[0][0] <= now:
                    return heapq.heappop(self._heap)[2]
                self._cond.wait(self._heap[0][0] - now if self._heap else None)

    def _attempt(self, d: _Delivery) -> None:
        timestamp = int(time.time())  # fresh per attempt, so retries are not rejected as stale
        headers = {
            "content-type": "application/json",
            "webhook-id": d.event_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": "v1," + _signature(self._key, d.event_id, timestamp, d.body),
        }
        d.attempts += 1
        try:
            status = self._client.post(d.url, content=d.body, headers=headers).status_code
            if 200 <= status < 300:
                self.delivered += 1
                return
            # 429 and 5xx are the receiver's transient trouble; any other status (including
            # redirects, which the spec treats as failures) will not change on a retry.
            retryable, reason = status == 429 or status >= 500, f"HTTP {status}"
        except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
            retryable, reason = True, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # anything else must not kill the only delivery thread
            retryable, reason = False, f"{type(exc).__name__}: {exc}"

        # Log the host only: webhook URLs often carry a token in their path or query.
        host = urlsplit(d.url).hostname
        if retryable and d.attempts < self.max_attempts:
            delay = min(self.max_delay_s, self.base_delay_s * 2 ** (d.attempts - 1)) * random.uniform(0.5, 1)
            log.warning(
                "webhook %s to %s failed (attempt %d/%d: %s); retrying in %.2fs",
                d.event_id, host, d.attempts, self.max_attempts, reason, delay,
            )
            with self._cond:
                self._push(time.monotonic() + delay, d)
        else:
            log.error("webhook %s to %s: giving up after %d attempt(s): %s", d.event_id, host, d.attempts, reason)
            self.failed += 1


def load_or_create_secret(settings) -> str:
    """The configured secret, or one made on first start and kept in the data dir, so
    receivers keep verifying across restarts and all processes sharing it sign alike."""
    if settings.webhook_secret:
        return settings.webhook_secret
    path = Path(settings.data_dir) / "webhook_secret"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_EXCL: when two processes start at once, one writes and both read the same secret
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as out:
            out.write(generate_secret() + "\n")
        log.info("made a webhook signing secret in %s", path)
    return path.read_text().strip()


def announce(webhooks: WebhookSender | None, settings: Settings, job: Job) -> None:
    """Send the job's terminal event to its webhook (or the server's), if any."""
    url = job.webhook_url or settings.webhook_url
    if webhooks is not None and url and job.status.terminal:
        webhooks.send(url, f"video.{job.status.value}", video_object(job))
