"""The JobStore contract: where job records live (SQLite embedded, Redis distributed), and
what a new job must fit within."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, Literal

from pydantic import BaseModel

from vidserve.jobs.job import Job, JobStatus


class JobNotFound(Exception):
    """No job has this id (never created, or deleted)."""

    def __init__(self, job_id: str):
        super().__init__(f"no job with id {job_id!r}")
        self.job_id = job_id


class WebhookDelivery(BaseModel):
    """A webhook event on its way, kept in the JobStore until it is delivered or given up,
    so that a restarted server sends it again."""

    url: str
    event_id: str
    body: str  # the event's JSON, byte for byte what every attempt sends


def check_page(order: str, limit: int) -> None:
    """A page of `JobStore.list` as every store takes it."""
    if order not in ("asc", "desc"):
        raise ValueError(f"order must be 'asc' or 'desc', not {order!r}")
    if limit < 1:
        raise ValueError("limit must be at least 1")


@dataclass(frozen=True)
class AdmissionLimits:
    """What a new job must fit within, checked by `JobStore.create` in the step that stores it:
    a count taken apart from the insert lets a burst of creates all see room for one more."""

    max_queued: int | None = None  # jobs queued, every owner's
    max_active: int | None = None  # its owner's jobs queued or running (None or 0, or no owner: no limit)


class QuotaExceeded(Exception):
    """`JobStore.create` refused a job: `count` jobs already fill `limit`, which allows `allowed`."""

    def __init__(self, limit: Literal["max_queued", "max_active_jobs"], count: int, allowed: int):
        super().__init__(f"{limit}: {count} of {allowed}")
        self.limit, self.count, self.allowed = limit, count, allowed


@dataclass(frozen=True)
class JobChange:
    """A write a JobStore made, as its listeners hear of it: job `job_id`'s record changed, and with
    `line`, the queue's line too (a job was created, deleted, or changed status: every queued job's
    place may have moved). `job_id` None: anything may have changed (the store's notifications
    were lost for a while, across a reconnect), so every listener reads again."""

    job_id: str | None
    line: bool = False


ChangeListener = Callable[[JobChange], None]


class ChangeListeners:
    """The listeners a store calls after each write it makes itself, in the writing thread."""

    def __init__(self) -> None:
        self._listeners: list[ChangeListener] = []
        self._lock = threading.Lock()

    def add(self, listener: ChangeListener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)
        return lambda: self._remove(listener)

    def _remove(self, listener: ChangeListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def notify(self, change: JobChange) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(change)


class JobStore(ABC):
    """Where job records live. Implementations: SQLite (embedded), Redis (distributed)."""

    @abstractmethod
    def create(self, job: Job, limits: AdmissionLimits | None = None) -> tuple[Job, bool]:
        """Insert `job`. With an idempotency key already taken, return (existing, False) instead:
        a retry of an accepted request is no new job, whatever the limits. Otherwise, where a
        limit of `limits` is already reached, QuotaExceeded, and nothing is stored. One atomic
        step, across every process on the store."""

    @abstractmethod
    def get(self, job_id: str) -> Job | None: ...

    @abstractmethod
    def update(self, job_id: str, change: Callable[[Job], None]) -> Job:
        """Atomically load, apply `change` (which may raise InvalidTransition), save; JobNotFound if missing."""

    @abstractmethod
    def delete(self, job_id: str) -> bool: ...

    @abstractmethod
    def list(self, after: str | None = None, limit: int = 20, order: str = "desc",
             owner: str | None = None) -> tuple[list[Job], bool]:
        """A page of jobs by creation order (only `owner`'s, if given), starting after the job
        `after` (JobNotFound if there is no such job among them); and whether more follow."""

    @abstractmethod
    def with_status(self, statuses: Iterable[JobStatus]) -> list[Job]:
        """All jobs in these states, oldest first (recovery, queue depth, metrics)."""

    @abstractmethod
    def add_delivery(self, delivery: WebhookDelivery) -> str:
        """Record a webhook delivery to make; its id, for delivery_done."""

    @abstractmethod
    def pending_deliveries(self) -> list[tuple[str, WebhookDelivery]]:
        """(id, delivery) for each recorded delivery not yet done, oldest first."""

    @abstractmethod
    def delivery_done(self, delivery_id: str) -> None:
        """Forget a delivery: delivered, or given up."""

    @abstractmethod
    def try_lock(self, name: str, seconds: float, token: str) -> bool:
        """Take the lock `name` for `token` if it is free (or its holder's time ran out), for
        `seconds`; whether it was taken. One holder at a time across every process on the store."""

    @abstractmethod
    def unlock(self, name: str, token: str) -> None:
        """Free the lock `name` if `token` still holds it (never another holder's, taken after a lapse)."""

    @abstractmethod
    def subscribe(self, listener: ChangeListener) -> Callable[[], None]:
        """Call `listener` with a JobChange after each write of a job that this process can hear of
        (committed: a read from the listener sees it), until the returned function is called. It
        runs on the thread that heard of the write: it must only hand the change on, at once."""

    @abstractmethod
    def line_moved(self, job_id: str) -> None:
        """Tell the listeners (every process's) that the line moved at job `job_id` by a write the
        store did not make: a queue's own schedule, which places a new job after the store made it."""

    def incarnation(self) -> str | None:
        """What changes when the store restarts (and may have lost its last acknowledged
        writes); None for a store that never loses them."""
        return None

    def count_by_status(self) -> dict[JobStatus, int]:
        return {status: len(self.with_status([status])) for status in JobStatus}

    def close(self) -> None:
        pass
