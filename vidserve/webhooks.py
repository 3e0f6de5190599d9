"""Webhook delivery for video-job events, signed per the Standard Webhooks spec.

Every request carries `webhook-id`, `webhook-timestamp` (unix seconds) and
`webhook-signature: v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`, keyed with the
base64-decoded part of a `whsec_...` secret. The body is an OpenAI-shaped event:

    {"id": "evt_...", "object": "event", "type": "video.completed", "created_at": 1700000000,
     "data": {...the video object...}}

and the event id doubles as `webhook-id`, so a receiver can dedupe retries on either.

`WebhookSender.send` only enqueues: a GPU worker must never wait on someone else's server.
A few delivery threads (`webhook_workers`) share the work, so a receiver that is slow to
answer holds up one thread, not everyone's events. Each receiver URL has a lane: its events
go out in the order they were sent, one at a time, and a retry holds back the events behind
it. A lane's next send waits in a heap ordered by due time, so a backoff costs no thread.

With a job store, every event is recorded there before it can go out and forgotten once
delivered or given up; when the API process starts, it sends whatever any process left
recorded (`resume_pending`), so an event that a live process was still delivering may
arrive twice, with the same `webhook-id`. Every connection goes through
`vidserve.outbound`, which refuses non-public addresses unless `allow_private_urls` (a
refused send is a failed delivery, not retried).
"""

from __future__ import annotations

import base64
import hashlib
import heapq
import hmac
import itertools
import json
import logging
import random
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

import httpx

from vidserve import outbound
from vidserve.config import Settings
from vidserve.jobs import Job, JobStore, WebhookDelivery
from vidserve.jobs.video_object import VideoChunkEvent, VideoObject
from vidserve.stream_tokens import kept_secret

log = logging.getLogger("vidserve.webhooks")

SECRET_PREFIX = "whsec_"
EVENT_TYPES = frozenset({"video.completed", "video.failed", "video.cancelled", "video.chunk"})


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
    store_id: str | None = None  # its record in the job store, if it has one
    attempts: int = 0


