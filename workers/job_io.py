"""A worker's calls on the job store and storage, each retried through an outage.

An outage never counts against a job: every call is retried for up to a lease
(vidserve/jobs/outages.py). A job store outage that long lets the lease lapse anyway, and the
lease reaper then runs the job again; a storage outage that long raises StorageUnavailable, and
the runner gives the job back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from vidserve.jobs import Job, JobStore
from vidserve.jobs.outages import through_outages
from vidserve.storage import Storage

T = TypeVar("T")


@dataclass(frozen=True)
class JobIO:
    store: JobStore
    storage: Storage
    lease_seconds: float

    def through_outages(self, call: Callable[[], T], what: str) -> T:
        return through_outages(call, self.lease_seconds, what)

    def write(self, job_id: str, change: Callable[[Job], None]) -> Job:
        return self.through_outages(lambda: self.store.update(job_id, change), f"job {job_id}: job store")

    def get(self, job_id: str) -> Job | None:
        return self.through_outages(lambda: self.store.get(job_id), f"job {job_id}: job store")

    def read(self, key: str) -> bytes:
        return self.through_outages(lambda: self.storage.read_bytes(key), f"reading {key}")

    def put_file(self, key: str, src_path: str | Path) -> str:
        """Move the finished local file `src_path` to `key`; the key."""
        return self.through_outages(lambda: self.storage.put_file(key, src_path), f"storing {key}")

    def put_bytes(self, key: str, data: bytes) -> None:
        self.through_outages(lambda: self.storage.put_bytes(key, data), f"storing {key}")

    def delete_prefix(self, prefix: str) -> None:
        self.through_outages(lambda: self.storage.delete_prefix(prefix), f"deleting {prefix}")
