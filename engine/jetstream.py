"""The JetStream facade: the stream registry, publish routing, and the flusher that feeds Delta.

One process owns a warehouse (an owner lock refuses a second). Streams are found by name and by
subject; a publish is routed to the stream whose subjects capture it and goes through that stream's
group commit. File streams keep their config in `_system/streams/<name>.json` and recover their
state from their table, the tombstones and their log when first used, or at start when they cannot
wait (engine/catalog.py, the catalog of every stream's config); memory streams live and die with
the process. The flusher (engine/flusher.py) moves each stream's log into its Delta table every
`flush_interval`, or sooner once `flush_bytes` are waiting. A stream whose recovery fails is kept
apart (every request on it is a 503, `/healthz` lists it) and the others serve. Making and recovering
a stream is engine/stream_factory.py's; keeping the catalog's compact copy in step (its change marks,
rewrites, the counters an account info sums) is engine/catalog_upkeep.py's. Counterpart:
server/jetstream.go and the stream parts of server/jetstream_api.go.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from engine import encryption, errors
from engine.catalog import (
    CatalogEntry, StreamEntries, StreamRecord, check_overlap, check_page, in_parallel, listed, opened_at_start,
    record_json, stream_key_tokens,
)
from engine.catalog_store import CatalogStore
from engine.catalog_upkeep import CatalogUpkeep
from engine.accounts import limits as account_limits
from engine.accounts.limits import UNLIMITED_LIMITS, AccountLimits
from engine.errors import JetStreamError
from engine.clock import Clock, SystemClock
from engine.consumer import Delivery
from engine.consumers import Consumers
from engine.config import check_stream_config, check_stream_update, parse_stream_config, same_config
from engine.flusher import Flusher, FlushResult, FlushStats
from engine.health import health_report
from engine.info import rfc3339, state_json
from engine.keys import Keyring, MasterKey
from engine.kv import KeyValueStores
from engine.objects import ObjectStores
from engine.backpressure import DEFAULT_MAX_PENDING_BYTES, Backpressure
from engine.store.backlog import DEFAULT_MAX_LOG_BYTES, DEFAULT_MAX_TOTAL_BYTES, Backlog
from engine.store import failpoints
from engine.store.base import StoredMessage
from engine.store.delta import DEFAULT_CACHE_BYTES, DeltaStore
from engine.store.layout import Layout
from engine.store.lease import OwnerLock
from engine.store.leases import Lease
from engine.store.objectstore import WarehouseLocation
from engine.store.tombstones import TombstoneView
from engine.messages import DEFAULT_MAX_PAYLOAD, InboundMessage, PlainBatch, PublishAnswer, PublishResult
from engine.stream import SUBJECTS_PAGE, Stream
from engine.stream_factory import StreamFactory
from engine.subjects import is_valid_publish_subject, is_valid_subject, matches_mask, valid_publish_mask

log = logging.getLogger(__name__)

DEFAULT_FLUSH_INTERVAL = 1.0
DEFAULT_FLUSH_BYTES = 128 * 1024 * 1024
API_LEVEL = 1
_ROUTE_AS_COLUMN = 32  # a batch of more distinct subjects is routed and validated as a column


@dataclass
class EngineOptions:
    sync_always: bool = False
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    max_payload: int = DEFAULT_MAX_PAYLOAD
    cache_bytes: int = DEFAULT_CACHE_BYTES
    account: str = "default"
    max_unflushed_bytes: int = DEFAULT_MAX_LOG_BYTES  # per log: each stream's, the ack log
    max_unflushed_total: int = DEFAULT_MAX_TOTAL_BYTES  # every log of the gateway together
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES  # a stream's uncommitted messages in memory: publishers wait
    limits: AccountLimits = UNLIMITED_LIMITS
    key: MasterKey | None = field(default=None, repr=False)  # encryption at rest (engine/encryption.py)
    prev_key: MasterKey | None = field(default=None, repr=False)  # nats-server's prev_key: re-wraps the keyring
    wal_dir: str | None = None  # local folder of the logs (default: the warehouse, or ./jetlake-state on S3)
    wal: str = "local"  # "object": the logs are objects in the warehouse (failover to another machine)
    takeover_wait: float = 0.0  # seconds to wait for another gateway's owner lease to expire
    cluster: bool = False  # several gateways: streams are owned one by one (`take`), not the warehouse


class JetStream:
    """Every stream of one account in one warehouse."""

    def __init__(
        self, warehouse: str | Path | WarehouseLocation, options: EngineOptions | None = None,
        clock: Clock | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        self.options = options or EngineOptions()
        self.clock = clock or SystemClock()
        self.layout = Layout(warehouse, self.options.account, self.options.wal_dir)
        self._owner = OwnerLock(self.layout)
        self._owner.on_lost = self._deposed
        self._streams = StreamEntries()  # every stream; opened on first use (engine/catalog.py)
        self._by_subject: dict[str, str | None] = {}
        self._tombstones: TombstoneView | None = None  # read at open; kept for the streams opened later
        self.catalog = CatalogStore(self.layout)  # the catalog's compact copy (engine/catalog_store.py)
        self._lock = threading.RLock()
        # The gateway's accounts share one backlog (engine/accounts/registry.py): its bound is the gateway's.
        self.backlog = backlog or Backlog(self.options.max_unflushed_bytes, self.options.max_unflushed_total)
        # `--wal object`: the logs are objects in the warehouse, fenced by the owner lease's token
        self._log_lease = self._owner.lease if self.options.wal == "object" else None
        self.consumers = Consumers(self.layout, self.clock, self.options.sync_always, self.backlog, self._log_lease)
        self.factory = StreamFactory(self.layout, self.clock, self.backlog, self._log_lease,
                                     sync_always=self.options.sync_always, cache_bytes=self.options.cache_bytes,
                                     max_payload=self.options.max_payload)
        self.consumers.scoped = self.options.cluster
        self.catalog_upkeep = CatalogUpkeep(self.catalog, self.consumers, self._entries, not self.options.cluster)
        self.consumers.changing = self.catalog_upkeep.changing
        # Several gateways (engine/cluster/service.py): a stream's lease is taken to make it, released to delete it
        self.claim_stream: Callable[[str], Lease] | None = None
        self.release_stream: Callable[[str], None] | None = None
        self.flusher = Flusher(self.streams, self.consumers, self.factory.reload, self.options.flush_interval)
        self.backpressure = Backpressure(self.options.max_pending_bytes)
        self.notify: Callable[[str], None] | None = None
        self.opened = False
        self.deposed: str | None = None
        self.kv = KeyValueStores(self)
        self.objects = ObjectStores(self)
        self._limits = self.options.limits
        self.consumers.limits = self._limits
        self.factory.quota = self if self._limits.limits_bytes else None

    @property
    def keyring(self) -> Keyring | None:
        """The account's keyring (encryption at rest, engine/keys/), once the engine is open; None without a key."""
        return self.factory.keyring

    @property
    def limits(self) -> AccountLimits:
        """The account's JetStream limits (engine/accounts/limits.py); a config reload may replace them."""
        return self._limits

    @limits.setter
    def limits(self, value: AccountLimits) -> None:
        self._limits = value
        self.consumers.limits = value
        self.factory.quota = self if value.limits_bytes else None
        if value.limits_bytes:  # every publish sums every stream's bytes
            self._open_all()
        for stream in self.streams():
            stream.quota = self if value.limits_bytes else None

    def exceeds(self, storage: str, size: int) -> bool:
        """Whether `size` more bytes of `storage` go over the account's limit (a stream's publish asks)."""
        used = sum(s.index.bytes for s in self._streams_view() if s.config.storage == storage)
        return account_limits.would_exceed(self._limits, storage, used, size)

    def _streams_view(self) -> list[Stream]:
        return [e.stream for e in list(self._streams.values()) if e.stream is not None]

    def _entries(self) -> list[tuple[str, CatalogEntry]]:
        """Every (name, entry) of the registry now, taken under its lock."""
        with self._lock:
            return list(self._streams.items())

    # -- lifecycle ----------------------------------------------------------------------------

    def open(self, start_flusher: bool = True) -> None:
        # Before the owner lock: a wrong or missing key refuses the start without writing a byte.
        self.factory.keyring = encryption.open_keyring(self.layout, self.options.key, self.options.prev_key, self.clock)
        if self.options.cluster:  # streams arrive one by one as this gateway claims them (`take`)
            self.consumers.notify, self.opened = self._notify, True
            if start_flusher:
                self.flusher.start()
            return
        self._owner.acquire(self.options.takeover_wait)
        try:
            self._tombstones = TombstoneView(self.layout.tombstones)  # read once for every stream
            found = self.catalog_upkeep.read()
            self.consumers.prepare(found.consumers)
            opened = self._load_streams(found.records)
            self.catalog_upkeep.start(found.rewrite)
            if all(e.stream is not None for e in self._streams.values()):
                self._tombstones = None
            from engine.erasures import registry  # pending erasures: forgotten again by the rebuilt memory

            registry(self.layout).forget_pending(s for s in opened if s.recovered)
            self.consumers.open({s.name: s for s in opened if s.recovered})
            self.consumers.notify = self._notify
            self.objects.sweep_orphans()
        except BaseException:
            self._owner.release()
            raise
        self.opened = True
        if start_flusher:
            self.flusher.start()

    def close(self, flush: bool = True) -> None:
        """Flushes every stream and releases the warehouse; `flush=False` for an account about to be
        deleted (engine/accounts/deletion.py), whose logs are not worth committing."""
        self.flusher.stop()
        if self.opened and self.deposed is not None:
            log.error("engine closed without flushing (the logs keep what is unflushed): %s", self.deposed)
            for stream in self._streams_view():
                stream.store.close()
            self.opened = False
        if self.opened and not flush:
            for stream in self._streams_view():
                stream.store.close()
            self._owner.release()
            self.opened = False
            log.info("engine closed without flushing (its account is being deleted)")
        if self.opened:
            result = self.flusher.flush()
            self.catalog_upkeep.close()  # before the index snapshots: a stop killed during them keeps the copy
            for stream in self._streams_view():
                if isinstance(stream.store, DeltaStore) and not result.failed:
                    with stream.lock:
                        stream.store.snapshot_if_stale(stream.index, stream.dedup_window)
                try:
                    stream.store.close()
                except OSError as exc:
                    log.error("closing stream %s's log failed: %s", stream.name, exc)
            self._owner.release()
            self.opened = False
            if result.failed:
                log.error("engine closed; not committed (kept in the logs for the next start): %s", result.failed)
            else:
                log.info("engine closed: every stream flushed, warehouse released")

    def _deposed(self, reason: str) -> None:
        """The owner lease was lost (renewals failed past its TTL; another gateway may own the warehouse
        now): this engine stops committing and refuses every request on its streams."""
        self.deposed = reason
        self.flusher.stop()
        for stream in self.streams():
            stream.unavailable = stream.failure = f"this gateway no longer owns the warehouse: {reason}"

    def _load_streams(self, records: list[StreamRecord]) -> list[Stream]:
        """Recovers the streams that cannot wait (engine/catalog.py), a few at a time: a stream's
        recovery mostly waits on small objects (its config, index snapshot, log folder, the table's
        latest commit), and each touches only its own state and the shared, read-only tombstone view.
        Every stream is registered in name order; returns the streams opened."""
        # logs in the object store are not listed here; byte limits: every publish sums every stream's bytes
        every = self.options.wal != "local" or bool(self._limits.limits_bytes)
        urgent = opened_at_start(records, self.layout, self.consumers.act_alone, every)
        opened = in_parallel(lambda r: self.factory.recover(r, None, self._tombstones),
                             [r for r in records if r.name in urgent])
        by_name = {s.name: s for s in opened}
        for record in records:
            stream = by_name.get(record.name)
            self._streams[record.name] = CatalogEntry.of(stream) if stream else CatalogEntry(record)
        log.info("%d streams: %d opened at start, the others on first use", len(records), len(opened))
        return opened

    def _open_all(self) -> None:
        for entry in list(self._streams.values()):
            self._opened(entry)

    def _opened(self, entry: CatalogEntry) -> Stream:
        return entry.open(self._open_later)

    def _open_later(self, record: StreamRecord) -> Stream:
        """A stream's first use after the start: recovered, its consumers restored."""
        if self.deposed is not None:
            raise errors.UnavailableError(f"this gateway no longer owns the warehouse: {self.deposed}")
        stream = self.factory.recover(record, None, self._tombstones)  # nothing wrote its tombstones since
        if stream.recovered:
            self.consumers.restore_stream(stream)
        return stream

    def take(self, name: str, lease: Lease) -> None:
        """Serves a stream this gateway now owns (several gateways), recovered under `lease`, whose token
        fences its writes and its consumers'. Raises when it cannot be recovered (the lease is released)."""
        record = self._read_record(self.layout.stream_config_key(name))
        stream = self.factory.recover(record, lease, TombstoneView(self.layout.tombstones))
        if not stream.recovered:
            raise errors.UnavailableError(f"stream {name} is unavailable: {stream.failure}")
        from engine.erasures import registry  # pending erasures: forgotten again by the rebuilt memory
        registry(self.layout).forget_pending([stream])
        self.consumers.open_stream(stream, lease)
        with self._lock:
            self._streams[name] = CatalogEntry.of(stream)
            self._by_subject.clear()

    def hand_over(self, name: str) -> None:
        """Gives a stream up: its log committed, then no more writes (later ones stay in the fenced log)."""
        entry = self._streams.get(name)
        if entry is None or entry.stream is None:
            return
        self.flusher.flush_stream(entry.stream)
        self._drop(name, "the stream moved to another gateway", flush=True)

    def lost(self, name: str, reason: str) -> None:
        """A stream's lease was taken over: it is dropped without a write (the next owner has it)."""
        self._drop(name, f"this gateway no longer owns the stream: {reason}", flush=False)

    def _drop(self, name: str, reason: str, flush: bool) -> None:
        with self.flusher.lock:
            entry = self._streams.get(name)
            if entry is None or entry.stream is None:
                return
            stream = entry.stream
            with stream.lock:
                stream.unavailable = stream.failure = reason
            with self._lock:
                self._streams.pop(name, None)
                self._by_subject.clear()
            self.consumers.close_stream(stream, flush)
            stream.store.close()
            self.flusher.forget(name)
        self._notify(name)

    def _read_record(self, key: str) -> StreamRecord:
        return StreamRecord.from_json(orjson.loads(self.layout.objects.get(key).data))

    # -- streams ------------------------------------------------------------------------------

    def add_stream(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates a stream; returns its info and whether it was created (False: identical exists)."""
        config, pedantic = parse_stream_config(body)
        if config.sealed:
            raise errors.invalid_config("stream configuration for create can not be sealed")
        config = check_stream_config(config, pedantic)
        with self._lock:
            others = [e.shape for n, e in self._streams.items() if n != config.name]
            account_limits.check_stream(self._limits, config, others)
            existing = self._streams.get(config.name)
            if existing is not None:
                stream = self._opened(existing)
                _check_available(stream)
                if same_config(stream.config, config):
                    return self._info(stream), False
                raise errors.stream_name_exists()
            check_overlap(self._streams, config)
            encryption.check_create(config, self.keyring)
            sealed = self.keyring is not None and config.storage != "memory"
            key_tokens = encryption.key_tokens(config) if sealed else None
            protected = encryption.protected_subjects(config)
            lease = self.claim_stream(config.name) if self.claim_stream is not None else None
            try:
                stream = self.factory.new_stream(config, self.clock.now_ns(), uuid.uuid4().hex, config.partition_tokens,
                                          key_tokens, protected, lease)
                if isinstance(stream.store, DeltaStore):
                    try:
                        stream.store.create()
                    except TimeoutError:
                        raise errors.UnavailableError(
                            f"a maintenance job holds the table of {config.name}; try again") from None
                    self._write_config(stream)
                if lease is not None:
                    self.consumers.open_stream(stream, lease)
            except BaseException:
                if lease is not None and self.release_stream is not None:
                    self.release_stream(config.name)
                raise
            stream.start_at_first_seq()
            self._streams[config.name] = CatalogEntry.of(stream)
            self._by_subject.clear()
            return self._info(stream), True

    def update_stream(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        config, pedantic = parse_stream_config(body)
        if "/" in name or "\\" in name:  # only a create answers 10128; an update's name check is checkStreamCfg's
            raise errors.invalid_stream_name()
        if config.name and config.name != name:
            raise errors.stream_mismatch()
        config.name = name
        config = check_stream_config(config, pedantic)
        with self._lock:
            stream = self._stream(name)
            check_stream_update(stream.config, config)
            encryption.check_update(stream.config, config, stream_key_tokens(stream) is not None)
            others = [e.shape for n, e in self._streams.items() if n != name]
            account_limits.check_stream(self._limits, config, others, update=stream.config)
            check_overlap(self._streams, config, exclude=name)
            old = stream.config
            stream.config = config
            try:
                if isinstance(stream.store, DeltaStore):
                    self._write_config(stream)
            except BaseException:
                stream.config = old
                raise
            stream.apply_config(config)
            self._streams.rerouted(name)
            self._by_subject.clear()
            return self._info(stream)

    def delete_stream(self, name: str) -> None:
        entry = self._streams.get(name)
        if entry is None:
            raise errors.StreamNotFoundError()
        self._opened(entry)  # its consumers' rows and its key go with it
        # Lock order everywhere: the flush lock before the registry lock (flush() takes both).
        with self.flusher.lock, self._lock:
            entry = self._streams.get(name)
            if entry is None or entry.stream is None:
                raise errors.StreamNotFoundError()
            stored = isinstance(entry.stream.store, DeltaStore)
            with entry.stream.lock, self.catalog_upkeep.changing(name) if stored else nullcontext():
                entry.stream.deleted = True
                self.consumers.drop_stream(entry.stream)
                del self._streams[name]
                self._by_subject.clear()
                self.layout.objects.delete(self.layout.stream_config_key(name))
                entry.stream.store.destroy()
                if self.keyring is not None and stream_key_tokens(entry.stream) is not None:
                    self.keyring.destroy_stream(entry.stream.stream_id)
                self.flusher.forget(name)
                self.consumers.close_stream(entry.stream, flush=False)  # its own ack store (several gateways)
        if self.options.cluster and self.release_stream is not None:
            self.release_stream(name)
        self._notify(name)  # waiting pulls and watches of the stream end now, not at their next timeout

    def stream_info(self, name: str, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        """StreamInfo; with `subjects_filter`, a page of subjects from `offset` and the paging fields
        `total`, `offset`, `limit` of nats-server's answer."""
        if subjects_filter is not None and not is_valid_subject(subjects_filter):
            raise errors.bad_request(f"invalid subjects_filter {subjects_filter!r}")
        if offset < 0:
            raise errors.bad_request("offset must not be negative")
        return self._info(self._stream(name), subjects_filter, offset)

    def list_streams(self, subject: str | None = None, offset: int = 0, limit: int = 256) -> dict[str, Any]:
        check_page(subject, offset, limit)
        with self._lock:
            entries = [e for _, e in listed(self._streams, subject)]
        for entry in entries[offset : offset + limit]:
            self._opened(entry)  # a page of infos opens its streams; the others stay closed
        missing = [e.stream.name for e in entries if e.stream is not None and e.stream.unavailable is not None]
        streams = [e for e in entries if e.stream is None or e.stream.unavailable is None]
        page = [self._info(self._opened(e)) for e in streams[offset : offset + limit]]
        answer = {"total": len(streams), "offset": offset, "limit": limit, "streams": page}
        if missing:
            answer["missing"] = missing  # as JetStream lists streams it cannot reach
        return answer

    def stream_names(self, subject: str | None = None, offset: int = 0, limit: int = 1024) -> dict[str, Any]:
        """A page of stream names (STREAM.NAMES), from the catalog: no stream is opened."""
        check_page(subject, offset, limit)
        with self._lock:
            items = listed(self._streams, subject)
        names = [n for n, e in items if e.stream is None or e.stream.unavailable is None]
        return {"total": len(names), "offset": offset, "limit": limit, "streams": names[offset : offset + limit]}

    def stream(self, name: str) -> Stream:
        return self._stream(name)

    def _stream(self, name: str) -> Stream:
        entry = self._streams.get(name)
        if entry is None:
            raise errors.StreamNotFoundError()
        stream = self._opened(entry)
        _check_available(stream)
        return stream

    def _stream_if_open(self, name: str) -> Stream | None:
        """The stream if it is open (an event loop's no-wait path); None when opening it is still to do."""
        entry = self._streams.get(name)
        if entry is None or entry.stream is None:
            return None
        _check_available(entry.stream)
        return entry.stream

    @property
    def healthy(self) -> bool:
        """The gateway takes writes: open, within its backlog bound, its ack log writable."""
        return self.opened and self.write_refusal() is None

    def write_refusal(self) -> str | None:
        """Why the gateway as a whole takes no writes now; None when it does (a single stream may still refuse)."""
        if not self.opened:
            return "the engine is not open"
        if self.backlog.total >= self.backlog.max_total_bytes:
            return f"{self.backlog.total} unflushed bytes in the logs, the bound is {self.backlog.max_total_bytes}"
        for acks in self.consumers.ack_stores():
            if acks.wal.broken is not None:
                return f"the ack log refuses writes: {acks.wal.broken}"
        return None

    def streams(self) -> list[Stream]:
        """The streams opened so far (each serves; the catalog's others have nothing in memory to report)."""
        with self._lock:
            return [e.stream for e in self._streams.values() if e.stream is not None]

    def _write_config(self, stream: Stream) -> None:
        with self.catalog_upkeep.changing(stream.name):
            action = failpoints.hit("stream.config") if failpoints.ARMED else None
            self.layout.objects.put(self.layout.stream_config_key(stream.name), orjson.dumps(record_json(stream)))
            failpoints.after("stream.config", action)

    def _info(self, stream: Stream, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        state = stream.state(subjects_filter, offset)
        info = {"config": stream.config.to_json(), "created": rfc3339(stream.created_ns)}
        total = state.pop("subjects_total", 0)
        info["state"] = state_json(state)
        info["ts"] = rfc3339(self.clock.now_ns())
        if total:
            info.update(total=total, offset=offset, limit=SUBJECTS_PAGE)
        return info

    # -- publish ------------------------------------------------------------------------------

    def stream_for_subject(self, subject: str) -> Stream | None:
        entry = self._entry_for_subject(subject)
        return entry.stream if entry else None

    def stream_name_for_subject(self, subject: str) -> str | None:
        """The name of the stream capturing a literal subject, from the catalog (nothing is opened)."""
        entry = self._entry_for_subject(subject, open_=False)
        return entry.name if entry else None

    def _entry_for_subject(self, subject: str, open_: bool = True) -> CatalogEntry | None:
        """The stream capturing a literal subject, opened unless `open_` is False (then it may not be);
        answers are cached until the set of streams changes."""
        try:
            name = self._by_subject[subject]
        except KeyError:
            with self._lock:
                name = self._streams.capturing(subject)
                if len(self._by_subject) > 100_000:
                    self._by_subject.clear()
                self._by_subject[subject] = name
        entry = self._streams.get(name) if name else None
        if entry is not None and open_:
            self._opened(entry)
        return entry

    def publish(self, messages: list[InboundMessage]) -> list[PublishResult]:
        """Publishes in order; each result is a PubAck or the error for that message."""
        results: list[PublishResult | None] = [None] * len(messages)
        groups: dict[str, tuple[CatalogEntry, list[int], list[InboundMessage]]] = {}
        last_subject, last_entry = None, None
        for i, msg in enumerate(messages):
            if msg.subject != last_subject:
                last_subject = msg.subject
                last_entry = self._entry_for_subject(msg.subject) if is_valid_publish_subject(msg.subject) else None
            if last_entry is None:
                valid = is_valid_publish_subject(msg.subject)
                results[i] = errors.no_stream_matches_subject() if valid else errors.bad_request(
                    f"invalid publish subject {msg.subject[:100]!r}"
                )
                continue
            group = groups.get(last_entry.stream.name)
            if group is None:
                group = groups[last_entry.stream.name] = (last_entry, [], [])
            group[1].append(i)
            group[2].append(msg)
        if len(groups) == 1 and all(r is None for r in results):
            entry, _, msgs = next(iter(groups.values()))
            self._admit(entry)
            out = entry.commit.submit(msgs)
            self._maybe_wake_flusher(entry)
            return out
        for entry, positions, msgs in groups.values():
            self._admit(entry)
            for pos, result in zip(positions, entry.commit.submit(msgs), strict=True):
                results[pos] = result
            self._maybe_wake_flusher(entry)
        return [r for r in results if r is not None]

    def _notify(self, stream_name: str) -> None:
        if self.notify is not None:
            self.notify(stream_name)

    def _maybe_wake_flusher(self, entry: CatalogEntry) -> None:
        self._notify(entry.stream.name)
        if entry.stream.store.pending_bytes() >= min(self.options.flush_bytes, self.backpressure.wake_bytes):
            self.flusher.wake()

    def _admit(self, entry: CatalogEntry) -> None:
        """Before a publish: waits while the stream holds its bound of uncommitted messages in memory."""
        self.backpressure.admit(entry.stream, self._flushing, self.flusher.wake)

    def _flushing(self, stream: Stream) -> bool:
        """The flusher runs and the stream's commits succeed: a wait for them ends (see Backpressure)."""
        health = self.flusher.health.get(stream.name)
        return self.flusher.running and stream.failure is None and stream.unavailable is None and (
            health is None or not health.consecutive_failures)

    def publish_nowait(self, messages: list[InboundMessage]) -> list[PublishResult] | None:
        """Publishes at once if that needs no waiting: one stream, its lock free, no fsync to wait for.

        Lets an event loop publish small messages without a thread hand-off; None means "use `publish`".
        """
        if self.options.sync_always or not messages:
            return None
        subject = messages[0].subject
        if (len(messages) > 1 and any(m.subject != subject for m in messages)) or not is_valid_publish_subject(subject):
            return None
        entry = self._entry_for_subject(subject, open_=False)
        if entry is None or entry.stream is None or self.backpressure.over(entry.stream):
            return None  # none, not opened yet (opening waits on the disk), or publishers must wait
        if not entry.stream.lock.acquire(blocking=False):
            return None  # busy
        try:
            results = entry.stream.process([messages])[0]
        finally:
            entry.stream.lock.release()
        self._maybe_wake_flusher(entry)
        return results

    def publish_batch(self, batch: PlainBatch) -> PublishAnswer:
        """Publishes a columnar batch of messages without headers; each result as `publish` gives it.

        A batch whose subjects all go to one stream goes through that stream's group commit as columns
        (answered by an `AckRun` when every message is accepted); any other batch is published message
        by message, with the same outcome.
        """
        entry = self._plain_entry(batch)
        if entry is None:
            return self.publish(batch.messages())
        self._admit(entry)
        out: PublishAnswer = entry.commit.submit(batch)  # type: ignore[arg-type, assignment]
        self._maybe_wake_flusher(entry)
        return out

    def publish_batch_nowait(self, batch: PlainBatch) -> PublishAnswer | None:
        """`publish_batch` at once if that needs no waiting (as `publish_nowait`); None means "use `publish_batch`"."""
        if self.options.sync_always:
            return None
        entry = self._plain_entry(batch, open_=False)
        if entry is None or entry.stream is None or self.backpressure.over(entry.stream):
            return None
        if not entry.stream.lock.acquire(blocking=False):
            return None
        try:
            out = entry.stream.process([batch])[0]
        finally:
            entry.stream.lock.release()
        self._maybe_wake_flusher(entry)
        return out

    def _plain_entry(self, batch: PlainBatch, open_: bool = True) -> CatalogEntry | None:
        """The one stream every subject of a batch goes to; None if there are several, none or a bad subject.

        A batch of many distinct subjects is checked as a column: the stream of its first subject must
        capture all of them (streams' subjects never overlap, so no other stream can), and all must be
        valid literal subjects. One subject at a time, a million distinct subjects cost ~20 µs each in
        validation, routing and their caches."""
        distinct = set(batch.subjects)
        if len(distinct) > _ROUTE_AS_COLUMN:
            first = batch.subjects[0]
            entry = self._entry_for_subject(first, open_) if is_valid_publish_subject(first) else None
            if entry is None:
                return None
            column = batch.subject_column()
            captured = matches_mask(list(entry.subjects), column)
            return entry if bool((captured & valid_publish_mask(column)).all()) else None
        found: CatalogEntry | None = None
        for subject in distinct:
            entry = self._entry_for_subject(subject, open_) if is_valid_publish_subject(subject) else None
            if entry is None or (found is not None and entry is not found):
                return None
            found = entry
        return found

    def throttle(self, stream: Stream, timeout: float = 120.0) -> None:
        """Waits while the stream's unflushed log holds twice `flush_bytes`: a large upload cannot
        outrun the flusher and fill the memory. Gives up waiting (and lets the write through) after
        `timeout` seconds, e.g. while a Spark job holds the table's lease."""
        limit = 2 * self.options.flush_bytes
        deadline = time.monotonic() + timeout
        while stream.store.pending_bytes() >= limit and self.flusher.running and time.monotonic() < deadline:
            self.flusher.wake()
            time.sleep(0.005)

    def publish_one(self, subject: str, data: bytes, headers: dict[str, list[str]] | None = None) -> PublishResult:
        return self.publish([InboundMessage(subject, data, headers)])[0]

    # -- messages -----------------------------------------------------------------------------

    def get_message(self, name: str, seq: int) -> StoredMessage:
        return self._stream(name).get(seq)

    def delete_message(self, name: str, seq: int, erase: bool = True) -> None:
        stream = self._stream(name)
        if erase and isinstance(stream.store, DeltaStore):
            from engine.erasures import registry  # queues a GDPR erasure request for the erase job

            registry(self.layout).delete_and_queue(stream, seq)
        else:
            stream.delete_message(seq, erase)

    def rotate_key(self, name: str) -> int:
        """Starts a new key epoch for an encrypted stream's new writes, at once; returns it. The compaction
        job (with the keyring) re-encrypts older values and then destroys the older epochs' keys."""
        stream = self._stream(name)
        sealer = getattr(stream.store, "sealer", None)
        if sealer is None:
            raise errors.bad_request(f"stream {name} is not encrypted")
        with stream.lock:
            return int(sealer.keys.rotate())

    def purge(self, name: str, filter_: str | None = None, seq: int = 0, keep: int = 0) -> int:
        return self._stream(name).purge(filter_, seq, keep)

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, stream: str, body: dict[str, Any], name: str | None = None) -> tuple[dict[str, Any], bool]:
        return self.consumers.add(self._stream(stream), body, name)

    def update_consumer(self, stream: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.consumers.update(self._stream(stream), name, body)

    def delete_consumer(self, stream: str, name: str) -> None:
        self.consumers.delete(self._stream(stream), name)

    def consumer_info(self, stream: str, name: str) -> dict[str, Any]:
        return self.consumers.info(self._stream(stream), name)

    def list_consumers(self, stream: str, offset: int = 0, limit: int = 256) -> dict[str, Any]:
        return self.consumers.list(self._stream(stream), offset, limit)

    def fetch(self, stream: str, consumer: str, batch: int, max_bytes: int = 0) -> list[Delivery]:
        return self.consumers.fetch(self._stream(stream), consumer, batch, max_bytes)

    def fetch_nowait(self, stream: str, consumer: str, batch: int, max_bytes: int = 0) -> list[Delivery] | None:
        """`fetch` if it needs no waiting (see Consumers.fetch_nowait); None means "use `fetch`"."""
        target = self._stream_if_open(stream)
        return None if target is None else self.consumers.fetch_nowait(target, consumer, batch, max_bytes)

    def ack(self, stream: str, consumer: str, acks: list[tuple[str | int, str, int]]) -> list[JetStreamError | None]:
        return self.consumers.ack(self._stream(stream), consumer, acks)

    def ack_nowait(self, stream: str, consumer: str, acks: list[tuple[str | int, str, int]]) -> list[JetStreamError | None] | None:
        """`ack` if it needs no waiting; None means "use `ack`"."""
        target = self._stream_if_open(stream)
        return None if target is None else self.consumers.ack_nowait(target, consumer, acks)

    def ack_run(
        self, stream: str, consumer: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[JetStreamError | None]:
        """`ack` of stream sequences sharing one kind and delay, in order: one result per sequence."""
        return self.consumers.ack_run(self._stream(stream), consumer, seqs, kind, delay)

    def ack_run_nowait(
        self, stream: str, consumer: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[JetStreamError | None] | None:
        """`ack_run` if it needs no waiting; None means "use `ack_run`"."""
        return self.consumers.ack_run_nowait(self._stream(stream), consumer, seqs, kind, delay)

    # -- the flusher --------------------------------------------------------------------------

    @property
    def flush_stats(self) -> FlushStats:
        return self.flusher.stats

    def flush(self, fold_acks: bool = True) -> int:
        """Commits every stream's unflushed log (and the ack log) to the tables now; returns the commits
        made. `flush_report` also says what could not be committed."""
        return self.flusher.flush(fold_acks).commits

    def flush_report(self, lease_wait: float = 0) -> FlushResult:
        """`flush`, waiting up to `lease_wait` seconds for a maintenance job's commit lease; the result
        lists each stream or table it could not commit, with the error (a lease held is one)."""
        return self.flusher.flush(fold_acks=True, lease_timeout=lease_wait)

    def flush_stream(self, stream: Stream) -> int:
        """Commits one stream's log now (a large upload keeps its own backlog small); 1 if it committed."""
        return self.flusher.flush_stream(stream)

    def health(self) -> dict[str, Any]:
        """What `/healthz` reports: whether writes are taken, failing flushes, lag, failed streams, damaged logs."""
        return health_report(self.streams(), self.flusher, self.consumers, self.backlog, self.write_refusal())

    # -- account ------------------------------------------------------------------------------

    def account_info(self) -> dict[str, Any]:
        """JetStream's AccountInfo (without `api`, which the front doors count): usage and limits. A
        stream not opened yet counts by the counters the catalog copy holds for it, when its table and
        tombstones are still where they were when they were written; otherwise it is opened."""
        entries = self._entries()
        memory = storage = consumers = 0
        for name, entry in entries:
            counted = self.catalog_upkeep.stored_counters(name, entry, self._tombstones) if entry.stream is None else None
            if counted is None:
                stream = self._opened(entry)
                used, consumers = stream.index.bytes, consumers + stream.consumer_count
            else:
                used, consumers = counted["bytes"], consumers + self.consumers.unrestored_count(name)
            if entry.shape.storage == "memory":
                memory += used
            else:
                storage += used
        configs = [entry.shape for _, entry in entries]
        return {
            "memory": memory,
            "storage": storage,
            "reserved_memory": account_limits.reserved_bytes(configs, "memory"),
            "reserved_storage": account_limits.reserved_bytes(configs, "file"),
            "streams": len(entries),
            "consumers": consumers,
            "limits": self._limits.to_json(),
        }


def _check_available(stream: Stream) -> None:
    if stream.unavailable is not None:
        raise errors.UnavailableError(f"stream {stream.name} is unavailable: {stream.unavailable}")
