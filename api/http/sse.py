"""Server-sent events of the watch routes: one JSON document per event, comments as heartbeats."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import orjson
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.http import deps

INIT_DONE = b"event: init_done\ndata: {}\n\n"
HEARTBEAT = b": heartbeat\n\n"
HEARTBEAT_SECONDS = 5.0


class Watcher(Protocol):
    stream_name: str

    @property
    def closed(self) -> bool: ...

    def initial(self) -> list[Any]: ...

    def updates(self, limit: int = 1000) -> list[Any]: ...

    @property
    def behind(self) -> bool: ...


def event(data: bytes) -> bytes:
    """A default ("message") event carrying one JSON document."""
    return b"data: " + data + b"\n\n"


def watch_response(request: Request, watcher: Watcher, to_json: Callable[[Any], Any]) -> StreamingResponse:
    """The initial items, `init_done`, then each change as the stream's waiters wake the loop.

    A publish whose wake-up came while `updates` ran in the thread pool (no waiter registered yet)
    leaves the watcher `behind`: it looks again instead of waiting for the next heartbeat.
    """

    async def events() -> AsyncIterator[bytes]:
        for item in await run_in_threadpool(watcher.initial):
            yield event(orjson.dumps(to_json(item)))
        yield INIT_DONE
        last_beat = time.monotonic()
        while not watcher.closed and not await request.is_disconnected():
            items = await run_in_threadpool(watcher.updates)
            for item in items:
                yield event(orjson.dumps(to_json(item)))
            if items:
                continue
            if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                yield HEARTBEAT
                last_beat = time.monotonic()
            if watcher.behind:
                continue
            await deps.waiters(request).wait(watcher.stream_name, HEARTBEAT_SECONDS)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
