"""The one way tests build the API.

`idle_services`: a SQLite store (or the test's), local files (or the test's storage) and a
queue that takes jobs and runs none, for tests about what gets in. `app_client`: a TestClient
on those services, or, without them, on the whole embedded server (`build_services`: jobs
run). Chat is off unless a test names a chat model: loading one and starting its engine
thread would cost every test that builds an app."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from polling import eventually
from queues import IdleQueue
from servers import free_port

from vidserve.api.app import create_app
from vidserve.api.services import Services
from vidserve.config import Settings
from vidserve.jobs.store_sqlite import SQLiteJobStore
from vidserve.storage import LocalStorage
from vidserve.telemetry import Metrics
from vidserve.webhooks import WebhookSender, generate_secret


def settings_for(tmp_path: Path, **settings) -> Settings:
    return Settings(data_dir=tmp_path / "data", **{"chat_model": "", **settings})


def idle_services(tmp_path: Path, *, store=None, storage=None, **settings) -> Services:
    config = settings_for(tmp_path, **settings)
    store = store or SQLiteJobStore(tmp_path / "jobs.sqlite")
    # A sender with no store behind it: a test's own store may be down (it keeps no outbox).
    webhooks = WebhookSender(generate_secret(), allow_private_urls=config.allow_private_urls)
    return Services(config, store, storage or LocalStorage(tmp_path / "files"), IdleQueue(), Metrics(), webhooks)


@contextmanager
def served_app(services: Services) -> Iterator[tuple[str, FastAPI]]:
    """The app on a real loopback socket (uvicorn runs its lifespan), where streams stay open while
    a test does other things (the TestClient runs each request to its end): its URL, and the app."""
    app = create_app(services.settings, services)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    eventually(lambda: server.started, timeout=60, what="the test server to start")
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)


@contextmanager
def app_client(tmp_path: Path, services: Services | None = None, *, raise_server_exceptions: bool = True,
               **settings) -> Iterator[tuple[TestClient, Services]]:
    """A started app (its lifespan ran) and its services: `services`, or the embedded server's."""
    app = create_app(services.settings, services) if services else create_app(settings_for(tmp_path, **settings))
    with TestClient(app, raise_server_exceptions=raise_server_exceptions) as client:
        yield client, app.state.services
