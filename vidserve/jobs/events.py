"""A job's events, for everything that follows one as it is made: the SSE stream, the held HLS
playlist and the realtime session all read `JobEvents.follow`, the one place that compares what
a job was with what it is.

No follower polls the store. Each waits until the store says the job changed (`JobStore.subscribe`:
an in-process notice on SQLite, Redis pub/sub in Celery mode), then reads it once. A queued job's
place in line moves when any job is created, deleted, starts or ends: such a write (`line`) wakes
every follower of a queued job too. A store that may have lost notices (Redis reconnecting) wakes
every follower, so nothing stays unseen.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from anyio import to_thread

from vidserve.jobs.job import Job, JobStatus
from vidserve.jobs.outages import FIRST_DELAY, MAX_DELAY, STORE_UNAVAILABLE
from vidserve.jobs.place_in_line import PlaceInLine
from vidserve.jobs.records import ChunkRecord, SegmentRecord
from vidserve.jobs.store import JobChange, JobStore
from vidserve.jobs.video_object import VideoProgress

log = logging.getLogger("vidserve.jobs.events")

KEEP_ALIVE_SECONDS = 15.0  # a proxy closes a stream quiet for longer than about a minute


@dataclass(frozen=True)
class StatusChanged:
    """The job's status is new (its first event is one), or, queued, its place in line moved."""

    job: Job
    place: PlaceInLine | None  # while queued: its place in line (None: no queue knows it)


@dataclass(frozen=True)
class Progressed:
    """A running job moved on: a step, its stage, a warning. `progress` is where it is now,
    `since` where the follower's previous event left it."""

    job: Job
    progress: VideoProgress
    since: VideoProgress


@dataclass(frozen=True)
class ChunkFinished:
    """A chunk is made and downloadable; `segment`: its segment of the HLS stream, once recorded."""

    job: Job
    chunk: ChunkRecord
    segment: SegmentRecord | None


@dataclass(frozen=True)
class SegmentAdded:
    """A segment no chunk made joined the stream: the source video's, which an extension continues."""

    job: Job
    segment: SegmentRecord


@dataclass(frozen=True)
class Deleted:
    """The job is gone: its follow ends."""

    job_id: str


@dataclass(frozen=True)
class Quiet:
    """Nothing happened for the keep-alive seconds (a stream may say so, to keep proxies from closing it)."""


JobEvent = StatusChanged | Progressed | ChunkFinished | SegmentAdded | Deleted | Quiet


@dataclass(frozen=True)
class _Seen:
    """What a follower last told of a job: a change in any of it is its next event."""

    status: JobStatus
    progress: int
    steps_done: int
    stage: str | None
    warnings: int
    queue_position: int | None = None

    @classmethod
    def of(cls, job: Job) -> "_Seen":
        return cls(job.status, job.progress, job.steps_done, job.stage, len(job.warnings))


class _Waiter:
    """One follower's wake-up: woken from any thread, awaited on its event loop."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.queued = True  # woken by line changes too, until a read finds the job past the queue
        self.job_changed = True  # since the last read: its record (else only the line) may differ
        self._loop = asyncio.get_running_loop()
        self._woken = asyncio.Event()

    def wake(self, job_changed: bool) -> None:
        try:
            self._loop.call_soon_threadsafe(self._wake, job_changed)
        except RuntimeError:  # its loop has closed: nobody waits any more
            pass

    def _wake(self, job_changed: bool) -> None:  # on its loop, so `job_changed` is never reset under a wake
        self.job_changed = self.job_changed or job_changed
        self._woken.set()

    async def woken(self, timeout: float | None) -> bool:
        """Wait until woken (then ready for the next wake) or `timeout` seconds; whether woken."""
        try:
            await asyncio.wait_for(self._woken.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        self._woken.clear()  # before the read that follows: a change during it wakes the waiter again
        return True


class _Lines:
    """The queue's places in line per model, read once per change of the line however many
    followers of queued jobs it wakes (each re-reading them would read the store as often)."""

    def __init__(self, places_in_line: Callable[[str], dict[str, PlaceInLine]]):
        self._places_in_line = places_in_line
        self._changes = 0  # line changes heard so far
        self._read: dict[str, tuple[int, dict[str, PlaceInLine]]] = {}  # model -> (changes then, its line)
        self._reading: dict[str, threading.Lock] = {}  # model -> held while its line is read
        self._lock = threading.Lock()

    def changed(self) -> None:
        with self._lock:
            self._changes += 1

    def current(self, model: str) -> dict[str, PlaceInLine] | None:
        """`model`'s line as read since the last change heard, if it was (no read, no thread)."""
        with self._lock:
            read = self._read.get(model)
            return read[1] if read is not None and read[0] == self._changes else None

    def read(self, model: str, fresh: bool) -> dict[str, PlaceInLine]:
        """`model`'s line, read now, or (unless `fresh`) by a read that began since the last change
        heard: one read of a model's line at a time, the followers a change wakes wait for the first."""
        with self._lock:
            reading, changes = self._reading.setdefault(model, threading.Lock()), self._changes
        with reading:
            with self._lock:
                read = self._read.get(model)
                if not fresh and read is not None and read[0] >= changes:
                    return read[1]
                changes = self._changes
            places = self._places_in_line(model)
            with self._lock:
                self._read[model] = (changes, places)
            return places


