"""The JetStream facade: every stream of one account in one warehouse, behind the calls the front
doors (api/http, api/nats), the buckets and the cluster make.

One process owns a warehouse (an owner lock refuses a second). The facade composes the concepts and
holds none of their state: the registry finds streams by name and subject and opens each on first use
(engine/stream_registry.py, over engine/catalog.py); the STREAM.* API creates, changes, deletes and
describes them (engine/stream_admin.py); a publish is routed to the stream capturing its subject and
goes through that stream's group commit (engine/publish_router.py); the account's limits and usage are
engine/account_usage.py's; the start, the stop and a lost owner lease are engine/lifecycle.py's, and
streams moving between gateways engine/stream_handover.py's. Memory streams live and die with the
process. The flusher (engine/flusher.py) moves each stream's log into its Delta table every
`flush_interval`, or sooner once `flush_bytes` are waiting. A stream whose recovery fails is kept
apart (every request on it is a 503, `/healthz` lists it) and the others serve. Making and recovering
a stream is engine/stream_factory.py's; keeping the catalog's compact copy in step (its change marks,
rewrites, the counters an account info sums) is engine/catalog_upkeep.py's. Counterpart:
server/jetstream.go and the stream parts of server/jetstream_api.go.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.account_usage import AccountUsage
from engine.accounts.limits import AccountLimits
from engine.backpressure import Backpressure
from engine.catalog_store import CatalogStore
from engine.catalog_upkeep import CatalogUpkeep
from engine.clock import Clock, SystemClock
from engine.consumer import Delivery
from engine.consumers import Consumers
from engine.errors import JetStreamError
from engine.flusher import Flusher, FlushResult, FlushStats
from engine.health import health_report, write_refusal
from engine.keys import Keyring
from engine.kv import KeyValueStores
from engine.lifecycle import Lifecycle
from engine.messages import InboundMessage, PlainBatch, PublishAnswer, PublishResult
from engine.objects import ObjectStores
from engine.options import EngineOptions
from engine.publish_router import PublishRouter
from engine.store.backlog import Backlog
from engine.store.base import StoredMessage
from engine.store.layout import Layout
from engine.store.lease import OwnerLock
from engine.store.leases import Lease
from engine.store.objectstore import WarehouseLocation
from engine.stream import Stream
from engine.stream_admin import StreamAdmin
from engine.stream_factory import StreamFactory
from engine.stream_handover import StreamHandover
from engine.stream_registry import StreamRegistry

API_LEVEL = 1


class JetStream:
    """Every stream of one account in one warehouse (see the module docstring)."""

    def __init__(
        self, warehouse: str | Path | WarehouseLocation, options: EngineOptions | None = None,
        clock: Clock | None = None,
        backlog: Backlog | None = None,
    ) -> None:
        self.options = options or EngineOptions()
        self.clock = clock or SystemClock()
        self.layout = Layout(warehouse, self.options.account, self.options.wal_dir)
        self._owner = OwnerLock(self.layout)
        self.catalog = CatalogStore(self.layout)  # the catalog's compact copy (engine/catalog_store.py)
        # The gateway's accounts share one backlog (engine/accounts/registry.py): its bound is the gateway's.
        self.backlog = backlog or Backlog(self.options.max_unflushed_bytes, self.options.max_unflushed_total)
        # `--wal object`: the logs are objects in the warehouse, fenced by the owner lease's token
        log_lease = self._owner.lease if self.options.wal == "object" else None
        self.consumers = Consumers(self.layout, self.clock, self.options.sync_always, self.backlog, log_lease)
        self.factory = StreamFactory(self.layout, self.clock, self.backlog, log_lease,
                                     sync_always=self.options.sync_always, cache_bytes=self.options.cache_bytes,
                                     max_payload=self.options.max_payload)
        self.consumers.scoped = self.options.cluster
        self.registry = StreamRegistry(self.factory, self.consumers, lambda: self.deposed)
        self.catalog_upkeep = CatalogUpkeep(self.catalog, self.consumers, self.registry.items, not self.options.cluster)
        self.consumers.changing = self.catalog_upkeep.changing
        self.flusher = Flusher(self.registry.streams, self.consumers, self.factory.reload, self.options.flush_interval)
        self.backpressure = Backpressure(self.options.max_pending_bytes)
        self.notify: Callable[[str], None] | None = None
        self.kv = KeyValueStores(self)
        self.objects = ObjectStores(self)
        self.account = AccountUsage(self.options.limits, self.registry, self.factory, self.consumers,
                                    self.catalog_upkeep)
        self.admin = StreamAdmin(self.layout, self.clock, self.registry, self.factory, self.consumers, self.flusher,
                                 self.catalog_upkeep, self.account, self._notify, self.options.cluster)
        self.router = PublishRouter(self.options, self.registry, self.backpressure, self.flusher, self._notify)
        self.handover = StreamHandover(self.layout, self.registry, self.factory, self.consumers, self.flusher,
                                       self._notify)
        self.lifecycle = Lifecycle(self.options, self.clock, self.layout, self._owner, registry=self.registry,
                                   factory=self.factory, consumers=self.consumers, catalog_upkeep=self.catalog_upkeep,
                                   flusher=self.flusher, objects=self.objects, account=self.account,
                                   notify=self._notify)

    @property
    def keyring(self) -> Keyring | None:
        """The account's keyring (encryption at rest, engine/keys/), once the engine is open; None without a key."""
        return self.factory.keyring

    @property
    def limits(self) -> AccountLimits:
        """The account's JetStream limits (engine/accounts/limits.py); a config reload may replace them."""
        return self.account.limits

    @limits.setter
    def limits(self, value: AccountLimits) -> None:
        self.account.limits = value

    def exceeds(self, storage: str, size: int) -> bool:
        """Whether `size` more bytes of `storage` go over the account's limit (a stream's publish asks)."""
        return self.account.exceeds(storage, size)

    def account_info(self) -> dict[str, Any]:
        """JetStream's AccountInfo, without `api` (engine/account_usage.py)."""
        return self.account.info()

    def _notify(self, stream_name: str) -> None:
        if self.notify is not None:
            self.notify(stream_name)

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def opened(self) -> bool:
        return self.lifecycle.opened

    @property
    def deposed(self) -> str | None:
        """Why this gateway lost the warehouse's owner lease; None while it holds it."""
        return self.lifecycle.deposed

    def open(self, start_flusher: bool = True) -> None:
        self.lifecycle.open(start_flusher)

    def close(self, flush: bool = True) -> None:
        """Flushes every stream and releases the warehouse; `flush=False` for an account about to be
        deleted (engine/accounts/deletion.py), whose logs are not worth committing."""
        self.lifecycle.close(flush)

    # -- several gateways: streams owned one by one (engine/cluster/) ---------------------------

    @property
    def claim_stream(self) -> Callable[[str], Lease] | None:
        """Takes a stream's lease to make it (engine/cluster/service.py sets it)."""
        return self.admin.claim_stream

    @claim_stream.setter
    def claim_stream(self, claim: Callable[[str], Lease] | None) -> None:
        self.admin.claim_stream = claim

    @property
    def release_stream(self) -> Callable[[str], None] | None:
        """Releases a stream's lease once it is deleted (engine/cluster/service.py sets it)."""
        return self.admin.release_stream

    @release_stream.setter
    def release_stream(self, release: Callable[[str], None] | None) -> None:
        self.admin.release_stream = release

    def take(self, name: str, lease: Lease) -> None:
        self.handover.take(name, lease)

    def hand_over(self, name: str) -> None:
        self.handover.hand_over(name)

    def lost(self, name: str, reason: str) -> None:
        self.handover.lost(name, reason)

    # -- streams ------------------------------------------------------------------------------

    def add_stream(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates a stream; returns its info and whether it was created (False: identical exists)."""
        return self.admin.add(body)

    def update_stream(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.admin.update(name, body)

    def delete_stream(self, name: str) -> None:
        self.admin.delete(name)

    def stream_info(self, name: str, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        return self.admin.info(name, subjects_filter, offset)

    def list_streams(self, subject: str | None = None, offset: int = 0, limit: int = 256) -> dict[str, Any]:
        return self.admin.list(subject, offset, limit)

    def stream_names(self, subject: str | None = None, offset: int = 0, limit: int = 1024) -> dict[str, Any]:
        return self.admin.names(subject, offset, limit)

    def stream(self, name: str) -> Stream:
        return self.registry.stream(name)

    def streams(self) -> list[Stream]:
        """The streams opened so far (each serves; the catalog's others have nothing in memory to report)."""
        return self.registry.streams()

    def stream_for_subject(self, subject: str) -> Stream | None:
        entry = self.registry.entry_for_subject(subject)
        return entry.stream if entry else None

    def stream_name_for_subject(self, subject: str) -> str | None:
        """The name of the stream capturing a literal subject, from the catalog (nothing is opened)."""
        entry = self.registry.entry_for_subject(subject, open_=False)
        return entry.name if entry else None

    # -- a stream's messages ------------------------------------------------------------------

    def get_message(self, name: str, seq: int) -> StoredMessage:
        return self.admin.get_message(name, seq)

    def delete_message(self, name: str, seq: int, erase: bool = True) -> None:
        self.admin.delete_message(name, seq, erase)

    def rotate_key(self, name: str) -> int:
        return self.admin.rotate_key(name)

    def purge(self, name: str, filter_: str | None = None, seq: int = 0, keep: int = 0) -> int:
        return self.admin.purge(name, filter_, seq, keep)

    # -- publish ------------------------------------------------------------------------------

    def publish(self, messages: list[InboundMessage]) -> list[PublishResult]:
        """Publishes in order; each result is a PubAck or the error for that message."""
        return self.router.publish(messages)

    def publish_nowait(self, messages: list[InboundMessage]) -> list[PublishResult] | None:
        """`publish` if it needs no waiting (see PublishRouter.publish_nowait); None means "use `publish`"."""
        return self.router.publish_nowait(messages)

    def publish_batch(self, batch: PlainBatch) -> PublishAnswer:
        return self.router.publish_batch(batch)

    def publish_batch_nowait(self, batch: PlainBatch) -> PublishAnswer | None:
        """`publish_batch` if it needs no waiting; None means "use `publish_batch`"."""
        return self.router.publish_batch_nowait(batch)

    def throttle(self, stream: Stream, timeout: float = 120.0) -> None:
        self.router.throttle(stream, timeout)

    def publish_one(self, subject: str, data: bytes, headers: dict[str, list[str]] | None = None) -> PublishResult:
        return self.publish([InboundMessage(subject, data, headers)])[0]

    # -- consumers ----------------------------------------------------------------------------

    def add_consumer(self, stream: str, body: dict[str, Any], name: str | None = None) -> tuple[dict[str, Any], bool]:
        return self.consumers.add(self.registry.stream(stream), body, name)

    def update_consumer(self, stream: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.consumers.update(self.registry.stream(stream), name, body)

    def delete_consumer(self, stream: str, name: str) -> None:
        self.consumers.delete(self.registry.stream(stream), name)

    def consumer_info(self, stream: str, name: str) -> dict[str, Any]:
        return self.consumers.info(self.registry.stream(stream), name)

    def list_consumers(self, stream: str, offset: int = 0, limit: int = 256) -> dict[str, Any]:
        return self.consumers.list(self.registry.stream(stream), offset, limit)

    def fetch(self, stream: str, consumer: str, batch: int, max_bytes: int = 0) -> list[Delivery]:
        return self.consumers.fetch(self.registry.stream(stream), consumer, batch, max_bytes)

    def fetch_nowait(self, stream: str, consumer: str, batch: int, max_bytes: int = 0) -> list[Delivery] | None:
        """`fetch` if it needs no waiting (see Consumers.fetch_nowait); None means "use `fetch`"."""
        target = self.registry.stream_if_open(stream)
        return None if target is None else self.consumers.fetch_nowait(target, consumer, batch, max_bytes)

    def ack(self, stream: str, consumer: str, acks: list[tuple[str | int, str, int]]) -> list[JetStreamError | None]:
        return self.consumers.ack(self.registry.stream(stream), consumer, acks)

    def ack_nowait(self, stream: str, consumer: str, acks: list[tuple[str | int, str, int]]) -> list[JetStreamError | None] | None:
        """`ack` if it needs no waiting; None means "use `ack`"."""
        target = self.registry.stream_if_open(stream)
        return None if target is None else self.consumers.ack_nowait(target, consumer, acks)

    def ack_run(
        self, stream: str, consumer: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[JetStreamError | None]:
        """`ack` of stream sequences sharing one kind and delay, in order: one result per sequence."""
        return self.consumers.ack_run(self.registry.stream(stream), consumer, seqs, kind, delay)

    def ack_run_nowait(
        self, stream: str, consumer: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[JetStreamError | None] | None:
        """`ack_run` if it needs no waiting; None means "use `ack_run`"."""
        return self.consumers.ack_run_nowait(self.registry.stream(stream), consumer, seqs, kind, delay)

    # -- the flusher and health ---------------------------------------------------------------

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

    @property
    def healthy(self) -> bool:
        """The gateway takes writes: open, within its backlog bound, its ack log writable."""
        return self.opened and self.write_refusal() is None

    def write_refusal(self) -> str | None:
        """Why the gateway as a whole takes no writes now; None when it does (a single stream may still refuse)."""
        return write_refusal(self.opened, self.backlog, self.consumers)

    def health(self) -> dict[str, Any]:
        """What `/healthz` reports: whether writes are taken, failing flushes, lag, failed streams, damaged logs."""
        return health_report(self.streams(), self.flusher, self.consumers, self.backlog, self.write_refusal())
