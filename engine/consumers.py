"""The consumers of an account: lifecycle, durable state, pulls, acks, interest and work-queue retention.

Consumer configs live in `_system/consumers/<stream>/<name>.json` (the config sealed on a stream whose
subjects are protected: its filters name subjects); their state is the ack table's
events (engine/store/acks.py), replayed on start. A pull or an ack changes state under the stream's
lock and takes its events' place in the ack log under that lock too, so the log holds them in the
order they changed the state (a snapshot never folds an event it does not hold); the caller is
answered once they are written. On work-queue streams an acknowledged message leaves the stream at
once; on interest streams a message leaves once no consumer that matches it still needs it, and is
not kept at all when none matches. Those removals are tombstones, like purges.
Counterpart: server/consumer.go and the retention parts of stream.go.
"""

from __future__ import annotations

import logging
import secrets
import string
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from engine import errors
from engine.accounts import limits as account_limits
from engine.clock import Clock
from engine.ack_events import NAK, AckEvent, AckEvents
from engine.consumer import Consumer, Delivery
from engine.consumer_config import (
    ConsumerConfig,
    ConsumerErrorCode,
    check_consumer_config,
    check_consumer_update,
    parse_consumer_config,
    valid_group_name,
)
from engine.store.acks import SNAPSHOT, AckStore, ConsumerHistory, EventBlock, EventRow, LogItem, Ticket
from engine.store.backlog import Backlog
from engine.store.layout import Layout
from engine.store.objectstore import ObjectNotFoundError
from engine.store.leases import Lease

