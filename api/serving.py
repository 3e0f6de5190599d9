"""`vidserve serve`'s process: the port taken before anything loads (so a port in use is one
line, at once), uvicorn on it, and one line with the playground's address once the server is
ready to take jobs (after the embedded worker's warm-up)."""

from __future__ import annotations

import asyncio
import copy
import errno
import socket
import sys

import uvicorn

from vidserve.config import Settings
from vidserve.errors import VidserveError

READY_POLL_SECONDS = 0.2


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

    def __init__(self, config: uvicorn.Config, url: str):
        super().__init__(config)
        self.url = url
        self._announcing: asyncio.Task | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:  # requests are answered from here on; /readyz says when jobs run at full speed
            self._announcing = asyncio.get_running_loop().create_task(self._announce())

    async def _announce(self) -> None:
        queue = self.config.app.state.services.queue
        while queue.warming:
            await asyncio.sleep(READY_POLL_SECONDS)
        print(f"playground: {self.url}", file=sys.stdout, flush=True)


def serve(settings: Settings, sock: socket.socket, url: str, log_level: str) -> None:
    """Serve the API on `sock` (from `listen`) until stopped; `url`: where the playground is."""
    from .app import create_app

    # vidserve's own loggers (the chat KV cache's size, expiry sweeps, webhook retries) print as uvicorn's do.
    log_config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    log_config["loggers"]["vidserve"] = {"handlers": ["default"], "level": log_level.upper(), "propagate": False}
    # ws_max_size: a WebSocket message past the largest body is refused (1009) before it is buffered whole.
    config = uvicorn.Config(create_app(settings), log_level=log_level, log_config=log_config,
                            ws_max_size=settings.max_body_bytes)
    _Server(config, url).run(sockets=[sock])
