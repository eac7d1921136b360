"""The consumers of an account: their lifecycle, their timers and snapshots, and the door to the rest.

Consumer configs live in records (engine/consumer_records.py); their state is the ack table's events
(engine/store/acks.py, engine/ack_stores.py), replayed on start (engine/consumer_recovery.py). Pulls
and acks: engine/consumer_requests.py; what an ack removes from a work-queue or interest stream:
engine/consumer_retention.py. The engine and the front doors ask all of it here.
Counterpart: server/consumer.go.
"""

from __future__ import annotations

import logging
import secrets
import string
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from engine import errors
from engine.accounts import limits as account_limits
from engine.ack_events import AckEvents
from engine.ack_stores import AckStores, log_items, snapshot_row
from engine.clock import Clock
from engine.consumer import Consumer, Delivery
from engine.consumer_config import (
    ConsumerConfig,
    ConsumerErrorCode,
    check_consumer_config,
    check_consumer_update,
    parse_consumer_config,
    valid_group_name,
)
from engine.consumer_records import write_record
from engine.consumer_recovery import ConsumerRecovery
from engine.consumer_requests import ConsumerRequests
from engine.consumer_retention import sweep
from engine.store.acks import AckStore, EventRow, LogItem
from engine.store.backlog import Backlog
from engine.store.layout import Layout
from engine.store.leases import Lease

if TYPE_CHECKING:
    from engine.stream import Stream

log = logging.getLogger(__name__)

SNAPSHOT_EVERY = 10_000
_NAME_ALPHABET = string.ascii_uppercase + string.digits


