"""The FastAPI application: explicit wiring of an engine to its routers and error handlers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from api import errors
from api.fast_paths import FastPaths
from api.routes import consumers, erasures, kv, objects, publish, streams, system
from api.waiters import Waiters
from engine import JetStream

DEFAULT_MAX_BODY = 64 * 1024 * 1024


def create_app(engine: JetStream, max_body: int = DEFAULT_MAX_BODY) -> FastAPI:
    """The gateway over an opened engine; on shutdown it flushes and closes the engine."""
    waiters = Waiters()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        waiters.bind(asyncio.get_running_loop())
        engine.notify = waiters.wake_threadsafe
        yield
        engine.notify = None
        # uvicorn may end the process right after shutdown: flush and release the warehouse here.
        await asyncio.to_thread(engine.close)

    app = FastAPI(title="JetLake", version="1", docs_url="/docs", redoc_url=None, lifespan=lifespan)
    app.state.waiters = waiters
    app.state.engine = engine
    app.state.max_body = max_body
    app.state.api_total = 0
    app.state.api_errors = 0

    app.add_middleware(FastPaths)
    app.add_middleware(_CountRequests)
    errors.install(app)
    app.include_router(system.router)
    app.include_router(streams.router)
    app.include_router(publish.router)
    app.include_router(consumers.router)
    app.include_router(erasures.router)
    app.include_router(kv.router)
    app.include_router(objects.router)
    return app


class _CountRequests:
    """Counts API requests for AccountInfo's `api.total` (a plain ASGI middleware: no per-request task)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/v1/"):
            scope["app"].state.api_total += 1
        await self.app(scope, receive, send)
