"""The FastAPI app factory: `create_app(settings)` for the server, tests build their own."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI

from vidserve import __version__
from vidserve.config import Settings, get_settings
from vidserve.ratelimit import OpenStreams

from . import errors, openapi
from .auth import KeyRateLimit
from .body_limit import BodyLimit
from .protocol.errors import errors as error_responses
from .routers import chat, health, loras, metrics, models, playground, realtime, streams, videos
from .services import Services, build_services


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    settings = settings or get_settings()
    services = services or build_services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        services.start()
        try:
            yield
        finally:
            services.stop()

    # Every route caps its body, chunked or not (413).
    app = FastAPI(title="vidserve", version=__version__, lifespan=lifespan, responses=error_responses(413))
    app.state.services = services
    errors.install(app)
    openapi.install(app)
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    app.add_middleware(KeyRateLimit, services=services)  # added last: the outermost, so it answers first
    app.state.streams = OpenStreams()
    # Any /v1 route may refuse a query, a key or its rate, and may find the store or the storage down;
    # each route lists what else it answers.
    for router in (videos.router, streams.router, realtime.router, chat.router, models.router, loras.router):
        app.include_router(router, responses=error_responses(400, 401, 429, 500, 503))
    for router in (health.router, metrics.router, playground.router):
        app.include_router(router)
    return app