class WebhookSender:
    """Delivers events in the background with retries; see the module docstring.

    `delivered` and `failed` count events (not attempts) that ended in a 2xx or were given up.
    """

    def __init__(
        self,
        secret: str,
        store: JobStore | None = None,
        *,
        workers: int = 4,
        max_attempts: int = 5,
        base_delay_s: float = 1.0,
        max_delay_s: float = 60.0,
        timeout_s: float = 10.0,
        allow_private_urls: bool = False,
    ):
        self._key = _secret_key(secret)  # fail at startup on a bad secret, not on the first event
        self.store = store
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.delivered = 0
        self.failed = 0
        self._client = outbound.client(allow_private_urls, timeout_s)  # shared by the delivery threads
        self._cond = threading.Condition()
        self._lanes: dict[str, deque[_Delivery]] = {}  # receiver URL -> its undelivered events, oldest first
        self._due: list[tuple[float, int, str]] = []  # heap of (when, tie-breaker, url): a lane's head may go then
        self._seq = itertools.count()
        self._deadline: float | None = None  # set by close()
        self._threads = [threading.Thread(target=self._run, name=f"vidserve-webhooks-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

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
        delivery = _Delivery(url, event_id, json.dumps(event, separators=(",", ":")).encode())
        with self._cond:
            if self._deadline is not None:
                raise RuntimeError("WebhookSender is closed")
            delivery.store_id = self._record(delivery)
            self._enqueue(delivery)

    def resume_pending(self) -> int:
        """Queue the events the job store holds as undelivered (left by an earlier process); how many."""
        pending = self.store.pending_deliveries() if self.store is not None else []
        with self._cond:
            for store_id, d in pending:
                self._enqueue(_Delivery(d.url, d.event_id, d.body.encode(), store_id))
        if pending:
            log.info("sending %d webhook event(s) left undelivered by an earlier process", len(pending))
        return len(pending)

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what can be delivered within `timeout` seconds, then stop the threads.

        Events still waiting at the deadline are counted as failed; they stay in the job
        store, if there is one, for the next start.
        """
        with self._cond:
            if self._deadline is None:
                self._deadline = time.monotonic() + timeout
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(max(0.0, self._deadline - time.monotonic()))
        with self._cond:
            left = sum(len(lane) for lane in self._lanes.values())
            self._lanes.clear()
            self._due.clear()
            self.failed += left
        if left:
            log.error("webhook sender closed with %d event(s) undelivered%s", left,
                      "; they stay in the job store for the next start" if self.store is not None else "")
        if not any(thread.is_alive() for thread in self._threads):
            self._client.close()  # else a thread still waits on a receiver, until its timeout

    def _enqueue(self, delivery: _Delivery) -> None:
        """Add to the end of its receiver's lane; the caller holds `self._cond`."""
        lane = self._lanes.setdefault(delivery.url, deque())
        lane.append(delivery)
        if len(lane) == 1:  # the receiver had nothing pending: its lane can go now
            self._schedule(delivery.url, time.monotonic())

    def _schedule(self, url: str, due: float) -> None:
        """Let the lane's head go out at `due`; the caller holds `self._cond`."""
        heapq.heappush(self._due, (due, next(self._seq), url))
        self._cond.notify()

    def _run(self) -> None:
        while (delivery := self._next_due()) is not None:
            self._attempt(delivery)

    def _next_due(self) -> _Delivery | None:
        """Block until a lane is due and take its head; None once closing and nothing more can go out in time.

        A lane taken is off the heap until its head is done or rescheduled, so no other
        thread sends to that receiver meanwhile.
        """
        with self._cond:
            while True:
                now = time.monotonic()
                if self._deadline is not None:
                    # Nothing left, the deadline passed, or the next event is due after it.
                    if not self._due or max(now, self._due[0][0]) > self._deadline:
                        return None
                if self._due and self._due[0][0] <= now:
                    return self._lanes[heapq.heappop(self._due)[2]][0]
                self._cond.wait(self._due[0][0] - now if self._due else None)

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
                self._finish(d, delivered=True)
                return
            # 429 and 5xx are the receiver's transient trouble; any other status (including
            # redirects, which the spec treats as failures) will not change on a retry.
            retryable, reason = status == 429 or status >= 500, f"HTTP {status}"
        except outbound.URLNotAllowed as exc:  # the host resolves to a private address now
            retryable, reason = False, f"refused: {exc.message}"
        except httpx.TransportError as exc:  # connect errors, timeouts, dropped connections
            retryable, reason = True, f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # anything else must not kill a delivery thread
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
                if d.url in self._lanes:  # not given up by close() meanwhile
                    self._schedule(d.url, time.monotonic() + delay)
        else:
            log.error("webhook %s to %s: giving up after %d attempt(s): %s", d.event_id, host, d.attempts, reason)
            self._finish(d, delivered=False)

    def _finish(self, d: _Delivery, delivered: bool) -> None:
        """The event is delivered or given up: forget it, and let its receiver's next event go."""
        self._forget(d)
        with self._cond:
            lane = self._lanes.get(d.url)
            if lane is None:  # close() gave up on it meanwhile, and counted it
                return
            if delivered:
                self.delivered += 1
            else:
                self.failed += 1
            lane.popleft()
            if lane:
                self._schedule(d.url, time.monotonic())
            else:
                del self._lanes[d.url]

    def _record(self, d: _Delivery) -> str | None:
        if self.store is None:
            return None
        try:
            return self.store.add_delivery(WebhookDelivery(url=d.url, event_id=d.event_id, body=d.body.decode()))
        except Exception:  # the event still goes out from memory; only a restart before then loses it
            log.warning("could not record webhook %s in the job store", d.event_id, exc_info=True)
            return None

    def _forget(self, d: _Delivery) -> None:
        if self.store is None or d.store_id is None:
            return
        try:
            self.store.delivery_done(d.store_id)
        except Exception:  # a delivery thread must not die of it; the next start sends the event again
            log.warning("could not mark webhook %s done in the job store", d.event_id, exc_info=True)


def load_or_create_secret(settings) -> str:
    """The configured secret, or one made on first start and kept in the data dir, so
    receivers keep verifying across restarts and all processes sharing it sign alike."""
    if settings.webhook_secret:
        return settings.webhook_secret
    return kept_secret(Path(settings.data_dir) / "webhook_secret", "webhook signing secret", generate_secret)


def build_sender(settings: Settings, store: JobStore) -> WebhookSender:
    """The process's sender as the settings configure it, recording undelivered events in `store`."""
    return WebhookSender(load_or_create_secret(settings), store, workers=settings.webhook_workers,
                         allow_private_urls=settings.allow_private_urls)


def announce(webhooks: WebhookSender | None, settings: Settings, job: Job) -> None:
    """Send the job's terminal event to its webhook (or the server's), if any and subscribed."""
    url = job.webhook_url or settings.webhook_url
    event = f"video.{job.status.value}"
    subscribed = job.webhook_events is None or event in job.webhook_events
    if webhooks is not None and url and job.status.terminal and subscribed:
        webhooks.send(url, event, VideoObject.of(job).model_dump(mode="json"))


def announce_chunk(webhooks: WebhookSender | None, settings: Settings, job: Job, index: int) -> None:
    """Send `video.chunk` for chunk `index` (now playable) where the job's webhook subscribed to it:
    the chunk as the event stream tells of it."""
    url = job.webhook_url or settings.webhook_url
    if webhooks is not None and url and "video.chunk" in (job.webhook_events or ()):
        chunk = next(c for c in job.chunks if c.index == index)
        segment = next((s.name for s in job.segments if s.chunk == index), None)
        webhooks.send(url, "video.chunk", VideoChunkEvent.of(job.id, chunk, segment).model_dump(mode="json"))
