"""The FastAPI application: explicit wiring of an engine to its routers and error handlers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import Response

from api import errors
from api.routes import consumers, publish, streams, system
from api.waiters import Waiters
from engine import JetStream

DEFAULT_MAX_BODY = 64 * 1024 * 1024


def create_app(engine: JetStream, max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The gateway over an opened engine. The caller owns the engine's lifecycle."""
    waiters = Waiters()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        waiters.bind(asyncio.get_running_loop())
        engine.notify = waiters.wake_threadsafe
        yield
        engine.notify = None

    app = FastAPI(title="JetLake", version="1", docs_url="/docs", redoc_url=None, lifespan=lifespan)
    app.state.waiters = waiters
    app.state.engine = engine
    app.state.max_body = max_body
    app.state.api_total = 0
    app.state.api_errors = 0

    @app.middleware("http")
    async def _count(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path.startswith("/v1/"):
            request.app.state.api_total += 1
        return await call_next(request)

    errors.install(app)
    app.include_router(system.router)
    app.include_router(streams.router)
    app.include_router(publish.router)
    app.include_router(consumers.router)
    return app
