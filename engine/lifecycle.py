"""An account's engine from its start to its stop.

The start opens the keyring (a wrong or missing key refuses it before a byte is written), takes the
warehouse's owner lock (one process owns a warehouse), reads the catalog and recovers the streams that
cannot wait, a few at a time (engine/catalog.py), then their consumers; the others open on first use.
The stop flushes every stream, writes the catalog copy and stale index snapshots, and releases the
warehouse. An owner that lost its lease is deposed: it stops committing and refuses every request on
its streams. With several gateways there is no owner lock: streams come and go one by one
(engine/stream_handover.py). Counterpart: server/jetstream.go `enableJetStream` and `shutdown`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from engine import encryption
from engine.account_usage import AccountUsage
from engine.catalog import CatalogEntry, StreamRecord, in_parallel, opened_at_start
from engine.catalog_upkeep import CatalogUpkeep
from engine.clock import Clock
from engine.consumers import Consumers
from engine.flusher import Flusher
from engine.objects import ObjectStores
from engine.options import EngineOptions
from engine.store.delta import DeltaStore
from engine.store.layout import Layout
from engine.store.lease import OwnerLock
from engine.store.tombstones import TombstoneView
from engine.stream import Stream
from engine.stream_factory import StreamFactory
from engine.stream_registry import StreamRegistry

log = logging.getLogger(__name__)


class Lifecycle:
    """Opens and closes one account's engine (see the module docstring). `opened` while it serves;
    `deposed` says why the owner lease was lost (None while it is held). `notify(name)` is what the
    consumers call when a stream's waits have news."""

    def __init__(self, options: EngineOptions, clock: Clock, layout: Layout, owner: OwnerLock, *,
                 registry: StreamRegistry, factory: StreamFactory, consumers: Consumers,
                 catalog_upkeep: CatalogUpkeep, flusher: Flusher, objects: ObjectStores, account: AccountUsage,
                 notify: Callable[[str], None]) -> None:
        self._options = options
        self._clock = clock
        self._layout = layout
        self.owner = owner
        self.opened = False
        self.deposed: str | None = None
        self._registry = registry
        self._factory = factory
        self._consumers = consumers
        self._catalog_upkeep = catalog_upkeep
        self._flusher = flusher
        self._objects = objects
        self._account = account
        self._notify = notify
        owner.on_lost = self.depose

    def open(self, start_flusher: bool = True) -> None:
        # Before the owner lock: a wrong or missing key refuses the start without writing a byte.
        self._factory.keyring = encryption.open_keyring(self._layout, self._options.key, self._options.prev_key,
                                                        self._clock)
        if self._options.cluster:  # streams arrive one by one as this gateway claims them (`take`)
            self._consumers.notify, self.opened = self._notify, True
            if start_flusher:
                self._flusher.start()
            return
        self.owner.acquire(self._options.takeover_wait)
        try:
            self._registry.tombstones = TombstoneView(self._layout.tombstones)  # read once for every stream
            found = self._catalog_upkeep.read()
            self._consumers.prepare(found.consumers)
            opened = self._load_streams(found.records)
            self._catalog_upkeep.start(found.rewrite)
            if all(e.stream is not None for e in self._registry.entries.values()):
                self._registry.tombstones = None
            from engine.erasures import registry  # pending erasures: forgotten again by the rebuilt memory

            registry(self._layout).forget_pending(s for s in opened if s.recovered)
            self._consumers.open({s.name: s for s in opened if s.recovered})
            self._consumers.notify = self._notify
            self._objects.sweep_orphans()
        except BaseException:
            self.owner.release()
            raise
        self.opened = True
        if start_flusher:
            self._flusher.start()

    def close(self, flush: bool = True) -> None:
        """Flushes every stream and releases the warehouse; `flush=False` for an account about to be
        deleted (engine/accounts/deletion.py), whose logs are not worth committing."""
        self._flusher.stop()
        if self.opened and self.deposed is not None:
            log.error("engine closed without flushing (the logs keep what is unflushed): %s", self.deposed)
            for stream in self._registry.opened_now():
                stream.store.close()
            self.opened = False
        if self.opened and not flush:
            for stream in self._registry.opened_now():
                stream.store.close()
            self.owner.release()
            self.opened = False
            log.info("engine closed without flushing (its account is being deleted)")
        if self.opened:
            result = self._flusher.flush()
            self._catalog_upkeep.close()  # before the index snapshots: a stop killed during them keeps the copy
            for stream in self._registry.opened_now():
                if isinstance(stream.store, DeltaStore) and not result.failed:
                    with stream.lock:
                        stream.store.snapshot_if_stale(stream.index, stream.dedup_window)
                try:
                    stream.store.close()
                except OSError as exc:
                    log.error("closing stream %s's log failed: %s", stream.name, exc)
            self.owner.release()
            self.opened = False
            if result.failed:
                log.error("engine closed; not committed (kept in the logs for the next start): %s", result.failed)
            else:
                log.info("engine closed: every stream flushed, warehouse released")

    def depose(self, reason: str) -> None:
        """The owner lease was lost (renewals failed past its TTL; another gateway may own the warehouse
        now): this engine stops committing and refuses every request on its streams."""
        self.deposed = reason
        self._flusher.stop()
        for stream in self._registry.streams():
            stream.unavailable = stream.failure = f"this gateway no longer owns the warehouse: {reason}"

    def _load_streams(self, records: list[StreamRecord]) -> list[Stream]:
        """Recovers the streams that cannot wait (engine/catalog.py), a few at a time: a stream's
        recovery mostly waits on small objects (its config, index snapshot, log folder, the table's
        latest commit), and each touches only its own state and the shared, read-only tombstone view.
        Every stream is registered in name order; returns the streams opened."""
        # logs in the object store are not listed here; byte limits: every publish sums every stream's bytes
        every = self._options.wal != "local" or bool(self._account.limits.limits_bytes)
        urgent = opened_at_start(records, self._layout, self._consumers.act_alone, every)
        opened = in_parallel(lambda r: self._factory.recover(r, None, self._registry.tombstones),
                             [r for r in records if r.name in urgent])
        by_name = {s.name: s for s in opened}
        for record in records:
            stream = by_name.get(record.name)
            self._registry.entries[record.name] = CatalogEntry.of(stream) if stream else CatalogEntry(record)
        log.info("%d streams: %d opened at start, the others on first use", len(records), len(opened))
        return opened
