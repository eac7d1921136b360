"""Pulls and acks: a consumer's state changed under its stream's lock, its events logged, the caller answered.

A pull or an ack changes state under the stream's lock and takes its events' place in the ack log under
that lock too, so the log holds them in the order they changed the state (a snapshot never folds an
event it does not hold); the caller is answered once they are written. The `_nowait` forms serve an
event loop without a thread hand-off when nothing would wait. Counterpart: server/consumer.go.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from engine import errors
from engine.ack_events import NAK, AckEvents
from engine.ack_stores import AckStores, log_items
from engine.clock import Clock
from engine.consumer import Consumer, Delivery
from engine.consumer_retention import retain
from engine.store.acks import Ticket

if TYPE_CHECKING:
    from engine.stream import Stream


class Registry(Protocol):
    """What pulls and acks ask of the account's consumers (engine/consumers.py's `Consumers` is it):
    the consumer by name, and whom to tell (set by the engine and the front doors, read at each call)."""

    notify: Callable[[str], None] | None
    on_max_deliveries: Callable[[str, str, int, int], None] | None

    def get(self, stream: Stream, name: str) -> Consumer: ...


class ConsumerRequests:
    """The pulls and acks of the account's consumers."""

    def __init__(self, owner: Registry, clock: Clock, stores: AckStores) -> None:
        self._owner = owner
        self.clock = clock
        self.stores = stores

    def fetch(self, stream: Stream, name: str, batch: int, max_bytes: int = 0) -> list[Delivery]:
        """What a pull gets now (maybe nothing); the deliveries are logged before they are returned."""
        with stream.lock:
            deliveries, ticket = self._fetch_locked(stream, name, batch, max_bytes)
        self.stores.of(stream).wait(ticket)
        return deliveries

    def fetch_nowait(self, stream: Stream, name: str, batch: int, max_bytes: int = 0) -> list[Delivery] | None:
        """`fetch` when it needs no waiting: the stream's lock free, no ack-log write under way and no
        fsync to wait for (`--sync always`). Lets an event loop serve a pull without a thread
        hand-off; None means "call `fetch`". The deliveries are logged before they are returned."""
        if not self.stores.can_log_now(stream) or not stream.lock.acquire(blocking=False):
            return None
        try:
            deliveries, ticket = self._fetch_locked(stream, name, batch, max_bytes)
        finally:
            stream.lock.release()
        self.stores.of(stream).wait(ticket)
        return deliveries

    def _fetch_locked(
        self, stream: Stream, name: str, batch: int, max_bytes: int
    ) -> tuple[list[Delivery], Ticket | None]:
        consumer = self._owner.get(stream, name)
        stream.expire_now()
        deliveries, events = consumer.fetch(batch, max_bytes, self.clock.now_ns())
        self.report_exhausted(consumer)
        ticket = self.stores.of(stream).enqueue(log_items(consumer, events))
        retain(stream, consumer)
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
        if not self.stores.can_log_now(stream) or not stream.lock.acquire(blocking=False):
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
        if not self.stores.can_log_now(stream) or not stream.lock.acquire(blocking=False):
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
        consumer = self._owner.get(stream, name)
        results, events = consumer.ack_many(seqs, kind, delay, self.clock.now_ns())
        ticket = self.stores.of(stream).enqueue(log_items(consumer, events))
        retain(stream, consumer)
        return results, ticket

    def _ack_locked(
        self, stream: Stream, name: str, acks: list[tuple[str | int, str, int]]
    ) -> tuple[list[errors.JetStreamError | None], Ticket | None, bool]:
        """Runs of acks of one kind and delay go to the consumer together (`Consumer.ack_many`).
        Also says whether a nak was among them (waiting pulls are woken for the redelivery)."""
        consumer = self._owner.get(stream, name)
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
        ticket = self.stores.of(stream).enqueue(log_items(consumer, AckEvents.concat(blocks)))
        retain(stream, consumer)
        return results, ticket, naked

    def _acked(self, stream: Stream, ticket: Ticket | None, naked: bool) -> None:
        self.stores.of(stream).wait(ticket)
        if naked and self._owner.notify is not None:
            self._owner.notify(stream.name)

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

    def report_exhausted(self, consumer: Consumer) -> None:
        """Tells `on_max_deliveries` of the messages the consumer's last events took out of deliveries."""
        ledger = consumer.ledger
        exhausted, ledger.exhausted_now = ledger.exhausted_now, []
        if exhausted and self._owner.on_max_deliveries is not None:
            for seq, deliveries in exhausted:
                self._owner.on_max_deliveries(consumer.stream.name, consumer.name, seq, deliveries)
