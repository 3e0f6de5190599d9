"""JobStore on an SQLite file: the embedded store for a single machine.

Several processes (API server, workers) may open the same file. WAL lets readers run
beside one writer, `busy_timeout` makes a writer wait for the lock instead of failing,
and every write runs under BEGIN IMMEDIATE, so a read-modify-write never interleaves
with another process's. Open one store per process (after any fork).

Its change notifications (`subscribe`) are in-process: the API and its embedded worker write
through one store object, which tells its listeners after each commit.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

from vidserve.jobs import (AdmissionLimits, Job, JobNotFound, JobStatus, JobStore, QuotaExceeded, WebhookDelivery,
                           check_page)
from vidserve.jobs.store import ChangeListener, ChangeListeners, JobChange

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS jobs (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- creation order, never reused after a delete
        id TEXT NOT NULL UNIQUE,
        status TEXT NOT NULL,
        idempotency_key TEXT UNIQUE,            -- NULLs do not collide
        created_at REAL NOT NULL,
        data TEXT NOT NULL                      -- Job.model_dump_json()
    )""",
    "CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status, seq)",
    """CREATE TABLE IF NOT EXISTS webhook_deliveries (
        id INTEGER PRIMARY KEY AUTOINCREMENT,   -- recording order, the order to send them in again
        data TEXT NOT NULL                      -- WebhookDelivery.model_dump_json()
    )""",
    """CREATE TABLE IF NOT EXISTS locks (
        name TEXT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at REAL NOT NULL                -- unix time; past it the lock is free again
    )""",
)
# Columns added since the first schema, added to an older file when it is opened.
_ADDED_COLUMNS = {"owner": "TEXT"}
_OWNER_INDEX = "CREATE INDEX IF NOT EXISTS jobs_owner ON jobs (owner, seq)"


