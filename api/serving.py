"""`vidserve serve`'s process: the port taken before anything loads (so a port in use is one
line, at once), uvicorn on it, and one line with the playground's address once the server is
ready to take jobs (after the embedded worker's warm-up).

Stopping: the first Ctrl-C (SIGINT) or SIGTERM starts no new job and says which job it finishes
(and how many steps it has left); past `shutdown_grace_seconds`, or at a second Ctrl-C, that job is
given back, to go on from its last finished chunk on the next start, and the server exits at once.
Nothing is lost either way, and no signal ends in a traceback."""

from __future__ import annotations

import asyncio
import copy
import errno
import os
import socket
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING

import uvicorn

from vidserve.config import Settings
from vidserve.errors import VidserveError
from vidserve.jobs import Job, JobNotFound, JobStatus

if TYPE_CHECKING:
    from vidserve.workers.embedded import EmbeddedQueue

READY_POLL_SECONDS = 0.2
STOP_POLL_SECONDS = 0.1
# After the second Ctrl-C, how long the job gets to reach its next step and give itself back; a step
# longer than that (a large model) is not waited for: the job is given back from here.
FORCED_STOP_SECONDS = 2.0


def listen(host: str, port: int) -> socket.socket:
    """The server's listening socket; a VidserveError saying what to do if the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise VidserveError(f"port {port} on {host} is already in use (another vidserve?): stop that server, or "
                                f"choose another port (make serve PORT={port + 1}, or vidserve serve --port "
                                f"{port + 1})") from None
        raise VidserveError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def playground_url(host: str, port: int) -> str:
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


class _Server(uvicorn.Server):
    """uvicorn's server, saying where the playground is once the job queue is ready."""

    def __init__(self, config: uvicorn.Config, url: str, grace_seconds: float):
        super().__init__(config)
        self.url = url
        self.grace_seconds = grace_seconds
        self._announcing: asyncio.Task | None = None
        self._stop_signalled_at: float | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # requests are answered from here on; /readyz says when jobs run at full speed
            self._announcing = asyncio.get_running_loop().create_task(self._announce())

    async def _announce(self) -> None:
        queue = self.config.app.state.services.queue
        while queue.warming:
            await asyncio.sleep(READY_POLL_SECONDS)
        print(f"playground: {self.url}", file=sys.stdout, flush=True)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """The first signal drains the queue and stops the server; the next one stops it at once.
        Unlike uvicorn's, the signals are not raised again once the server has stopped: that ended
        every Ctrl-C in a KeyboardInterrupt traceback, though the stop was the one asked for."""
        if self.should_exit:
            self.force_exit = True
            return
        self._stop_signalled_at = time.monotonic()
        queue = self._embedded_queue()
        if queue is not None:
            queue.drain()  # here, not in shutdown: no job may start between the signal and the shutdown
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        queue = self._embedded_queue()
        if queue is not None:
            queue.drain()  # stopped some other way than by a signal
            await self._finish_running_job(queue)
        forced = self.force_exit
        await super().shutdown(sockets)
        if forced:  # uvicorn then skips the app's shutdown, whose cancelled lifespan task logged a traceback
            await self.lifespan.shutdown()  # quick: the worker is done, or its job given back

    def _embedded_queue(self) -> EmbeddedQueue | None:
        """The queue whose worker runs in this process (none with --queue celery)."""
        from vidserve.workers.embedded import EmbeddedQueue

        queue = self.config.app.state.services.queue
        return queue if isinstance(queue, EmbeddedQueue) else None

    async def _finish_running_job(self, queue: EmbeddedQueue) -> None:
        """Let the running job finish, within the grace period and until a second signal; past
        either, have it given back. The HTTP API answers meanwhile, so its progress can be followed."""
        job_id = queue.running_job_id
        job = await asyncio.to_thread(_job, queue, job_id) if job_id is not None else None
        if job is not None and job.status is JobStatus.in_progress:
            print(f"stopping: finishing {job.id} ({_steps_left(job)}); after {self.grace_seconds:g} s, or at "
                  f"another Ctrl-C, it stops and goes on from its last finished chunk on the next start",
                  file=sys.stdout, flush=True)
        started = self._stop_signalled_at or time.monotonic()
        interrupted_at: float | None = None
        while queue.alive:
            now = time.monotonic()
            if interrupted_at is None and (self.force_exit or now - started >= self.grace_seconds):
                queue.runner.interrupt()  # given back at its next step or chunk
                interrupted_at = now
            if interrupted_at is not None and self.force_exit and now - interrupted_at >= FORCED_STOP_SECONDS:
                break  # a step too long to wait for: given back from here
            await asyncio.sleep(STOP_POLL_SECONDS)
        stuck = queue.alive  # inside a call no step boundary interrupts (a model load, a decode)
        if job is not None:
            if stuck:
                await asyncio.to_thread(queue.runner.give_back, job.id)
            _say_how_it_ended(await asyncio.to_thread(_job, queue, job.id))
        if stuck:
            # Exiting the usual way with the worker inside torch aborts in its C++ teardown (SIGABRT):
            # nothing is left to save (the job is given back, the store's writes committed), so exit here.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _job(queue: EmbeddedQueue, job_id: str) -> Job | None:
    try:
        return queue.store.get(job_id)
    except JobNotFound:  # deleted meanwhile
        return None


def _say_how_it_ended(job: Job | None) -> None:
    if job is not None and job.status is JobStatus.in_progress:  # given back: the next start runs it again
        print(f"stopped {job.id} after {len(job.chunks)} of {len(job.params.chunk_frames)} chunks: it goes on from "
              f"there on the next start", file=sys.stdout, flush=True)
    elif job is not None and job.status is JobStatus.failed:  # given back with its attempts used up
        print(f"stopped {job.id}: {job.error.message}", file=sys.stdout, flush=True)


def _steps_left(job: Job) -> str:
    total = job.params.steps * len(job.params.chunk_frames)
    if job.stage == "encoding":
        return "encoding its outputs"
    return f"{total - job.steps_done} of {total} denoising steps left"


def serve(settings: Settings, sock: socket.socket, url: str, log_level: str) -> None:
    """Serve the API on `sock` (from `listen`) until stopped (see the module's docstring for how a
    signal stops it); `url`: where the playground is."""
    from .app import create_app

    # vidserve's own loggers (the chat KV cache's size, expiry sweeps, webhook retries) print as uvicorn's do.
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"]["vidserve"] = {"handlers": ["default"], "level": log_level.upper(), "propagate": False}
    # ws_max_size: a WebSocket message past the largest body is refused (1009) before it is buffered whole.
    config = uvicorn.Config(create_app(settings), log_level=log_level, log_config=log_config,
                            ws_max_size=settings.max_body_bytes)
    _Server(config, url, settings.shutdown_grace_seconds).run(sockets=[sock])