class JobEvents:
    """The process's source of job events, over its store's change notices: one subscription,
    shared by every follower, taken when the first one starts."""

    def __init__(self, store: JobStore, places_in_line: Callable[[str], dict[str, PlaceInLine]],
                 keep_alive_seconds: float = KEEP_ALIVE_SECONDS):
        """`places_in_line`: a model's queued jobs and where each stands (the queue's)."""
        self.store, self.keep_alive_seconds = store, keep_alive_seconds
        self._lines = _Lines(places_in_line)
        self._waiters: dict[str, set[_Waiter]] = {}
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = None

    async def follow(self, job_id: str) -> AsyncIterator[JobEvent]:
        """The job's events from now on: first a StatusChanged with the job as it is, then each
        change as it happens (chunks before the status or progress they came with), ending after
        the terminal status or a Deleted; a Quiet after each `keep_alive_seconds` without one."""
        waiter = self._add(job_id)  # before the first read: a change from then on is heard
        try:
            seen: _Seen | None = None
            told: VideoProgress | None = None
            chunks_told: set[int] = set()
            segments_told: set[str] = set()
            job: Job | None = None
            while True:
                if waiter.job_changed:  # else only the line moved: the record read last is the job still
                    waiter.job_changed = False
                    job = await self._through_outages(waiter, self.store.get, job_id)
                if job is None:
                    yield Deleted(job_id)
                    return
                waiter.queued = job.status is JobStatus.queued
                for chunk in sorted(job.chunks, key=lambda c: c.index):
                    if chunk.index not in chunks_told:
                        chunks_told.add(chunk.index)
                        segment = next((s for s in job.segments if s.chunk == chunk.index), None)
                        yield ChunkFinished(job, chunk, segment)
                for segment in job.segments:
                    if segment.chunk is None and segment.key not in segments_told:
                        segments_told.add(segment.key)
                        yield SegmentAdded(job, segment)
                now, moved = _Seen.of(job), VideoProgress.of(job, time.time())
                if seen is not None and now.status is seen.status and now.status is not JobStatus.queued:
                    if now != seen:
                        yield Progressed(job, moved, told)
                        seen, told = now, moved
                else:  # a new status, or a queued job's place in line
                    place = None
                    if job.status is JobStatus.queued:
                        # A first read reads the line anew: a queue may place a new job a moment after
                        # the store's notice of it. A follower woken by a change reads it once for all.
                        line = None if seen is None else self._lines.current(job.model)
                        if line is None:
                            line = await self._through_outages(waiter, self._lines.read, job.model, seen is None)
                        place = line.get(job.id)
                    now = dataclasses.replace(now, queue_position=place.position if place else None)
                    if now != seen:
                        yield StatusChanged(job, place)
                        seen, told = now, moved
                if job.status.terminal:
                    return
                while not await waiter.woken(self.keep_alive_seconds):
                    yield Quiet()
        finally:
            self._remove(waiter)

    @staticmethod
    async def _through_outages(waiter: _Waiter, read: Callable, *args):
        """`read(*args)` on a thread, tried again while the store is away (Redis restarting, say):
        after a doubling pause, or sooner when the store's notice that it is back wakes `waiter`."""
        pause = FIRST_DELAY
        while True:
            try:
                return await to_thread.run_sync(read, *args)
            except STORE_UNAVAILABLE as exc:
                log.warning("job %s: the store is unavailable (%s); reading again in %.2g s", waiter.job_id, exc, pause)
                await waiter.woken(pause)
                pause = min(pause * 2, MAX_DELAY)

    def _add(self, job_id: str) -> _Waiter:
        waiter = _Waiter(job_id)
        with self._lock:
            self._waiters.setdefault(job_id, set()).add(waiter)
            subscribe = self._unsubscribe is None
            if subscribe:
                self._unsubscribe = lambda: None  # taken: a follower starting meanwhile subscribes no second time
        if subscribe:
            self._unsubscribe = self.store.subscribe(self._changed)
        return waiter

    def _remove(self, waiter: _Waiter) -> None:
        with self._lock:
            followers = self._waiters.get(waiter.job_id)
            if followers is not None:
                followers.discard(waiter)
                if not followers:
                    del self._waiters[waiter.job_id]

    def _changed(self, change: JobChange) -> None:
        """A store's notice, on whatever thread heard it: wake who must read again, the job's own
        followers first."""
        if change.line or change.job_id is None:
            self._lines.changed()  # before any wake: a woken follower reads the line anew
        with self._lock:
            own = list(self._waiters.get(change.job_id, ())) if change.job_id is not None else []
            others = []
            if change.job_id is None or change.line:
                others = [w for job_id, followers in self._waiters.items() if job_id != change.job_id
                          for w in followers if w.queued or change.job_id is None]
        for waiter in own:
            waiter.wake(job_changed=True)
        for waiter in others:
            waiter.wake(job_changed=change.job_id is None)  # a lost notice: anything may differ

    def close(self) -> None:
        """Stop hearing the store (before it closes); followers still waiting hear nothing more."""
        with self._lock:
            unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
