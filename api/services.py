"""What the routers work with — settings, job store, storage, queue, metrics — built
once per app and handed to routes as a dependency (tests build their own)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from fastapi import Request

from vidserve.config import Settings
from vidserve.errors import ModelUnavailable
from vidserve.jobs.events import JobEvents
from vidserve.jobs.expiry import ExpirySweeper
from vidserve.jobs import Job, JobStatus, JobStore
from vidserve.jobs.place_in_line import PlaceInLine
from vidserve.jobs.video_object import VideoObject
from vidserve.keys import KeyRing
from vidserve.loras import LoraRegistry
from vidserve.ratelimit import LocalRateLimiter, RateLimiter
from vidserve.registry import ModelSpec, weights_here
from vidserve.storage import Storage, open_storage
from vidserve.stream_tokens import StreamTokens, stream_tokens
from vidserve.telemetry import Metrics
from vidserve.webhooks import WebhookSender, build_sender

if TYPE_CHECKING:  # torch loads only where chat is on
    from vidserve.pipelines.llm.service import ChatService


class JobQueue(Protocol):
    def start(self) -> None: ...
    def submit(self, job: Job) -> None: ...
    def places_in_line(self, model: str) -> dict[str, PlaceInLine]: ...
    def stop(self) -> None: ...
    @property
    def alive(self) -> bool: ...
    @property
    def warming(self) -> bool: ...


@dataclass
class Services:
    settings: Settings
    store: JobStore
    storage: Storage
    queue: JobQueue
    metrics: Metrics
    webhooks: WebhookSender
    chat: ChatService | None = None  # the chat path on the resident LLM engine; None when chat is off
    keyring: KeyRing | None = None  # None: the settings' keys
    adapters: LoraRegistry | None = None  # None: the settings' (and the bundled) LoRA adapters
    limiter: RateLimiter = field(default_factory=LocalRateLimiter)
    sweeper: ExpirySweeper | None = None  # None: one on this store and storage
    stream_tokens: StreamTokens | None = None  # None: the settings' (made only on a server with keys)
    events: JobEvents | None = None  # None: one on this store and queue, what every stream of this process follows
    _metrics_listener: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.keyring is None:
            self.keyring = KeyRing.from_settings(self.settings.keys, self.settings.keys_file)
        if self.adapters is None:
            self.adapters = LoraRegistry.from_settings(self.settings.lora_dirs, self.settings.loras,
                                                      self.settings.lora_cache)
        if self.sweeper is None:
            self.sweeper = ExpirySweeper(self.store, self.storage, self.settings.expiry_sweep_seconds)
        if self.stream_tokens is None and self.keyring.enabled:
            self.stream_tokens = stream_tokens(self.settings)
        if self.events is None:
            # The queue's line looked up when read: a queue that keeps none (a benchmark's) is never asked.
            self.events = JobEvents(self.store, lambda model: self.queue.places_in_line(model),
                                    self.settings.event_keepalive_seconds)

    def video(self, job: Job, places_in_line: dict[str, PlaceInLine] | None = None) -> VideoObject:
        """The video object as this API answers with it: on a server with keys, its stream URL signed;
        queued, where it stands (from `places_in_line`, the queue's for its model, when a caller has them)."""
        place = None
        if job.status is JobStatus.queued:
            place = (self.queue.places_in_line(job.model) if places_in_line is None else places_in_line).get(job.id)
        # Signed for the owner's key, so its links stop when that key is removed (a video made before the
        # server had keys has no owner: its link carries no token, and an admin's header plays it).
        token = self.stream_tokens.sign(job.id, job.owner) if self.keyring.enabled and job.owner else None
        return VideoObject.of(job, token, place)

    def videos(self, page: list[Job]) -> list[VideoObject]:
        """Video objects of a page of jobs, each model's line read once, after the page: a job that
        left its line in between (it started, or ended) is read again, and shown as it is now."""
        models = {job.model for job in page if job.status is JobStatus.queued}
        lines = {model: self.queue.places_in_line(model) for model in models}
        placed = [self._placed(job, lines[job.model]) if job.status is JobStatus.queued else (job, None)
                  for job in page]
        return [self.video(job, {job.id: place} if place else {}) for job, place in placed]

    def _placed(self, job: Job, line: dict[str, PlaceInLine]) -> tuple[Job, PlaceInLine | None]:
        """A queued job read before its `line`, and its place there; one that left the line in between
        (it started, or ended) as it is now."""
        place = line.get(job.id)
        if place is None:
            job = self.store.get(job.id) or job
        return job, place

    def unavailable(self, spec: ModelSpec) -> str | None:
        """Why a job for `spec` would not run now, and what to do about it; None if it would.
        Embedded: its weights are not on this machine (a request never starts a download).
        Celery: no live worker holds it, unless jobs may wait for workers yet to start."""
        if self.settings.queue == "celery":
            if self.settings.queue_without_workers or self.queue.serves(spec.name):
                return None
            return f"no worker serves model {spec.name}; start one with `vidserve worker --model {spec.name}`"
        return None if weights_here(spec) else str(ModelUnavailable(spec.source))

    def start(self) -> None:
        self.webhooks.resume_pending()  # before new events, so each receiver gets the older ones first
        if self.chat is not None:
            self.chat.start()
        self.queue.start()
        self.sweeper.start()
        if self.settings.metrics_address:
            from prometheus_client import start_http_server

            host, _, port = self.settings.metrics_address.rpartition(":")
            self._metrics_listener, _ = start_http_server(int(port), addr=host.strip("[]"),
                                                          registry=self.metrics.registry)

    def stop(self) -> None:
        if self._metrics_listener is not None:
            self._metrics_listener.shutdown()
            self._metrics_listener.server_close()
        self.sweeper.stop()  # before the store closes under it
        self.queue.stop()
        if self.chat is not None:
            self.chat.stop()
        self.webhooks.close(timeout=5)
        self.events.close()  # its subscription, before the store closes under it
        self.store.close()


def services(request: Request) -> Services:
    return request.app.state.services


def build_services(settings: Settings) -> Services:
    """Embedded: SQLite store and an in-process worker. Celery: Redis store, remote workers."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    metrics = Metrics()
    if settings.queue == "celery":  # refused before any model loads: a one-line error, not a slow start first
        from vidserve.jobs.redis_persistence import require_durable

        metrics.redis_volatile(require_durable(settings.redis_url, settings.allow_volatile_redis))
    storage = open_storage(settings)
    chat = build_chat_service(settings, metrics)
    if settings.queue == "celery":
        from vidserve.jobs.store_redis import RedisJobStore
        from vidserve.ratelimit import RedisRateLimiter
        from vidserve.workers.celery_app import CeleryQueue

        store = RedisJobStore(settings.redis_url)
        webhooks = build_sender(settings, store)
        queue = CeleryQueue(settings, store, webhooks)
        limiter: RateLimiter = RedisRateLimiter(settings.redis_url)
    else:
        from vidserve.jobs.store_sqlite import SQLiteJobStore
        from vidserve.workers.embedded import EmbeddedQueue
        from vidserve.workers.runner import JobRunner

        store = SQLiteJobStore(settings.data_dir / "jobs.sqlite")
        webhooks = build_sender(settings, store)
        from vidserve.workers.prompt_writer import EngineWriter

        runner = JobRunner(settings, store, storage, metrics, webhooks, worker_id=f"embedded-{secrets.token_hex(4)}",
                           writer=EngineWriter(chat) if chat is not None else None)
        queue = EmbeddedQueue(store, runner)
        limiter = LocalRateLimiter()
    metrics.watch(store)
    return Services(settings, store, storage, queue, metrics, webhooks, chat, limiter=limiter)


def build_chat_service(settings: Settings, metrics: Metrics) -> ChatService | None:
    """The chat path on a resident LLM engine, which the chat API (and, embedded, the video
    path) shares; None if chat is off."""
    if not settings.chat_model:
        return None
    from vidserve.pipelines.llm.engine import LLMEngine
    from vidserve.pipelines.llm.model import ChatModel
    from vidserve.pipelines.llm.service import ChatService
    from vidserve.registry import resolve_chat

    model = ChatModel.load(resolve_chat(settings.chat_model), settings.device, settings.dtype)
    engine = LLMEngine(model, max_running=settings.chat_max_running, max_waiting=settings.chat_max_waiting,
                       prefill_tokens=settings.chat_prefill_tokens, kv_tokens=settings.chat_kv_tokens,
                       prefix_cache=settings.chat_prefix_cache, metrics=metrics.chat)
    return ChatService(engine, settings)
