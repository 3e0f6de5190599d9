"""vidserve.outbound: webhook and chat image URLs never reach the server's own network.

Names resolve through a stub (`resolver`), and every test that hands the server a URL it
must refuse runs in its own network namespace (tests/netns.py) with a guard that records
and fails any connect (`connections`), so a broken policy fails the test and still
reaches nothing.
"""

from __future__ import annotations

import logging
import socket

import pytest
from apps import app_client, idle_services
from receivers import Receiver

from vidserve.outbound import URLNotAllowed, check_url, is_public
from vidserve.webhooks import WebhookSender, generate_secret

# The names the stub resolver knows; any other name does not resolve.
NAMES = {"evil.example": ["127.0.0.1"], "public.example": ["93.184.216.34"], "mixed.example": ["93.184.216.34",
                                                                                              "10.1.2.3"]}
REFUSED = ["http://127.0.0.1:9/hook", "http://10.0.0.1/hook", "http://169.254.169.254/latest/meta-data",
           "http://[::1]/hook", "http://evil.example/hook"]


@pytest.fixture
def resolver(monkeypatch):
    """socket.getaddrinfo answering from NAMES (and for IP literals); returns the names looked up."""
    real, lookups = socket.getaddrinfo, []

    def getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
        lookups.append(host)
        answers = NAMES.get(host, [host])
        return [info for address in answers for info in real(address, port, family, type, proto,
                                                              flags | socket.AI_NUMERICHOST)]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return lookups


@pytest.fixture
def connections(monkeypatch):
    """Every connect is recorded and refused; the test asserts the list stays empty."""
    attempts = []

    def connect(sock, address):
        attempts.append(address)
        raise ConnectionRefusedError(f"test guard: no connections ({address})")

    def create_connection(address, *args, **kwargs):
        attempts.append(address)
        raise ConnectionRefusedError(f"test guard: no connections ({address})")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect)
    monkeypatch.setattr(socket, "create_connection", create_connection)
    return attempts


@pytest.mark.parametrize("address", [
    "127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.169.254", "0.0.0.0",
    "224.0.0.1", "240.0.0.1", "255.255.255.255", "::1", "::", "fe80::1", "fe80::1%eth0", "fc00::1", "fd12::1",
    "ff02::1", "::ffff:127.0.0.1", "::ffff:169.254.169.254", "::127.0.0.1", "2002:7f00:1::", "64:ff9b::a00:1",
])
def test_non_public_addresses(address):
    assert not is_public(address)


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8",
                                     "2002:808:808::"])
def test_public_addresses(address):
    assert is_public(address)


@pytest.mark.parametrize("url", ["ftp://example.com/x", "file:///etc/passwd", "example.com/hook", "http:///nohost"])
def test_only_absolute_http_urls(url):
    with pytest.raises(URLNotAllowed, match="absolute http"):
        check_url(url, allow_private=True)


def test_check_url_resolves_and_judges_every_address(resolver):
    check_url("https://public.example/hook", allow_private=False)
    for url in REFUSED:
        with pytest.raises(URLNotAllowed, match="not a public address") as refused:
            check_url(url, allow_private=False, param="webhook_url")
        assert (refused.value.param, refused.value.code) == ("webhook_url", "url_not_allowed")
    with pytest.raises(URLNotAllowed, match="10.1.2.3"):  # one private answer among public ones is enough
        check_url("http://mixed.example/", allow_private=False)
    with pytest.raises(URLNotAllowed, match="cannot resolve"):
        check_url("http://nowhere.example/", allow_private=False)
    check_url("http://evil.example/hook", allow_private=True)


@pytest.mark.own_network_namespace
def test_webhook_urls_to_private_hosts_are_refused_at_submission(tmp_path, resolver, connections):
    with app_client(tmp_path, idle_services(tmp_path)) as (client, _):  # no worker: nothing would run a job that got in
        for url in REFUSED:
            response = client.post("/v1/videos", json={"model": "wan-tiny", "prompt": "x", "webhook_url": url})
            assert response.status_code == 400, (url, response.text)
            error = response.json()["error"]
            assert (error["param"], error["code"], error["type"]) == ("webhook_url", "url_not_allowed",
                                                                      "invalid_request_error"), url
        assert client.get("/v1/videos").json()["data"] == []
    assert connections == []


@pytest.mark.own_network_namespace
def test_image_urls_to_private_hosts_are_refused(tmp_path, resolver, connections):
    with app_client(tmp_path, chat_model="vlm-tiny", chat_remote_images=True) as (client, _):
        for url in REFUSED:
            response = client.post("/v1/chat/completions", json={"messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]})
            assert response.status_code == 400, (url, response.text)
            error = response.json()["error"]
            assert (error["param"], error["code"]) == ("messages[0].content[0].image_url", "url_not_allowed"), url
    assert connections == []


@pytest.mark.own_network_namespace
def test_a_send_to_a_private_host_is_refused_and_counts_as_failed(resolver, connections, caplog):
    sender = WebhookSender(generate_secret(), base_delay_s=0.01)
    with caplog.at_level(logging.ERROR, logger="vidserve.webhooks"):
        for url in REFUSED:
            sender.send(url, "video.completed", {"id": "video_1"})
        sender.close(timeout=5)
    assert (sender.delivered, sender.failed) == (0, len(REFUSED))
    assert caplog.text.count("giving up after 1 attempt(s): refused:") == len(REFUSED)
    assert connections == []


@pytest.mark.own_network_namespace
def test_a_name_that_turns_private_after_the_check_is_refused_when_sending(monkeypatch, resolver, connections):
    # DNS rebinding: public when the URL is checked at submission, loopback when it is sent.
    monkeypatch.setitem(NAMES, "rebind.example", ["93.184.216.34"])
    check_url("http://rebind.example/hook", allow_private=False)
    monkeypatch.setitem(NAMES, "rebind.example", ["127.0.0.1"])
    sender = WebhookSender(generate_secret())
    sender.send("http://rebind.example/hook", "video.completed", {"id": "video_1"})
    sender.close(timeout=5)
    assert (sender.delivered, sender.failed) == (0, 1) and connections == []


@pytest.mark.own_network_namespace
def test_the_connection_goes_to_the_address_that_was_checked(monkeypatch, resolver):
    connected = []
    real_create_connection = socket.create_connection

    def create_connection(address, *args, **kwargs):
        connected.append(address)
        return real_create_connection(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", create_connection)
    monkeypatch.setitem(NAMES, "hooks.example", ["127.0.0.1"])
    r = Receiver()
    try:
        sender = WebhookSender(generate_secret(), allow_private_urls=True)
        sender.send(f"http://hooks.example:{r.port}/hooks", "video.completed", {"id": "video_1"})
        sender.close(timeout=5)
    finally:
        r.close()
    assert sender.delivered == 1
    assert resolver.count("hooks.example") == 1  # resolved once; the connect used that answer
    assert connected == [("127.0.0.1", r.port)]
    assert r.requests[0][0]["host"] == f"hooks.example:{r.port}"  # the URL, Host header (and SNI) keep the name
