"""Real vidserve processes for end-to-end tests: the API server and Celery workers,
on loopback ports, with their logs kept in files for when a test fails."""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import httpx
from polling import eventually


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VidserveProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path, cwd: Path | None = None):
        self.args, self.env, self.log, self.cwd = args, env, log, cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> "VidserveProcess":
        for folder in (self.cwd, self.log.parent):
            if folder is not None:
                folder.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "vidserve.cli", *self.args], cwd=self.cwd,
                                         env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def fail_if_exited(self) -> None:
        """Waiting on a process that has died could only time out: fail at once, with its log."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.args[0]} exited with code {self.proc.returncode}:\n{self.logs()}")

    def wait_for_log(self, text: str, timeout: float = 120) -> None:
        def logged() -> bool:
            self.fail_if_exited()
            assert text in self.log.read_text(errors="replace"), f"its log so far:\n{self.logs()}"
            return True

        eventually(logged, timeout=timeout, interval=0.2, what=f"{self.args[0]} to log {text!r}")

    def kill(self) -> None:
        """SIGKILL: what a crashed GPU or an OOM killer does to a worker."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class Server(VidserveProcess):
    def __init__(self, data_dir: Path, env: dict[str, str] | None = None, extra: list[str] | None = None):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["serve", "--port", str(self.port), "--data-dir", str(data_dir), "--log-level", "warning",
                          *(extra or [])], env or {}, data_dir.parent / f"server-{self.port}.log")

    def start(self, timeout: float = 60) -> "Server":
        super().start()

        def ready() -> bool:
            self.fail_if_exited()
            try:  # not listening yet, or a 503 until its job store and queue are up
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                    return response.status == 200
            except OSError as exc:
                raise AssertionError(f"/readyz: {exc}; its log so far:\n{self.logs()}") from exc

        eventually(ready, timeout=timeout, interval=0.2, what=f"the server on port {self.port} to be ready")
        return self


class Worker(VidserveProcess):
    def __init__(self, data_dir: Path, model: str, env: dict[str, str], name: str, cwd: Path | None = None):
        super().__init__(["worker", "--model", model, "--data-dir", str(data_dir)], env,
                         data_dir.parent / f"worker-{name}.log", cwd)

    def start(self) -> "Worker":
        super().start()
        self.wait_for_log("ready.")  # Celery's line once it consumes from its queue
        return self


class RoundRobin(httpx.HTTPTransport):
    """A load balancer inside the client: each request goes to the next of several API
    processes, so consecutive calls of one scenario (create, retrieve, stream, download,
    delete) land on different processes."""

    def __init__(self, urls: list[str]):
        super().__init__()
        self._targets = itertools.cycle([httpx.URL(url) for url in urls])
        self._lock = threading.Lock()  # the SDK and SSE readers send from several threads

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            target = next(self._targets)
        request.url = request.url.copy_with(host=target.host, port=target.port)
        return super().handle_request(request)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())