class SQLiteJobStore(JobStore):
    def __init__(self, path: str | Path, busy_timeout_ms: int = 30_000):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One connection shared by this process's threads, serialised by the lock; job
        # traffic is light, and one connection keeps close() simple. isolation_level=None
        # leaves transactions to the explicit BEGINs below.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._changes = ChangeListeners()
        self._db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")  # first, so the rest can wait too
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")  # safe with WAL; a power cut may lose the last commit
        with self._transaction("IMMEDIATE") as db:
            for statement in _SCHEMA:
                db.execute(statement)
            columns = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
            for column, kind in _ADDED_COLUMNS.items():
                if column not in columns:
                    db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")
            db.execute(_OWNER_INDEX)

    @contextmanager
    def _transaction(self, kind: str = "DEFERRED") -> Iterator[sqlite3.Connection]:
        """IMMEDIATE takes the write lock up front; DEFERRED gives reads one consistent snapshot."""
        with self._lock:
            self._db.execute(f"BEGIN {kind}")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def create(self, job: Job, limits: AdmissionLimits | None = None) -> tuple[Job, bool]:
        # The write lock, taken up front, holds every other process's create (and update) off
        # from the lookups to the insert: the counts the limits are checked on stay true.
        with self._transaction("IMMEDIATE") as db:
            if job.idempotency_key is not None:
                row = db.execute("SELECT data FROM jobs WHERE idempotency_key = ?", (job.idempotency_key,)).fetchone()
                if row:
                    return Job.model_validate_json(row[0]), False
            if limits is not None:
                self._admit(db, job, limits)
            inserted = db.execute(
                "INSERT OR IGNORE INTO jobs (id, status, idempotency_key, created_at, owner, data) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (job.id, job.status.value, job.idempotency_key, job.created_at, job.owner, job.model_dump_json()),
            ).rowcount
            if not inserted:
                raise ValueError(f"job {job.id} already exists")
        self._changes.notify(JobChange(job.id, line=True))  # after the commit: a listener's read sees it
        return job, True

    @staticmethod
    def _admit(db: sqlite3.Connection, job: Job, limits: AdmissionLimits) -> None:
        if limits.max_queued:
            (queued,) = db.execute("SELECT COUNT(*) FROM jobs WHERE status = ?", (JobStatus.queued.value,)).fetchone()
            if queued >= limits.max_queued:
                raise QuotaExceeded("max_queued", queued, limits.max_queued)
        if limits.max_active and job.owner is not None:
            (active,) = db.execute("SELECT COUNT(*) FROM jobs WHERE owner = ? AND status IN (?, ?)",
                                   (job.owner, JobStatus.queued.value, JobStatus.in_progress.value)).fetchone()
            if active >= limits.max_active:
                raise QuotaExceeded("max_active_jobs", active, limits.max_active)

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            row = self._db.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return Job.model_validate_json(row[0]) if row else None

    def update(self, job_id: str, change: Callable[[Job], None]) -> Job:
        with self._transaction("IMMEDIATE") as db:  # an exception from `change` rolls back
            row = db.execute("SELECT data FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            job = Job.model_validate_json(row[0])
            before = job.status
            change(job)
            db.execute("UPDATE jobs SET status = ?, data = ? WHERE id = ?",
                       (job.status.value, job.model_dump_json(), job_id))
        self._changes.notify(JobChange(job_id, line=job.status is not before))
        return job

    def delete(self, job_id: str) -> bool:
        with self._lock:
            deleted = self._db.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount > 0
        if deleted:
            self._changes.notify(JobChange(job_id, line=True))
        return deleted

    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        return self._changes.add(listener)

    def line_moved(self, job_id: str) -> None:
        self._changes.notify(JobChange(job_id, line=True))

    def list(self, after: str | None = None, limit: int = 20, order: str = "desc",
             owner: str | None = None) -> tuple[list[Job], bool]:
        check_page(order, limit)
        cmp, direction = ("<", "DESC") if order == "desc" else (">", "ASC")
        with self._transaction() as db:
            cursor = None
            if after is not None:
                row = db.execute("SELECT seq FROM jobs WHERE id = ? AND (? IS NULL OR owner = ?)",
                                 (after, owner, owner)).fetchone()
                if row is None:
                    raise JobNotFound(after)
                cursor = row[0]
            rows = db.execute(
                f"SELECT data FROM jobs WHERE (? IS NULL OR seq {cmp} ?) AND (? IS NULL OR owner = ?) "
                f"ORDER BY seq {direction} LIMIT ?",
                (cursor, cursor, owner, owner, limit + 1),  # one extra row tells whether more follow
            ).fetchall()
        return [Job.model_validate_json(data) for (data,) in rows[:limit]], len(rows) > limit

    def with_status(self, statuses: Iterable[JobStatus]) -> list[Job]:
        values = [JobStatus(s).value for s in statuses]
        if not values:
            return []
        with self._lock:
            rows = self._db.execute(
                f"SELECT data FROM jobs WHERE status IN ({', '.join('?' * len(values))}) ORDER BY seq", values
            ).fetchall()
        return [Job.model_validate_json(data) for (data,) in rows]

    def count_by_status(self) -> dict[JobStatus, int]:  # without loading every job, as the default would
        with self._lock:
            counts = dict(self._db.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        return {status: counts.get(status.value, 0) for status in JobStatus}

    def add_delivery(self, delivery: WebhookDelivery) -> str:
        with self._lock:
            cursor = self._db.execute("INSERT INTO webhook_deliveries (data) VALUES (?)", (delivery.model_dump_json(),))
            return str(cursor.lastrowid)

    def pending_deliveries(self) -> list[tuple[str, WebhookDelivery]]:
        with self._lock:
            rows = self._db.execute("SELECT id, data FROM webhook_deliveries ORDER BY id").fetchall()
        return [(str(i), WebhookDelivery.model_validate_json(data)) for i, data in rows]

    def delivery_done(self, delivery_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM webhook_deliveries WHERE id = ?", (int(delivery_id),))

    def try_lock(self, name: str, seconds: float, token: str) -> bool:
        now = time.time()
        with self._lock:  # one statement: the check (the WHERE) and the take are one atomic write
            taken = self._db.execute(
                "INSERT INTO locks (name, token, expires_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires_at = excluded.expires_at "
                "WHERE locks.expires_at <= ?",
                (name, token, now + seconds, now),
            ).rowcount
        return taken > 0

    def unlock(self, name: str, token: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM locks WHERE name = ? AND token = ?", (name, token))

    def close(self) -> None:
        with self._lock:
            self._db.close()
