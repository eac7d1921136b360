"""A connection's outbound side: what it sends in one loop iteration leaves in one `write`, and a client
that does not read is dropped.

The first send of an iteration schedules the flush (what answers a read is written at the read's end,
api/nats/parser.py, as nats-server flushes its clients after each read). The buffer is bounded: past
`MAX_PENDING` bytes queued or in the transport, or with the socket not drained for `WRITE_DEADLINE`
seconds, the client is a slow consumer and is closed at once, as nats-server closes it (no -ERR).
The bottom layer of api/nats/connection.py's Connection; the listener is seen only as what it counts.
Counterpart: server/client.go (queueOutbound, flushOutbound, markConnAsSlow).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from api.nats import protocol as p

log = logging.getLogger("api.nats.connection")  # a slow consumer is the connection's event: logged under its name

WRITE_DEADLINE = 10.0


class Counters(Protocol):
    """What the outbound side counts on the listener (api/nats/server.py's NatsServer)."""

    slow_consumers: int


class Outbound(asyncio.Protocol):
    """The queue of bytes to one client, its flush, and its closing: gracefully (flushed) or at once."""

    server: Counters
    cid: int
    name: str

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop  # the one that accepted it (connection_made)
        self._paused_at = 0.0
        self._timers: list[asyncio.TimerHandle] = []  # the connection's: all cancelled when it is lost

    def send(self, data: bytes) -> None:
        """Queues bytes for this loop iteration's write; a client that does not read is dropped."""
        if self.closed:
            return
        self._out.append(data)
        self._out_size += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._out_size > p.MAX_PENDING:
            self._slow_consumer()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self.closed:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out = []
        self._out_size = 0
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > p.MAX_PENDING:
            self._slow_consumer()

    def pause_writing(self) -> None:
        self._paused_at = time.monotonic()
        self._timers.append(asyncio.get_running_loop().call_later(WRITE_DEADLINE, self._check_stalled))

    def resume_writing(self) -> None:
        self._paused_at = 0.0

    def _check_stalled(self) -> None:
        if self._paused_at and time.monotonic() - self._paused_at >= WRITE_DEADLINE:
            self._slow_consumer()

    def _slow_consumer(self) -> None:
        log.warning("slow consumer: closing client %d (%s)", self.cid, self.name or "unnamed")
        self.server.slow_consumers += 1
        self.abort()

    @property
    def writable(self) -> bool:
        """Whether the kernel takes our bytes: deliveries that can wait (push, pulls) hold back when not."""
        return not self._paused_at and not self.closed

    def close(self) -> None:
        """Sends what is queued, then closes."""
        if self.closed:
            return
        self._flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close_with_error(self, text: str) -> None:
        self.send(p.err(text))
        self.close()

    def abort(self) -> None:
        """Closes at once, dropping what is queued (a slow consumer)."""
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()
