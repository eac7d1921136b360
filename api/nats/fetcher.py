"""How pull requests and push consumers take messages from the engine, and sleep between takes.

Both deliver the same way: `fetch` on the event loop when the engine needs no waiting, else in a
worker thread; between fetches they sleep on the stream's waiters (api/waiters.py, shared with the
HTTP door), which a publish or an ack wakes, at most until the consumer's next ack deadline. One
object, handed down to pulls, pushes and acks, so that none of them needs the JetStream API above it.
Counterpart: the waiting side of server/consumer.go (processWaiting, the `mch` signal).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from engine import JetStreamError
from engine.consumer import Consumer, Delivery

if TYPE_CHECKING:
    from api.waiters import Waiters
    from engine import JetStream

NS = 1_000_000_000


class Fetcher:
    """The engine's fetch and the stream waiters of one account; `waiters` is set when the door starts."""

    def __init__(self, engine: JetStream) -> None:
        self.engine = engine
        self.waiters: Waiters
        self._in_flight: dict[tuple[str, str], asyncio.Future[list[Delivery]]] = {}

    async def fetch(self, stream: str, consumer: str, batch: int, max_bytes: int) -> list[Delivery]:
        """On the loop when the engine needs no waiting, else in a worker thread (see `after_delivery`)."""
        got = self.engine.fetch_nowait(stream, consumer, batch, max_bytes)
        if got is not None:
            return got
        future = asyncio.get_running_loop().run_in_executor(None, self.engine.fetch, stream, consumer, batch, max_bytes)
        key = (stream, consumer)
        self._in_flight[key] = future
        try:
            return await future
        finally:
            if self._in_flight.get(key) is future:
                del self._in_flight[key]

    def after_delivery(self, stream: str, consumer: str, answer: Callable[[], None]) -> None:
        """Runs `answer` once the consumer's threaded fetch, if one runs, has been sent.

        A threaded fetch counts its messages as delivered before they are on the wire, while
        nats-server counts them when they are in the client's buffer: a consumer info must not answer
        `num_pending: 0` ahead of them on the same connection (nats.py's KV watcher ends its initial
        values on that answer). The fetching task is woken before this callback runs, and frames and
        sends what it took without yielding.
        """
        future = self._in_flight.get((stream, consumer))
        if future is None or future.done():
            answer()
        else:
            future.add_done_callback(lambda _f: answer())

    async def wait(self, stream: str, timeout: float) -> None:
        await self.waiters.wait(stream, timeout)

    def wake(self, stream: str) -> None:
        self.waiters.wake_threadsafe(stream)

    def acks_applied(self, stream: str, consumer: str) -> None:
        """Acks free room under max_ack_pending: pulls waiting on the consumer try again now."""
        try:
            target = self.engine.stream(stream).consumers.get(consumer)
        except JetStreamError:
            return
        if target is not None and target.waiting:
            self.wake(stream)

    @staticmethod
    def redelivery_wait(target: Consumer) -> float:
        """Seconds until the consumer's next ack deadline (at most one)."""
        deadline = target.next_deadline()
        if deadline is None:
            return 1.0
        return max(min((deadline - time.time_ns()) / NS, 1.0), 0.001)
