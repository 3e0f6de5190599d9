"""Real vidserve processes for end-to-end tests: the API server and Celery workers,
on loopback ports, with their logs kept in files for when a test fails."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VidserveProcess:
    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.args, self.env, self.log = args, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> "VidserveProcess":
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "vidserve.cli", *self.args],
                                         env={**os.environ, **self.env}, stdout=out, stderr=subprocess.STDOUT)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def wait_for_log(self, text: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.args[0]} never logged {text!r}:\n{self.logs()}")
            time.sleep(0.2)

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
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not become ready:\n{self.logs()}")
            time.sleep(0.2)


class Worker(VidserveProcess):
    def __init__(self, data_dir: Path, model: str, env: dict[str, str], name: str):
        super().__init__(["worker", "--model", model, "--data-dir", str(data_dir)], env,
                         data_dir.parent / f"worker-{name}.log")

    def start(self) -> "Worker":
        super().start()
        self.wait_for_log("ready.")  # Celery's line once it consumes from its queue
        return self


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())
