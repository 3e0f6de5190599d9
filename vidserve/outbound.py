"""Outbound HTTP to URLs that requests name (webhooks, chat image URLs), kept off the
server's own network.

A URL is allowed when it is http(s) and its host resolves only to public addresses: not
loopback, private, shared (carrier NAT), link-local (the cloud metadata service at
169.254.169.254 included), multicast, reserved or unspecified, nor an IPv6 address that
carries such an IPv4 one (IPv4-mapped, IPv4-compatible, 6to4, NAT64). `allow_private`
(the `allow_private_urls` setting) turns the address check off, for tests and trusted
networks.

`check_url` refuses a URL up front, at submission. `client()` is what sends, and checks
again: its network backend resolves the host once per connection, checks every address
and connects to a checked one. The URL itself is left alone, so the Host header, TLS SNI
and the certificate check still use the hostname, and a DNS answer that changes between
the check and the connect (DNS rebinding) has nothing to slip through.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import httpcore
import httpx

from vidserve.errors import InvalidRequest

# IPv6 ranges whose last 32 bits are an IPv4 address that the packet ends up at.
_CARRY_IPV4 = (ipaddress.ip_network("::/96"), ipaddress.ip_network("64:ff9b::/96"))  # IPv4-compatible, NAT64


class URLNotAllowed(InvalidRequest):
    """A URL this server will not call: not http(s), or its host is (or resolves to) a non-public address."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message, param=param, code="url_not_allowed")


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])  # without an IPv6 zone, as in "fe80::1%eth0"
    if not ip.is_global or ip.is_multicast:  # is_global alone lets multicast through
        return False
    if ip.version == 6:
        carried = ip.ipv4_mapped or ip.sixtofour
        if carried is None and any(ip in network for network in _CARRY_IPV4):
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)
        return carried is None or is_public(str(carried))
    return True


def allowed_addresses(host: str, port: int | None, allow_private: bool) -> list[str]:
    """The host's addresses, from one lookup (socket.gaierror if there are none).

    URLNotAllowed if any is not public, unless `allow_private`: a host that answers with
    a private address beside public ones is refused, not trimmed to the public ones.
    """
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    if not allow_private:
        for address in addresses:
            if not is_public(address):
                raise URLNotAllowed(f"{host} is {address}, which is not a public address" if host == address
                                    else f"{host} resolves to {address}, which is not a public address")
    return addresses


def http_host(url: str, param: str | None = None) -> str:
    """The host of an absolute http(s) URL; URLNotAllowed for anything else."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise URLNotAllowed(f"{param or 'the URL'} must be an absolute http:// or https:// URL", param=param)
    return parts.hostname


def check_url(url: str, allow_private: bool, param: str | None = None) -> None:
    """Refuse (URLNotAllowed) a URL that `client()` would refuse to connect to, or that does not resolve."""
    host = http_host(url, param)
    try:
        allowed_addresses(host, None, allow_private)
    except URLNotAllowed as exc:
        raise URLNotAllowed(exc.message, param=param) from None
    except (OSError, UnicodeError):  # socket.gaierror, or a name IDNA cannot encode
        raise URLNotAllowed(f"cannot resolve the host {host!r}", param=param) from None


def client(allow_private: bool, timeout: float) -> httpx.Client:
    """An httpx client that connects only where the policy allows, and follows no redirects
    (a public URL could otherwise bounce the request into the private network). Proxy
    variables are ignored: they would send the request through a proxy the check never saw."""
    return httpx.Client(transport=_CheckingTransport(allow_private), timeout=timeout, follow_redirects=False,
                        trust_env=False)


class _CheckingBackend(httpcore.SyncBackend):
    def __init__(self, allow_private: bool):
        self.allow_private = allow_private

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = allowed_addresses(host, port, self.allow_private)
        except OSError as exc:  # does not resolve (now): a connect error, worth a retry
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        error = None
        for address in addresses:
            try:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            except httpcore.ConnectError as exc:
                error = exc  # try the next address, as socket.create_connection would
        raise error


class _CheckingTransport(httpx.HTTPTransport):
    def __init__(self, allow_private: bool):
        super().__init__()
        # httpx's transport takes no network backend (yet), so the connection pool it made is
        # replaced by one on the checking backend. No connection limit: the callers' threads are the bound.
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(), max_connections=None,
                                             keepalive_expiry=5.0, network_backend=_CheckingBackend(allow_private))
