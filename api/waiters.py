"""Waking pulls that wait: the engine says which stream changed, waiting requests of it wake at once."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from engine.accounts.registry import Account


class Waiters:
    """Per-stream sets of events; `wake` is called from any thread through the loop."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = defaultdict(set)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread = threading.get_ident()

    def wake_threadsafe(self, stream: str) -> None:
        loop = self._loop
        if loop is None or not self._events.get(stream):
            return
        if threading.get_ident() == self._loop_thread:
            self._wake(stream)  # a publish answered on the loop itself: no self-pipe write needed
        else:
            loop.call_soon_threadsafe(self._wake, stream)

    def _wake(self, stream: str) -> None:
        for event in self._events.get(stream, ()):
            event.set()

    async def wait(self, stream: str, timeout: float) -> None:
        """Returns when the stream changes or `timeout` seconds pass."""
        if timeout <= 0:
            return
        event = asyncio.Event()
        self._events[stream].add(event)
        try:
            async with asyncio.timeout(timeout):  # no extra task per wait, unlike asyncio.wait_for
                await event.wait()
        except TimeoutError:
            pass
        finally:
            self._events[stream].discard(event)
            if not self._events[stream]:
                del self._events[stream]


class WaitersByAccount(Protocol):
    """Where a front door finds an account's waiters (the HTTP door's gate holds them for both doors)."""

    def waiters_of(self, account: Account) -> Waiters: ...
