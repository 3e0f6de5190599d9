"""Shared fixtures."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from typing import Iterator

import netns
import pytest
from polling import eventually

# The server's defaults are the trained shapes-world models; the suite runs on the random
# tiny ones (seconds per clip, noise frames) unless a test names a model, as the
# wan-shapes / vlm-shapes tests do. Set before any Settings is built; servers inherit it.
os.environ.setdefault("VIDSERVE_DEFAULT_MODEL", "wan-tiny")
os.environ.setdefault("VIDSERVE_CHAT_MODEL", "vlm-tiny")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_network_namespace: the test body runs where only loopback exists "
                                       "(tests/netns.py)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if pyfuncitem.get_closest_marker("own_network_namespace") and not netns.isolated():
        netns.run_isolated(pyfuncitem)
        return True  # the body ran, in the inner process
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pongs(port: int) -> bool:
    """Whether a Redis server answers PING on this port (raw protocol, so no client library is needed)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway redis-server on loopback for the whole session, without persistence."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    port, workdir = _free_port(), tmp_path_factory.mktemp("redis")
    log = workdir / "redis.log"  # a file, not a pipe nobody drains
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            cwd=workdir, stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        def answering() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"redis-server exited:\n{log.read_text(errors='replace')}")
            assert _pongs(port), f"its log so far:\n{log.read_text(errors='replace')}"
            return True

        eventually(answering, timeout=10, what=f"redis-server to answer PING on port {port}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- vidserve servers, one per backend, shared by the contract tests of a module -----------

from servers import Server, Worker  # noqa: E402

# Short leases so a killed worker's job is noticed in seconds, not half a minute.
FAST_LEASE = {"VIDSERVE_LEASE_SECONDS": "2"}
# The contract tests' webhook receivers listen on loopback, which the server refuses by default.
LOOPBACK_WEBHOOKS = {"VIDSERVE_ALLOW_PRIVATE_URLS": "1"}


class Backend:
    """A running API (and its workers) the tests talk to over HTTP."""

    def __init__(self, name: str, server: Server, data_dir, workers=()):
        self.name, self.server, self.url, self.data_dir, self.workers = name, server, server.url, data_dir, workers


def _embedded(tmp_path_factory) -> Iterator[Backend]:
    data = tmp_path_factory.mktemp("embedded") / "data"
    server = Server(data, env={**FAST_LEASE, **LOOPBACK_WEBHOOKS}).start()
    try:
        yield Backend("embedded", server, data)
    finally:
        server.stop()


_redis_dbs = iter(range(1, 16))


def _celery(tmp_path_factory, redis_url: str, workers: int = 1) -> Iterator[Backend]:
    data = tmp_path_factory.mktemp("celery") / "data"
    env = {**FAST_LEASE, **LOOPBACK_WEBHOOKS,
           "VIDSERVE_REDIS_URL": redis_url.rsplit("/", 1)[0] + f"/{next(_redis_dbs)}"}
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    started = []
    try:
        for i in range(workers):
            started.append(Worker(data, "wan-tiny", env, f"{server.port}-{i}").start())
        yield Backend("celery", server, data, started)
    finally:
        for worker in started:
            worker.stop()
        server.stop()


@pytest.fixture(scope="module", params=["embedded", "celery"])
def backend(request, tmp_path_factory) -> Iterator[Backend]:
    """The same API contract, on the embedded queue and on Celery + Redis."""
    if request.param == "embedded":
        yield from _embedded(tmp_path_factory)
    else:
        yield from _celery(tmp_path_factory, request.getfixturevalue("redis_url"))


@pytest.fixture
def force_token(monkeypatch):
    """`force_token(chat_model, "S")`: the model emits that token forever, the collapse that
    loop detection exists for (undone when the test ends)."""

    def force(model, token_text: str) -> None:
        token = model.tokenizer.convert_tokens_to_ids(model.tokenizer.tokenize(token_text)[0])
        original = model.forward

        def forward(*args, **kwargs):
            logits = original(*args, **kwargs)
            logits[:, token] += 1000.0
            return logits

        monkeypatch.setattr(model, "forward", forward)

    return force