class Consumers:
    """Every consumer of every stream of one account."""

    def __init__(self, layout: Layout, clock: Clock, sync_always: bool, backlog: Backlog | None = None,
                 log_lease: Lease | None = None) -> None:
        self.layout = layout
        self.clock = clock
        self.stores = AckStores(layout, sync_always, backlog, log_lease)
        self.recovery = ConsumerRecovery(layout, self.stores)
        self.requests = ConsumerRequests(self, clock, self.stores)
        # The catalog's mark for a change of a stream's consumer files (engine/catalog_upkeep.py `changing`);
        # nothing with several gateways, where the account keeps no catalog copy.
        self.changing: Callable[[str], AbstractContextManager[None]] = lambda _stream: nullcontext()
        self.notify: Callable[[str], None] | None = None
        self.limits = account_limits.UNLIMITED_LIMITS  # the account's JetStream limits, set by the engine
        # Called (stream, consumer, stream seq, deliveries) when a message reaches max_deliver, under the
        # stream's lock and from any thread: a front door turns it into JetStream's advisory.
        self.on_max_deliveries: Callable[[str, str, int, int], None] | None = None
        # Called (stream, consumer, group) after an unpin, from the caller's thread: the NATS door drops
        # its pin timers and announces the loss (reason `admin`), whichever door asked.
        self.on_unpin: Callable[[str, str, str], None] | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def add(self, stream: Stream, body: dict[str, Any], consumer_name: str | None = None) -> tuple[dict[str, Any], bool]:
        config = parse_consumer_config(body)
        name = config.durable_name or config.name
        if consumer_name is not None and name and name != consumer_name:
            raise ConsumerErrorCode.DURABLE_NAME_NOT_MATCH_SUBJECT.error()
        ephemeral = not config.durable_name
        with stream.lock:
            others = [c.config for n, c in stream.consumers.items() if n != name]
            given_max_ack_pending = config.max_ack_pending
            config = check_consumer_config(config, stream.config, ephemeral=ephemeral, existing_consumers=others)
            config.max_ack_pending = self._max_ack_pending(stream, given_max_ack_pending, config.max_ack_pending)
            name = config.durable_name or config.name or "".join(secrets.choice(_NAME_ALPHABET) for _ in range(8))
            existing = stream.consumers.get(name)
            if existing is not None:
                if existing.config.to_json() == _named(config, name).to_json():
                    return existing.info(self.clock.now_ns()), False
                raise errors.JetStreamError(400, 10148, "consumer already exists")
            account_limits.check_consumer_count(self.limits, stream.config.max_consumers, len(stream.consumers))
            now = self.clock.now_ns()
            consumer = Consumer(stream, _named(config, name), name, uuid.uuid4().hex, now, ephemeral)
            consumer.start()
            if stream.config.storage == "file":
                with self.changing(stream.name):
                    write_record(self.layout, consumer)
            stream.consumers[name] = consumer
            return consumer.info(now), True

    def update(self, stream: Stream, name: str, body: dict[str, Any]) -> dict[str, Any]:
        config = parse_consumer_config(body)
        if any(given and given != name for given in (config.durable_name, config.name)):
            raise ConsumerErrorCode.DURABLE_NAME_NOT_MATCH_SUBJECT.error()
        with stream.lock:
            consumer = self.get(stream, name)
            others = [c.config for n, c in stream.consumers.items() if n != name]
            given_max_ack_pending = config.max_ack_pending
            config = _named(
                check_consumer_config(config, stream.config, ephemeral=consumer.ephemeral, existing_consumers=others), name
            )
            config.max_ack_pending = self._max_ack_pending(stream, given_max_ack_pending, config.max_ack_pending)
            check_consumer_update(consumer.config, config)
            consumer.reconfigure(config)
            if stream.config.storage == "file":
                with self.changing(stream.name):
                    write_record(self.layout, consumer)
            return consumer.info(self.clock.now_ns())

    def _max_ack_pending(self, stream: Stream, given: int, resolved: int) -> int:
        """The account's cap on `max_ack_pending` (engine/accounts/limits.py)."""
        limit = stream.config.consumer_limits.max_ack_pending
        return account_limits.max_ack_pending(self.limits, given, limit, resolved)

    def delete(self, stream: Stream, name: str) -> None:
        with stream.lock:
            consumer = self.get(stream, name)
            self._remove(stream, consumer)

    def _remove(self, stream: Stream, consumer: Consumer) -> None:
        consumer.deleted = True
        del stream.consumers[consumer.name]
        if stream.config.storage == "file":
            with self.changing(stream.name):
                self.layout.objects.delete(self.layout.consumer_config_key(stream.name, consumer.name))
        self.stores.of(stream).forget(consumer.consumer_id)
        sweep(stream)
        self._notify(stream)

    def _notify(self, stream: Stream) -> None:
        if self.notify is not None:
            self.notify(stream.name)

    def drop_stream(self, stream: Stream) -> None:
        for consumer in list(stream.consumers.values()):
            consumer.deleted = True
            self.stores.of(stream).forget(consumer.consumer_id)
        stream.consumers.clear()
        self.layout.objects.delete_prefix(self.layout.consumer_configs_key(stream.name))

    def get(self, stream: Stream, name: str) -> Consumer:
        consumer = stream.consumers.get(name)
        if consumer is None:
            raise errors.JetStreamError(404, 10014, "consumer not found")
        return consumer

    def info(self, stream: Stream, name: str) -> dict[str, Any]:
        with stream.lock:
            return self.get(stream, name).info(self.clock.now_ns())

    def unpin(self, find_stream: Callable[[str], Stream], stream_name: str, name: str, group: str) -> None:
        """`$JS.API.CONSUMER.UNPIN`, for both doors: drops the consumer's pin (its next request served gets
        a new one), then tells `on_unpin`. `find_stream` is the engine's lookup (JetStream.stream).

        Raises:
            JetStreamError: in jsConsumerUnpinRequest's order: err_code 10025 (no group), 10162 (a name
                nats-server refuses), before any lookup; 10059, 10014 (no stream, no consumer); 10160
                (a group the consumer does not have).
        """
        if not group:
            raise errors.invalid_json("consumer group not specified")
        if not valid_group_name(group):
            raise ConsumerErrorCode.INVALID_GROUP_NAME.error()
        stream = find_stream(stream_name)
        with stream.lock:
            consumer = self.get(stream, name)
            if group not in (consumer.config.priority_groups or ()):
                raise ConsumerErrorCode.INVALID_PRIORITY_GROUP.error()
            consumer.pin = None
        if self.on_unpin is not None:
            self.on_unpin(stream.name, name, group)

    def list(self, stream: Stream, offset: int, limit: int) -> dict[str, Any]:
        if offset < 0 or limit <= 0:
            raise errors.bad_request("offset must be ≥ 0 and limit > 0")
        with stream.lock:
            consumers = [stream.consumers[n] for n in sorted(stream.consumers)]
            now = self.clock.now_ns()
            page = [c.info(now) for c in consumers[offset : offset + limit]]
        return {"total": len(consumers), "offset": offset, "limit": limit, "consumers": page}

    # -- restoring (engine/consumer_recovery.py) ----------------------------------------------

    def open(self, streams: dict[str, Stream]) -> None:
        for stream in streams.values():
            self.recovery.restore_stream(stream)

    def prepare(self, consumers: dict[str, dict[str, bool]]) -> None:
        """Reads every consumer's history once, at start (`ConsumerRecovery.prepare`)."""
        self.recovery.prepare(consumers)

    def restore_stream(self, stream: Stream) -> None:
        """Reopens the consumers of a stream opened after the start (or at it)."""
        self.recovery.restore_stream(stream)

    def act_alone(self, stream: str) -> bool:
        """Whether a stream has a consumer that acts unasked, so the stream is opened at start."""
        return self.recovery.act_alone(stream)

    def unrestored(self, stream: str) -> dict[str, bool]:
        """The consumer names (and whether each acts unasked) of a stream not opened yet."""
        return self.recovery.unrestored(stream)

    def unrestored_count(self, stream: str) -> int:
        return self.recovery.unrestored_count(stream)

    def open_stream(self, stream: Stream, lease: Lease) -> None:
        """A stream this gateway now owns (scoped mode): its ack store, fenced by `lease`, and its consumers."""
        self.recovery.open_stream(stream, lease)

    def close_stream(self, stream: Stream, flush: bool = True) -> None:
        """A stream handed over (scoped mode): its consumers gone from here, its events committed (`flush`)."""
        stream.consumers.clear()
        self.stores.close(stream.name, flush)

    # -- ack stores (engine/ack_stores.py) ----------------------------------------------------

    @property
    def acks(self) -> AckStore:
        """The account's ack store (the only one unless scoped)."""
        return self.stores.acks

    @property
    def scoped(self) -> bool:
        """Several gateways on one warehouse: each owned stream's events go to an ack store of its own."""
        return self.stores.scoped

    @scoped.setter
    def scoped(self, value: bool) -> None:
        self.stores.scoped = value

    def ack_stores(self) -> list[AckStore]:
        return self.stores.all()

    # -- pulls and acks -----------------------------------------------------------------------

    def fetch(self, stream: Stream, name: str, batch: int, max_bytes: int = 0) -> list[Delivery]:
        """What a pull gets now (maybe nothing); the deliveries are logged before they are returned."""
        return self.requests.fetch(stream, name, batch, max_bytes)

    def fetch_nowait(self, stream: Stream, name: str, batch: int, max_bytes: int = 0) -> list[Delivery] | None:
        """`fetch` when it needs no waiting; None means "call `fetch`" (`ConsumerRequests.fetch_nowait`)."""
        return self.requests.fetch_nowait(stream, name, batch, max_bytes)

    def ack(self, stream: Stream, name: str, acks: list[tuple[str | int, str, int]]) -> list[errors.JetStreamError | None]:
        """Applies acks given by token or stream sequence; one result per ack, logged before returning."""
        return self.requests.ack(stream, name, acks)

    def ack_nowait(
        self, stream: Stream, name: str, acks: list[tuple[str | int, str, int]]
    ) -> list[errors.JetStreamError | None] | None:
        """`ack` when it needs no waiting; None means "call `ack`"."""
        return self.requests.ack_nowait(stream, name, acks)

    def ack_run(
        self, stream: Stream, name: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[errors.JetStreamError | None]:
        """`ack` of stream sequences that share one kind and delay (`ConsumerRequests.ack_run`)."""
        return self.requests.ack_run(stream, name, seqs, kind, delay)

    def ack_run_nowait(
        self, stream: Stream, name: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[errors.JetStreamError | None] | None:
        """`ack_run` when it needs no waiting; None means "call `ack_run`"."""
        return self.requests.ack_run_nowait(stream, name, seqs, kind, delay)

    # -- housekeeping -------------------------------------------------------------------------

    def tick(self, streams: list[Stream]) -> None:
        """Removes inactive consumers and writes snapshots of busy ones."""
        now = self.clock.now_ns()
        for stream in streams:
            rows: list[LogItem] = []
            ticket = None
            with stream.lock:
                for consumer in list(stream.consumers.values()):
                    threshold = consumer.config.inactive_threshold
                    if threshold and consumer.waiting == 0 and now - consumer.last_activity > threshold:
                        log.info("removing consumer %s > %s after %.1fs inactive", stream.name, consumer.name, threshold / 1e9)
                        self._remove(stream, consumer)
                        continue
                    rows += log_items(consumer, AckEvents.of(consumer.ledger.tick(now)))
                    self.requests.report_exhausted(consumer)
                    if consumer.ledger.events_since_snapshot >= SNAPSHOT_EVERY and stream.config.storage == "file":
                        rows.append(self.snapshot_row(consumer, now))
                ticket = self.stores.of(stream).enqueue(rows)
            self.stores.of(stream).wait(ticket)

    def snapshot_row(self, consumer: Consumer, now: int) -> EventRow:
        """A consumer's snapshot row (engine/ack_stores.py), taken by `tick`."""
        return snapshot_row(consumer, now)

    def flush(self, fold: bool = True, lease_timeout: float = 0) -> int:
        """Commits every ack store's logged events; returns the commits made."""
        return self.stores.flush(fold, lease_timeout)


def _named(config: ConsumerConfig, name: str) -> ConsumerConfig:
    if config.durable_name:
        return config
    named = config.model_copy()
    named.name = name
    return named

