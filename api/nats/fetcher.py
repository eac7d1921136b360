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

    async def fetch(self, stream: str, consumer: str, batch: int, max_bytes: int) -> list[Delivery]:
        """On the loop when the engine needs no waiting, else in a worker thread."""
        got = self.engine.fetch_nowait(stream, consumer, batch, max_bytes)
        if got is None:
            got = await asyncio.get_running_loop().run_in_executor(None, self.engine.fetch, stream, consumer, batch, max_bytes)
        return got

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
