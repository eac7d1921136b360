"""Streams moving between gateways (several gateways, engine/cluster/): a stream this gateway now owns
is recovered under its lease and served, one it gives up is committed and closed, and one whose lease
another gateway took is dropped without a write. The lease's token fences every write of the stream and
of its consumers, so a gateway that lost a stream can never write it again. Counterpart: nats-server
moves a stream's leader with Raft (server/jetstream_cluster.go), JetLake with leases.
"""

from __future__ import annotations

from collections.abc import Callable

import orjson

from engine import errors
from engine.catalog import StreamRecord
from engine.consumers import Consumers
from engine.flusher import Flusher
from engine.store.layout import Layout
from engine.store.leases import Lease
from engine.store.tombstones import TombstoneView
from engine.stream_factory import StreamFactory
from engine.stream_registry import StreamRegistry


class StreamHandover:
    """Takes, hands over and loses the streams of a registry (see the module docstring); `notify(name)`
    ends the waits on a stream that leaves."""

    def __init__(self, layout: Layout, registry: StreamRegistry, factory: StreamFactory, consumers: Consumers,
                 flusher: Flusher, notify: Callable[[str], None]) -> None:
        self._layout = layout
        self._registry = registry
        self._factory = factory
        self._consumers = consumers
        self._flusher = flusher
        self._notify = notify

    def take(self, name: str, lease: Lease) -> None:
        """Serves a stream this gateway now owns (several gateways), recovered under `lease`, whose token
        fences its writes and its consumers'. Raises when it cannot be recovered (the lease is released)."""
        record = self._read_record(self._layout.stream_config_key(name))
        stream = self._factory.recover(record, lease, TombstoneView(self._layout.tombstones))
        if not stream.recovered:
            raise errors.UnavailableError(f"stream {name} is unavailable: {stream.failure}")
        from engine.erasures import registry as erasures  # pending erasures: forgotten again by the rebuilt memory
        erasures(self._layout).forget_pending([stream])
        self._consumers.open_stream(stream, lease)
        self._registry.register(name, stream)

    def hand_over(self, name: str) -> None:
        """Gives a stream up: its log committed, then no more writes (later ones stay in the fenced log)."""
        entry = self._registry.entries.get(name)
        if entry is None or entry.stream is None:
            return
        self._flusher.flush_stream(entry.stream)
        self._drop(name, "the stream moved to another gateway", flush=True)

    def lost(self, name: str, reason: str) -> None:
        """A stream's lease was taken over: it is dropped without a write (the next owner has it)."""
        self._drop(name, f"this gateway no longer owns the stream: {reason}", flush=False)

    def _drop(self, name: str, reason: str, flush: bool) -> None:
        with self._flusher.lock:
            entry = self._registry.entries.get(name)
            if entry is None or entry.stream is None:
                return
            stream = entry.stream
            with stream.lock:
                stream.unavailable = stream.failure = reason
            self._registry.unregister(name)
            self._consumers.close_stream(stream, flush)
            stream.store.close()
            self._flusher.forget(name)
        self._notify(name)

    def _read_record(self, key: str) -> StreamRecord:
        return StreamRecord.from_json(orjson.loads(self._layout.objects.get(key).data))