if TYPE_CHECKING:
    from engine.store.sealed import Sealer
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
        self.acks = AckStore(layout, sync_always, backlog, log_lease)
        # Several gateways on one warehouse: each owned stream's events go to an ack store of its own,
        # fenced by the stream's lease, so a stream moves to another gateway with its consumers.
        self.scoped = False
        self._scoped: dict[str, AckStore] = {}
        self._sync_always = sync_always
        self._backlog = backlog
        # Read once at start (`prepare`) for every stream; a stream opened later (engine/catalog.py)
        # restores its consumers from what is left here, and takes it out.
        self._histories: dict[str, ConsumerHistory] | None = None
        # stream -> its consumers' names, each with whether it acts unasked (from the catalog copy)
        self._unrestored: dict[str, dict[str, bool]] = {}
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

    def open(self, streams: dict[str, Stream]) -> None:
        for stream in streams.values():
            self.restore_stream(stream)

    def prepare(self, consumers: dict[str, dict[str, bool]]) -> None:
        """Reads every consumer's history (the ack table and log, once) and keeps every stream's consumer
        names (`consumers`, from the catalog): the streams opened at start and those opened later
        restore from them."""
        if self.scoped or self._histories is not None:
            return  # scoped: each stream's ack store opens with the stream (`open_stream`)
        self.acks.create()
        self._histories = self.acks.recover()
        self._unrestored = {stream: names for stream, names in consumers.items() if names}

    def restore_stream(self, stream: Stream) -> None:
        """Reopens the consumers of a stream opened after the start (or at it)."""
        if self.scoped or self._histories is None:
            return
        names = self._unrestored.pop(stream.name, {})
        self._restore(stream, [self._config_key(stream.name, n) for n in sorted(names)], self._histories)

    def act_alone(self, stream: str) -> bool:
        """Whether a stream has a consumer that acts unasked, so the stream is opened at start: a push
        consumer delivers, an ephemeral one or one with an inactivity threshold goes away on its own."""
        return any(self._unrestored.get(stream, {}).values())

    def unrestored(self, stream: str) -> dict[str, bool]:
        """The consumer names (and whether each acts unasked) of a stream not opened yet."""
        return dict(self._unrestored.get(stream, {}))

    def unrestored_count(self, stream: str) -> int:
        return len(self._unrestored.get(stream, ()))

    def open_stream(self, stream: Stream, lease: Lease) -> None:
        """A stream this gateway now owns (scoped mode): its ack store, fenced by `lease`, and its consumers."""
        acks = AckStore(self.layout, self._sync_always, self._backlog, lease, scope=stream.name)
        acks.create()
        histories = acks.recover()
        folder = self.layout.consumer_configs_key(stream.name)
        self._scoped[stream.name] = acks
        self._restore(stream, self._config_keys(folder).get(folder, []), histories)

    def close_stream(self, stream: Stream, flush: bool = True) -> None:
        """A stream handed over (scoped mode): its events committed (`flush`), its store closed."""
        acks = self._scoped.pop(stream.name, None)
        stream.consumers.clear()
        if acks is None:
            return
        try:
            if flush:
                acks.flush(fold=False)
        except Exception as exc:  # noqa: BLE001 - the stream's ack log keeps what was not committed
            log.warning("the acks of stream %s were not committed at its hand-over (kept in its log): %s",
                        stream.name, exc)
        acks.wal.close()

    def acks_of(self, stream: Stream) -> AckStore:
        """The ack store of a stream's events: the account's, or the stream's own in scoped mode."""
        return self._scoped[stream.name] if self.scoped else self.acks

    def ack_stores(self) -> list[AckStore]:
        return list(self._scoped.values()) if self.scoped else [self.acks]

    def _restore(self, stream: Stream, keys: list[str], histories: dict[str, ConsumerHistory]) -> None:
        """Reopens a stream's consumers from their configs and their histories (snapshot, later events)."""
        for key in keys:
            try:
                record = orjson.loads(self.layout.objects.get(key).data)
            except ObjectNotFoundError:  # the catalog named it; its file is the truth (removed since)
                log.warning("consumer config %s is gone: not restored", key)
                continue
            config = parse_consumer_config(_config_json(stream, record))
            consumer = Consumer(stream, config, record["name"], record["consumer_id"], record["created"], record["ephemeral"])
            history = histories.pop(consumer.consumer_id, None)
            consumer.ledger.restore(history.snapshot if history and history.snapshot else record["start"])
            for event in history.events if history else []:
                consumer.ledger.apply(event)
            consumer.ledger.acked.clear()
            consumer.drop_removed(np.array([s for s in consumer.state.pending if not stream.index.is_live(s)], np.int64))
            stream.consumers[consumer.name] = consumer
        with stream.lock:
            self._sweep(stream)

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
                self._write_config(consumer)
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
                self._write_config(consumer)
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
                self.layout.objects.delete(self._config_key(stream.name, consumer.name))
        self.acks_of(stream).forget(consumer.consumer_id)
        self._sweep(stream)
        self._notify(stream)

    def drop_stream(self, stream: Stream) -> None:
        for consumer in list(stream.consumers.values()):
            consumer.deleted = True
            self.acks_of(stream).forget(consumer.consumer_id)
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

    def _write_config(self, consumer: Consumer) -> None:
        record = {
            **_config_field(consumer.stream, consumer.name, consumer.config.to_json()),
            "name": consumer.name,
            "consumer_id": consumer.consumer_id,
            "created": consumer.created_ns,
            "ephemeral": consumer.ephemeral,
            "start": consumer.state.snapshot(),
        }
        with self.changing(consumer.stream.name):
            self.layout.objects.put(self._config_key(consumer.stream.name, consumer.name), orjson.dumps(record))

    def _config_keys(self, under: str | None = None) -> dict[str, list[str]]:
        """Every consumer config of the account (or `under` one stream's folder) by its stream's folder key,
        in name order: one listing of the store (a restart of many streams asks once, not once per stream)."""
        found: dict[str, list[str]] = {}
        for meta in self.layout.objects.list(under or self.layout.consumer_configs_root_key):
            folder, _, name = meta.key.rpartition("/")
            if name.endswith(".json"):
                found.setdefault(folder, []).append(meta.key)
        return found

    def _config_key(self, stream: str, consumer: str) -> str:
        return self.layout.consumer_config_key(stream, consumer)

    # -- pulls and acks -----------------------------------------------------------------------

    def fetch(self, stream: Stream, name: str, batch: int, max_bytes: int = 0) -> list[Delivery]:
        """What a pull gets now (maybe nothing); the deliveries are logged before they are returned."""
        with stream.lock:
            deliveries, ticket = self._fetch_locked(stream, name, batch, max_bytes)
        self.acks_of(stream).wait(ticket)
        return deliveries

    def fetch_nowait(self, stream: Stream, name: str, batch: int, max_bytes: int = 0) -> list[Delivery] | None:
        """`fetch` when it needs no waiting: the stream's lock free, no ack-log write under way and no
        fsync to wait for (`--sync always`). Lets an event loop serve a pull without a thread
        hand-off; None means "call `fetch`". The deliveries are logged before they are returned."""
        if not self._can_log_now(stream) or not stream.lock.acquire(blocking=False):
            return None
        try:
            deliveries, ticket = self._fetch_locked(stream, name, batch, max_bytes)
        finally:
            stream.lock.release()
        self.acks_of(stream).wait(ticket)
        return deliveries

    def _fetch_locked(
        self, stream: Stream, name: str, batch: int, max_bytes: int
    ) -> tuple[list[Delivery], Ticket | None]:
        consumer = self.get(stream, name)
        stream.expire_now()
        deliveries, events = consumer.fetch(batch, max_bytes, self.clock.now_ns())
        self._report_exhausted(consumer)
        ticket = self.acks_of(stream).enqueue(self._log_items(consumer, events))
        self._retain(stream, consumer)
        return deliveries, ticket

    def ack(self, stream: Stream, name: str, acks: list[tuple[str | int, str, int]]) -> list[errors.JetStreamError | None]:
        """Applies acks given by token or stream sequence; one result per ack, logged before returning."""
        with stream.lock:
            results, ticket, naked = self._ack_locked(stream, name, acks)
        self._acked(stream, ticket, naked)
        return results

    def ack_nowait(
        self, stream: Stream, name: str, acks: list[tuple[str | int, str, int]]
    ) -> list[errors.JetStreamError | None] | None:
        """`ack` when it needs no waiting (as `fetch_nowait`); None means "call `ack`"."""
        if not self._can_log_now(stream) or not stream.lock.acquire(blocking=False):
            return None
        try:
            results, ticket, naked = self._ack_locked(stream, name, acks)
        finally:
            stream.lock.release()
        self._acked(stream, ticket, naked)
        return results

    def ack_run(
        self, stream: Stream, name: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[errors.JetStreamError | None]:
        """`ack` of stream sequences that share one kind and delay — the acks of one read on the NATS
        door — as one consumer call and one log append, with no tuple per ack."""
        with stream.lock:
            results, ticket = self._ack_run_locked(stream, name, seqs, kind, delay)
        self._acked(stream, ticket, kind == NAK)
        return results

    def ack_run_nowait(
        self, stream: Stream, name: str, seqs: list[int], kind: str, delay: int = 0
    ) -> list[errors.JetStreamError | None] | None:
        """`ack_run` when it needs no waiting; None means "call `ack_run`"."""
        if not self._can_log_now(stream) or not stream.lock.acquire(blocking=False):
            return None
        try:
            results, ticket = self._ack_run_locked(stream, name, seqs, kind, delay)
        finally:
            stream.lock.release()
        self._acked(stream, ticket, kind == NAK)
        return results

    def _ack_run_locked(
        self, stream: Stream, name: str, seqs: list[int], kind: str, delay: int
    ) -> tuple[list[errors.JetStreamError | None], Ticket | None]:
        consumer = self.get(stream, name)
        results, events = consumer.ack_many(seqs, kind, delay, self.clock.now_ns())
        ticket = self.acks_of(stream).enqueue(self._log_items(consumer, events))
        self._retain(stream, consumer)
        return results, ticket

    def _can_log_now(self, stream: Stream) -> bool:
        acks = self.acks_of(stream)
        return not acks.sync_always and acks.idle

    def _ack_locked(
        self, stream: Stream, name: str, acks: list[tuple[str | int, str, int]]
    ) -> tuple[list[errors.JetStreamError | None], Ticket | None, bool]:
        """Runs of acks of one kind and delay go to the consumer together (`Consumer.ack_many`).
        Also says whether a nak was among them (waiting pulls are woken for the redelivery)."""
        consumer = self.get(stream, name)
        now = self.clock.now_ns()
        results: list[errors.JetStreamError | None] = [None] * len(acks)
        blocks: list[AckEvents] = []
        naked = False
        i = 0
        while i < len(acks):
            _, kind, delay = acks[i]
            naked = naked or kind == NAK
            seqs: list[int] = []
            where: list[int] = []
            while i < len(acks) and acks[i][1] == kind and acks[i][2] == delay:
                ref = acks[i][0]
                try:
                    seqs.append(ref if type(ref) is int else self._resolve(consumer, ref))
                    where.append(i)
                except errors.JetStreamError as exc:
                    results[i] = exc
                i += 1
            outcome, events = consumer.ack_many(seqs, kind, delay, now)
            for at, result in zip(where, outcome, strict=True):
                results[at] = result
            blocks.append(events)
        ticket = self.acks_of(stream).enqueue(self._log_items(consumer, AckEvents.concat(blocks)))
        self._retain(stream, consumer)
        return results, ticket, naked

    def _acked(self, stream: Stream, ticket: Ticket | None, naked: bool) -> None:
        self.acks_of(stream).wait(ticket)
        if naked:
            self._notify(stream)

    def _resolve(self, consumer: Consumer, ref: str | int) -> int:
        """The stream sequence an ack names: a sequence, or a token `<consumer id>.<seq>.<cseq>.<count>`."""
        if isinstance(ref, int):
            return ref
        consumer_id, _, rest = ref.partition(".")
        parts = rest.split(".")
        if len(parts) != 3 or not all(p.isdigit() and len(p) < 19 for p in parts):  # int64, as the ack log
            raise errors.bad_request("invalid ack token")
        if consumer_id != consumer.consumer_id:
            raise errors.bad_request("the ack token belongs to another consumer")
        return int(parts[0])

    def _log_items(self, consumer: Consumer, events: AckEvents) -> list[LogItem]:
        if consumer.stream.config.storage == "memory" or not len(events):
            return []
        return [EventBlock(consumer.stream.name, consumer.name, consumer.consumer_id, events)]

    # -- retention ----------------------------------------------------------------------------

    def _retain(self, stream: Stream, consumer: Consumer) -> None:
        """Work queue: acknowledged messages leave. Interest: once nobody matching needs them."""
        ledger = consumer.ledger
        acked, ledger.acked = ledger.acked, []
        if not acked or stream.config.retention == "limits":
            return
        seqs = np.array(sorted(set(acked)), np.int64)
        seqs = seqs[stream.index.live_mask(seqs)]
        if stream.config.retention == "interest":
            seqs = seqs[~self._needed(stream, seqs)]
        stream.remove_seqs(seqs, stream.config.retention)

    def _needed(self, stream: Stream, seqs: np.ndarray) -> np.ndarray:
        subjects = [stream.index.subject_of(int(s)) for s in seqs]
        needed = np.zeros(len(seqs), np.bool_)
        for consumer in stream.consumers.values():
            match = np.fromiter((consumer.matches(s) for s in subjects), np.bool_, len(subjects))
            needed |= consumer.state.needs(seqs, match)
        return needed

    def _sweep(self, stream: Stream) -> None:
        """Interest streams: drop every message no remaining consumer needs (after a delete or restart)."""
        if stream.config.retention == "workqueue":
            seqs = stream.index.live_seqs()
            acked = [int(s) for s in seqs if any(c.matches(stream.index.subject_of(int(s))) and c.state.acknowledged(int(s)) for c in stream.consumers.values())]
            stream.remove_seqs(np.array(acked, np.int64), "workqueue")
        elif stream.config.retention == "interest":
            seqs = stream.index.live_seqs()
            stream.remove_seqs(seqs[~self._needed(stream, seqs)], "interest")

    def interested(self, stream: Stream, subject: str) -> bool:
        return any(c.matches(subject) for c in stream.consumers.values())

    def _notify(self, stream: Stream) -> None:
        if self.notify is not None:
            self.notify(stream.name)

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
                    rows += self._log_items(consumer, AckEvents.of(consumer.ledger.tick(now)))
                    self._report_exhausted(consumer)
                    if consumer.ledger.events_since_snapshot >= SNAPSHOT_EVERY and stream.config.storage == "file":
                        rows.append(self.snapshot_row(consumer, now))
                ticket = self.acks_of(stream).enqueue(rows)
            self.acks_of(stream).wait(ticket)

    def _report_exhausted(self, consumer: Consumer) -> None:
        ledger = consumer.ledger
        exhausted, ledger.exhausted_now = ledger.exhausted_now, []
        if exhausted and self.on_max_deliveries is not None:
            for seq, deliveries in exhausted:
                self.on_max_deliveries(consumer.stream.name, consumer.name, seq, deliveries)

    def snapshot_row(self, consumer: Consumer, now: int) -> EventRow:
        consumer.ledger.events_since_snapshot = 0
        st = consumer.state
        return EventRow(
            consumer.stream.name, consumer.name, consumer.consumer_id, AckEvent(SNAPSHOT, 0, 0, 0, now),
            st.delivered_stream_seq, st.ack_floor_stream_seq, orjson.dumps(consumer.state.snapshot()).decode(),
        )

    def flush(self, fold: bool = True, lease_timeout: float = 0) -> int:
        """Commits every ack store's logged events; returns the commits made."""
        return sum(acks.flush(fold, lease_timeout) for acks in self.ack_stores())


def _named(config: ConsumerConfig, name: str) -> ConsumerConfig:
    if config.durable_name:
        return config
    named = config.model_copy()
    named.name = name
    return named


def _protecting_sealer(stream: Stream) -> Sealer | None:
    sealer: Sealer | None = getattr(stream.store, "sealer", None)
    return sealer if sealer is not None and sealer.protected else None


def _config_field(stream: Stream, name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A consumer's config for its record: sealed on a stream whose subjects are protected (its filter
    subjects would otherwise reach the warehouse in clear; engine/store/sealed.py)."""
    sealer = _protecting_sealer(stream)
    if sealer is None:
        return {"config": config}
    return {"config_sealed": sealer.seal_config(f"consumer:{name}", config)}


def _config_json(stream: Stream, record: dict[str, Any]) -> Any:
    if "config_sealed" not in record:
        return record["config"]
    sealer = _protecting_sealer(stream)
    if sealer is None:
        raise RuntimeError(f"consumer {record['name']} of stream {stream.name} has a sealed config and the "
                           "stream has no key")
    return sealer.open_config(f"consumer:{record['name']}", record["config_sealed"])
