"""vidserve.webhooks: Standard Webhooks signing, and delivery to real local HTTP receivers:
retries, concurrency across receivers, order within one, and events kept across a restart."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import socket
import threading
import time
import uuid

import pytest
from apps import app_client, idle_services
from polling import eventually
from receivers import Receiver

from vidserve.jobs.store_redis import RedisJobStore
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.webhooks import WebhookSender, generate_secret, sign, verify

SECRET = "whsec_" + base64.b64encode(b"0123456789abcdefghijklmn").decode()
VIDEO = {"id": "video_abc", "object": "video", "status": "completed"}


def signed_headers(secret: str, body: bytes, msg_id: str = "msg_1", timestamp: int | None = None) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, msg_id, timestamp, body),
    }


def test_sign_matches_hand_computed_hmac():
    body = b'{"type":"video.completed"}'
    digest = hmac.new(b"0123456789abcdefghijklmn", b"msg_1.1700000000." + body, hashlib.sha256).digest()
    assert sign(SECRET, "msg_1", 1700000000, body) == "v1," + base64.b64encode(digest).decode()


def test_sign_matches_published_standard_webhooks_vector():
    # The test vector shared by the Standard Webhooks reference libraries.
    sig = sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_generate_secret_is_whsec_with_24_random_bytes():
    a, b = generate_secret(), generate_secret()
    assert a.startswith("whsec_") and a != b
    assert len(base64.b64decode(a.removeprefix("whsec_"))) == 24


def test_verify_accepts_valid_and_rejects_tampering_wrong_secret_and_stale():
    body = b'{"id":"evt_1"}'
    headers = signed_headers(SECRET, body)
    assert verify(SECRET, headers, body)
    assert verify(SECRET, {k.upper(): v for k, v in headers.items()}, body)  # names are case-insensitive
    assert not verify(SECRET, headers, b'{"id":"evt_2"}')
    assert not verify(generate_secret(), headers, body)
    assert not verify(SECRET, signed_headers(SECRET, body, timestamp=int(time.time()) - 301), body)
    assert not verify(SECRET, signed_headers(SECRET, body, timestamp=int(time.time()) + 301), body)
    assert not verify(SECRET, {}, body)


def test_verify_accepts_any_matching_signature_in_a_list():
    body = b"{}"
    headers = signed_headers(SECRET, body)
    other = signed_headers(generate_secret(), body, timestamp=int(headers["webhook-timestamp"]))
    headers["webhook-signature"] = f"{other['webhook-signature']} v2,bogus {headers['webhook-signature']}"
    assert verify(SECRET, headers, body)


def test_bad_secret_is_rejected():
    with pytest.raises(ValueError):
        sign("not-a-secret", "msg_1", 1, b"")
    with pytest.raises(ValueError):
        WebhookSender("whsec_***")


@pytest.fixture(autouse=True)
def no_proxy(monkeypatch):
    # httpx honours proxy variables; keep test traffic on the local receivers.
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


def loopback_sender(**options) -> WebhookSender:
    """A sender allowed to reach the 127.0.0.1 receivers of these tests."""
    return WebhookSender(SECRET, allow_private_urls=True, **options)


@pytest.fixture
def receiver():
    made = []

    def make(**kwargs):
        made.append(Receiver(**kwargs))
        return made[-1]

    yield make
    for r in made:
        r.close()


def test_retries_503_with_same_id_and_body_then_delivers(receiver):
    r = receiver(statuses=[503, 503])
    sender = loopback_sender(base_delay_s=0.01)
    sender.send(r.url, "video.completed", VIDEO)
    sender.close(timeout=5)

    assert len(r.requests) == 3
    assert (sender.delivered, sender.failed) == (1, 0)
    assert all(verify(SECRET, headers, body) for headers, body in r.requests)
    assert len({headers["webhook-id"] for headers, _ in r.requests}) == 1
    assert len({body for _, body in r.requests}) == 1

    headers, body = r.requests[-1]
    event = json.loads(body)
    assert event["id"] == headers["webhook-id"] and event["id"].startswith("evt_")
    assert event["object"] == "event" and event["type"] == "video.completed"
    assert isinstance(event["created_at"], int) and event["data"] == VIDEO
    assert headers["content-type"] == "application/json"


def test_400_is_not_retried(receiver, caplog):
    r = receiver(default=400)
    sender = loopback_sender(base_delay_s=0.01)
    with caplog.at_level(logging.WARNING, logger="vidserve.webhooks"):
        sender.send(r.url, "video.failed", VIDEO)
        sender.close(timeout=5)
    assert len(r.requests) == 1
    assert (sender.delivered, sender.failed) == (0, 1)
    assert "giving up after 1 attempt" in caplog.text


def test_connection_errors_are_retried_then_given_up(caplog):
    with socket.socket() as s:  # a port that was free a moment ago: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sender = loopback_sender(max_attempts=3, base_delay_s=0.01)
    with caplog.at_level(logging.WARNING, logger="vidserve.webhooks"):
        sender.send(f"http://127.0.0.1:{port}/", "video.cancelled", VIDEO)
        sender.close(timeout=5)
    assert (sender.delivered, sender.failed) == (0, 1)
    assert caplog.text.count("retrying in") == 2
    assert "giving up after 3 attempt" in caplog.text


def test_send_returns_while_the_receiver_has_not_answered(receiver):
    answer = threading.Event()
    r = receiver(hold_until=answer)
    sender = loopback_sender(base_delay_s=0.01)
    sender.send(r.url, "video.completed", VIDEO)
    eventually(lambda: r.requests, what="the first delivery to reach the receiver")
    sender.send(r.url, "video.completed", VIDEO)  # while the first delivery is in flight
    assert sender.delivered == 0  # both sends came back before the receiver answered either
    answer.set()
    sender.close(timeout=5)
    assert sender.delivered == 2


def test_retry_backoff_does_not_hold_up_other_events(receiver):
    flaky, ok = receiver(default=503), receiver()
    # The retry is due 1-2 s after the first attempt fails, far longer than a delivery on loopback
    # takes: the other event can go out first only if the backoff does not block the sender.
    sender = loopback_sender(max_attempts=2, base_delay_s=2.0)
    sender.send(flaky.url, "video.failed", VIDEO)
    eventually(lambda: flaky.requests, what="the first attempt")
    sender.send(ok.url, "video.completed", VIDEO)
    eventually(lambda: sender.delivered == 1, what="the other event")
    assert len(flaky.requests) == 1  # the other event went out while the retry waited
    sender.close(timeout=5)
    assert (len(flaky.requests), sender.delivered, sender.failed) == (2, 1, 1)


def test_close_drains_queued_events(receiver):
    r = receiver()
    sender = loopback_sender()
    for _ in range(5):
        sender.send(r.url, "video.completed", VIDEO)
    sender.close(timeout=5)
    assert len(r.requests) == 5 and sender.delivered == 5
    with pytest.raises(RuntimeError):
        sender.send(r.url, "video.completed", VIDEO)


def test_close_drops_retries_due_after_the_deadline(receiver):
    r = receiver(default=503)
    sender = loopback_sender(base_delay_s=30)
    sender.send(r.url, "video.completed", VIDEO)
    eventually(lambda: r.requests, what="the first attempt")
    sender.close(timeout=2)
    assert len(r.requests) == 1 and (sender.delivered, sender.failed) == (0, 1)


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "example.com/hook", "http:///nohost"])
def test_send_rejects_non_http_urls(url):
    sender = loopback_sender()
    with pytest.raises(ValueError):
        sender.send(url, "video.completed", VIDEO)
    sender.close(timeout=1)


def test_send_rejects_unknown_event_types():
    sender = loopback_sender()
    with pytest.raises(ValueError):
        sender.send("http://127.0.0.1:9/", "video.exploded", VIDEO)
    sender.close(timeout=1)


def test_a_receiver_that_never_answers_does_not_hold_up_another(receiver):
    release = threading.Event()
    stuck, other = receiver(hold_until=release), receiver()
    sender = loopback_sender()
    try:
        sender.send(stuck.url, "video.completed", VIDEO)
        eventually(lambda: stuck.requests, what="the first event to reach the receiver that holds it")
        sender.send(other.url, "video.completed", VIDEO)
        eventually(lambda: sender.delivered == 1, what="the other receiver's event")
        # Delivered while the first receiver still holds its request open, not after it.
        assert len(other.requests) == 1 and stuck.answered == 0
    finally:
        release.set()
        sender.close(timeout=5)
    assert (sender.delivered, sender.failed) == (2, 0)


def test_each_receiver_gets_its_events_in_order_one_at_a_time(receiver):
    r = receiver(statuses=[503])  # the first event needs a retry, and the events behind it wait for it
    sender = loopback_sender(base_delay_s=0.01)
    for i in range(5):
        sender.send(r.url, "video.completed", {**VIDEO, "id": f"video_{i}"})
    sender.close(timeout=10)
    assert [json.loads(body)["data"]["id"] for _, body in r.requests] == ["video_0", "video_0", "video_1", "video_2",
                                                                          "video_3", "video_4"]
    assert r.most_open == 1 and (sender.delivered, sender.failed) == (5, 0)


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = SQLiteJobStore(tmp_path / "jobs.sqlite")
    else:  # a fresh prefix keeps each test's records apart on the shared server
        s = RedisJobStore(request.getfixturevalue("redis_url"), prefix=f"hooks-{uuid.uuid4().hex}")
    yield s
    s.close()


def test_an_undelivered_event_survives_a_restart(receiver, store):
    r = receiver(statuses=[503])  # the first attempt fails; its retry would be due long after the restart
    first = loopback_sender(store=store, base_delay_s=60)
    first.send(r.url, "video.completed", VIDEO)
    assert len(store.pending_deliveries()) == 1  # recorded before it could go out
    eventually(lambda: r.answered, what="the first attempt")
    first.close(timeout=0)
    [(_, pending)] = store.pending_deliveries()

    second = loopback_sender(store=store)  # the restarted process, on the same store
    assert second.resume_pending() == 1
    second.close(timeout=5)
    assert (second.delivered, second.failed) == (1, 0) and store.pending_deliveries() == []
    (headers_1, body_1), (headers_2, body_2) = r.requests
    assert headers_1["webhook-id"] == headers_2["webhook-id"] == pending.event_id and body_1 == body_2
    assert verify(SECRET, headers_2, body_2)


def test_an_api_that_starts_sends_what_a_stopped_one_left_pending(receiver, tmp_path):
    store = SQLiteJobStore(tmp_path / "jobs.sqlite")
    r = receiver(statuses=[503])
    stopped = loopback_sender(store=store, base_delay_s=60)
    stopped.send(r.url, "video.completed", VIDEO)
    eventually(lambda: r.answered, what="the first attempt")
    stopped.close(timeout=0)
    services = idle_services(tmp_path, store=store)
    services.webhooks.close(timeout=0)  # idle_services' sender keeps no outbox; this API resends from the store's
    services.webhooks = loopback_sender(store=store)
    with app_client(tmp_path, services):
        eventually(lambda: len(r.requests) == 2, what="the pending event, sent as the API starts")
        eventually(lambda: store.pending_deliveries() == [], what="the delivery to leave the store")
    (headers_1, body_1), (headers_2, body_2) = r.requests  # the same event, signed anew when sent again
    assert headers_1["webhook-id"] == headers_2["webhook-id"] and body_1 == body_2
    assert verify(SECRET, headers_2, body_2)


def test_a_redirect_is_not_followed(receiver):
    elsewhere = receiver()
    r = receiver(default=307, headers={"location": elsewhere.url})
    sender = loopback_sender(base_delay_s=0.01)
    sender.send(r.url, "video.completed", VIDEO)
    sender.close(timeout=5)
    assert r.requests and elsewhere.requests == [] and sender.delivered == 0


def test_an_event_given_up_leaves_the_store(receiver, store):
    r = receiver(default=400)
    sender = loopback_sender(store=store)
    sender.send(r.url, "video.failed", VIDEO)
    sender.close(timeout=5)
    assert sender.failed == 1 and store.pending_deliveries() == []
