"""The FastAPI application: explicit wiring of the accounts' engines to the gate, routers and error handlers."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Protocol

from fastapi import FastAPI

from api.http import errors
from api.auth import Authenticator
from api.http.fast_paths import FastPaths
from api.http.gate import Gate, GateMiddleware
from api.http.peers import Locator
from api.http.routes import accounts, cluster as cluster_routes, consumers, erasures, kv, objects, publish, streams, system
from engine.accounts.config import ConfigError
from engine.accounts.config import load as load_config
from engine.accounts.registry import Accounts
from engine.cluster.service import Cluster

DEFAULT_MAX_BODY = 64 * 1024 * 1024
log = logging.getLogger(__name__)


class Door(Protocol):
    """Another front door served on the same event loop (the NATS listener): started once the gate is
    bound to the loop (it shares the accounts' pull waiters), stopped before the engines close."""

    async def start(self, gate: Gate) -> None: ...

    async def stop(self) -> None: ...


def create_app(
    accounts_: Accounts,
    authenticator: Authenticator,
    max_body: int = DEFAULT_MAX_BODY,
    config_path: str | Path | None = None,
    doors: Sequence[Door] = (),
    locator: Locator | None = None,
    cluster: Cluster | None = None,
) -> FastAPI:
    """The gateway over opened accounts; on shutdown it flushes and closes every engine. With a
    `config_path`, SIGHUP reloads it (connections stay open; a removed user is refused from then on).
    With a `cluster` (several gateways on one warehouse), requests for streams owned elsewhere are
    proxied to their owner (api/http/forwarding.py; `locator` alone for tests), and on shutdown its
    streams are handed over before the engines close."""
    if cluster is not None:
        locator = locator or cluster.locator
    gate = Gate(accounts_, authenticator)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        gate.bind(loop)
        for door in doors:
            await door.start(gate)
        if config_path is not None:
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(_reload(gate, Path(config_path))))
        yield
        if config_path is not None:
            loop.remove_signal_handler(signal.SIGHUP)
        for door in doors:
            await door.stop()
        gate.unbind()
        if cluster is not None:
            await asyncio.to_thread(cluster.stop)
        # uvicorn may end the process right after shutdown: flush and release the warehouse here.
        await asyncio.to_thread(accounts_.close)

    app = FastAPI(title="JetLake", version="1", docs_url="/docs", redoc_url=None, lifespan=lifespan)
    app.state.gate = gate
    app.state.max_body = max_body
    app.state.cluster = cluster

    app.add_middleware(FastPaths)
    if locator is not None:
        # Imported here: its HTTP client (httpx) costs a single gateway's start-up and is used only in a cluster.
        from api.http.forwarding import ForwardingMiddleware

        app.add_middleware(ForwardingMiddleware, locator=locator)  # inside the gate: the caller is known
    app.add_middleware(GateMiddleware, gate=gate)
    errors.install(app)
    app.include_router(system.router)
    app.include_router(cluster_routes.router)
    app.include_router(accounts.router)
    app.include_router(streams.router)
    app.include_router(publish.router)
    app.include_router(consumers.router)
    app.include_router(erasures.router)
    app.include_router(kv.router)
    app.include_router(objects.router)
    return app


_reloading = asyncio.Lock()


async def _reload(gate: Gate, path: Path) -> None:
    """SIGHUP: the config file again; a bad one is logged and the running config stays."""
    async with _reloading:
        try:
            config = await asyncio.to_thread(load_config, path)
        except ConfigError as exc:
            log.error("SIGHUP: %s not reloaded, the running config stays: %s", path, exc)
            return
        try:
            changes = await asyncio.to_thread(gate.reload, config)
        except Exception:
            log.exception("SIGHUP: applying %s failed; the running config stays", path)
            return
        log.info("SIGHUP: %s reloaded%s", path, "".join(f"; {c}" for c in changes))
