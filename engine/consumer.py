"""A consumer: JetStream's delivery cursor, pending acknowledgements, redelivery and ack floor.

Every change of state is an `AckEvent` (a delivery, an ack, a nak, ...). Live operations build the
event, log it (the caller appends it to the ack log before answering) and apply it; recovery applies
the logged events again, so the state after a restart is the state before it. The machine is
synchronous and driven by the timestamps in its events; the stream's lock serialises it with the
stream it reads. Glossary against nats-server: `dseq` = delivered.consumer_seq, `sseq` = next_seq,
`adflr`/`asflr` = ack_floor, `rdc` = deliveries, `rdq` = the redelivery queue.
Counterpart: server/consumer.go (getNextMsg, processAckMsg, checkPending).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine import errors
from engine.ack_events import ACK, DELIVER, EXHAUSTED, NAK, TERM, WPI, AckEvent, AckEvents
from engine.consumer_config import ConsumerConfig, filters
from engine.info import ZERO_TIME, parse_rfc3339, rfc3339
from engine.index import MessageIndex
from engine.messages import STORE_OVERHEAD
from engine.store.base import StoredMessage
from engine.subjects import any_match

if TYPE_CHECKING:
    from engine.config import StreamConfig
    from engine.store.base import StreamStore


class ConsumedStream(Protocol):
    """What a consumer reads of its stream (engine/stream.py's `Stream` is one). Narrow on purpose:
    the consumer sits below the stream and must not know it."""

    name: str
    config: StreamConfig
    index: MessageIndex
    store: StreamStore

ACK_KINDS = {"ack": ACK, "nak": NAK, "wpi": WPI, "term": TERM}
SCAN_WINDOW = 4096


def message_bytes(index: MessageIndex, seq: int) -> int:
    """What a message counts for in a pull's `max_bytes`: subject, headers and data."""
    return index.size_of(seq) - STORE_OVERHEAD


@dataclass(slots=True)
class Pending:
    consumer_seq: int
    delivered_at: int
    deadline: int


@dataclass(slots=True)
class Delivery:
    msg: StoredMessage
    consumer_seq: int
    num_delivered: int
    num_pending: int
    consumer_id: str
    size: int

    @property
    def token(self) -> str:
        """The HTTP door's ack token, made when asked: the NATS door acks by reply subject instead."""
        return f"{self.consumer_id}.{self.msg.seq}.{self.consumer_seq}.{self.num_delivered}"


@dataclass
class ConsumerState:
    """What survives a restart, as a snapshot row of the ack table holds it."""

    next_seq: int
    delivered_consumer_seq: int = 0
    delivered_stream_seq: int = 0
    ack_floor_consumer_seq: int = 0
    ack_floor_stream_seq: int = 0
    pending: dict[int, Pending] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)
    last_per_subject: deque[int] = field(default_factory=deque)
    exhausted: set[int] = field(default_factory=set)
    last_delivered_at: int = 0
    last_acked_at: int = 0


class Consumer:
    """One consumer of one stream."""

    def __init__(
        self, stream: ConsumedStream, config: ConsumerConfig, name: str, consumer_id: str, created_ns: int, ephemeral: bool
    ) -> None:
        self.stream = stream
        self.config = config
        self.name = name
        self.consumer_id = consumer_id
        self.created_ns = created_ns
        self.ephemeral = ephemeral
        self.filters = filters(config)
        self.paused_until = _pause_ns(config)
        self.state = ConsumerState(next_seq=1)
        self._due: list[tuple[int, int]] = []  # (deadline, stream_seq), lazily invalidated
        self._due_bound = (0, 0)  # at least every entry of _due: a run above it may be appended as is
        self._redeliver: list[int] = []  # stream seqs due for redelivery, a heap
        self._queued: set[int] = set()
        self._pending_order: list[int] = []  # heap of pending stream seqs, lazily pruned
        self.waiting = 0
        self.budget_exhausted = False  # the last fetch stopped at its max_bytes
        self.acked: list[int] = []  # stream seqs the last applied events took out of pending by an ack
        self.exhausted_now: list[tuple[int, int]] = []  # (stream seq, deliveries) that just ran out of deliveries
        self.last_activity = created_ns
        self.deleted = False
        self.events_since_snapshot = 0
        # pinned_client: (pin id, when pinned in ns) of the client the front door pinned; None when unpinned
        self.pin: tuple[str, int] | None = None

    # -- position -----------------------------------------------------------------------------

    def start(self) -> None:
        """Places the cursor by the deliver policy, on a new consumer (stream lock held)."""
        c, ix = self.config, self.stream.index
        policy = c.deliver_policy
        last = ix.last_seq
        if policy == "all":
            start = ix.first_seq if ix.msgs else last + 1
        elif policy == "last":
            start = (max(ix.last_seq_for(f) for f in self.filters) if self.filters else last) or last + 1
        elif policy == "new":
            start = last + 1
        elif policy == "by_start_sequence":
            start = c.opt_start_seq or 1
        elif policy == "by_start_time":
            start = ix.seq_at_or_after_time(parse_rfc3339(c.opt_start_time or "")) or last + 1
        else:
            lps = sorted(ix.last_seq_for(s) for f in self.filters for s in ix.subjects_state(f))
            self.state.last_per_subject = deque(lps)
            start = lps[0] if lps else last + 1
            self.state.next_seq = last + 1
        if policy != "last_per_subject":
            self.state.next_seq = max(start, 1)
        self.state.delivered_stream_seq = self.state.ack_floor_stream_seq = max(start - 1, 0)

    def reconfigure(self, config: ConsumerConfig) -> None:
        self.config = config
        self.filters = filters(config)
        self.paused_until = _pause_ns(config)

    @property
    def ack_none(self) -> bool:
        return self.config.ack_policy == "none"

    def matches(self, subject: str) -> bool:
        return not self.filters or any_match(self.filters, subject)

    # -- delivery -----------------------------------------------------------------------------

    def fetch(self, batch: int, max_bytes: int, now: int) -> tuple[list[Delivery], AckEvents]:
        """Up to `batch` messages: redeliveries first, then new ones; nothing past `max_ack_pending`.

        The new messages, the bulk of a busy pull, are applied as one block (`_deliver_new`), leaving
        exactly the state that one DELIVER event at a time would leave.
        """
        self.last_activity = now
        self.budget_exhausted = False
        if now < self.paused_until:  # `pause_until`: nothing is delivered, not even redeliveries
            return [], AckEvents.of([])
        events: list[AckEvent] = []
        self._collect_due(now, events)
        budget = max_bytes if max_bytes > 0 else None
        again, budget = self._pick_redeliveries(batch, budget, now, events)
        new = self._pick_new(batch - len(again), budget, max_bytes, bool(again)) if len(again) < batch else []
        ix = self.stream.index
        wanted = sorted([s for s, _ in again] + new) if again else new
        loaded = self.stream.store.load_many(wanted, ix) if wanted else {}
        if len(loaded) < len(wanted):
            new = [s for s in new if s in loaded]
        remaining = self.num_pending_after(new)
        deliveries: list[Delivery] = []
        for seq, count in again:
            msg = loaded.get(seq)
            if msg is None:
                self._drop_pending(seq)
                continue
            event = AckEvent(DELIVER, seq, self.state.delivered_consumer_seq + 1, count + 1, now)
            self.apply(event)
            events.append(event)
            deliveries.append(
                Delivery(msg, event.consumer_seq, event.count, remaining + len(new), self.consumer_id,
                         message_bytes(ix, seq))
            )
        block = self._deliver_new(new, now)
        if new:
            n, first, consumer_id = len(new), int(block.consumer_seq[0]), self.consumer_id
            sizes = (ix.sizes_of(block.stream_seq) - STORE_OVERHEAD).tolist()
            # a map over ranges: no loop of Python bytecode per message besides Delivery's own __init__
            pending_left = range(remaining + n - 1, remaining - 1, -1)
            deliveries += map(Delivery, map(loaded.__getitem__, new), range(first, first + n), repeat(1), pending_left,
                              repeat(consumer_id), sizes)
        return deliveries, AckEvents.concat([AckEvents.of(events), block])

    def _pick_redeliveries(
        self, batch: int, budget: int | None, now: int, events: list[AckEvent]
    ) -> tuple[list[tuple[int, int]], int | None]:
        """(stream_seq, deliveries so far) of due redeliveries, and what is left of the byte budget.

        A queued message already delivered `max_deliver` times leaves pending here instead of being
        delivered again (nats-server's getNextMsg: the count that would exceed it ends the message).
        """
        picks: list[tuple[int, int]] = []
        ix = self.stream.index
        max_deliver = self.config.max_deliver
        while len(picks) < batch and self._redeliver:
            seq = heapq.heappop(self._redeliver)
            if seq not in self._queued:  # redelivered since it was queued (a replayed nak, then its delivery)
                continue
            self._queued.discard(seq)
            if seq not in self.state.pending:
                continue
            if not ix.is_live(seq):
                self._drop_pending(seq)
                continue
            if max_deliver > 0 and self.state.deliveries.get(seq, 1) >= max_deliver:
                self.exhausted_now.append((seq, self.state.deliveries.get(seq, 1)))
                event = AckEvent(EXHAUSTED, seq, 0, 0, now)
                self.apply(event)
                events.append(event)
                continue
            if budget is not None and message_bytes(ix, seq) > budget:
                self._queue_redelivery(seq)
                self.budget_exhausted = True
                break
            if budget is not None:
                budget -= message_bytes(ix, seq)
            picks.append((seq, self.state.deliveries.get(seq, 1)))
        return picks, budget

    def _pick_new(self, limit: int, budget: int | None, max_bytes: int, have_picks: bool) -> list[int]:
        """New sequences to deliver, within the byte budget; a first message over `max_bytes` is a 409."""
        seqs = self._new_seqs(limit)
        if budget is None:
            return seqs
        ix = self.stream.index
        out: list[int] = []
        for seq in seqs:
            size = message_bytes(ix, seq)
            if size > budget:
                if not have_picks and not out and budget == max_bytes:
                    raise errors.JetStreamError(409, errors.ErrorCode.BAD_REQUEST, "Message Size Exceeds MaxBytes")
                self.budget_exhausted = True
                break
            budget -= size
            out.append(seq)
        return out

    def _deliver_new(self, seqs: list[int], now: int) -> AckEvents:
        """DELIVER events (first deliveries) of ascending new sequences, applied as one block."""
        st = self.state
        if not seqs:
            return AckEvents.empty()
        first = st.delivered_consumer_seq + 1
        block = AckEvents.uniform(DELIVER, np.array(seqs, np.int64), now, first_consumer_seq=first, count=1)
        if st.last_per_subject or seqs[0] < st.next_seq:
            for event in block.to_list():
                self.apply(event)
            return block
        n, last = len(seqs), first + len(seqs) - 1
        self.events_since_snapshot += n
        st.delivered_consumer_seq = max(st.delivered_consumer_seq, last)
        st.delivered_stream_seq = max(st.delivered_stream_seq, seqs[-1])
        st.last_delivered_at = now
        st.next_seq = seqs[-1] + 1
        if self.ack_none:
            st.ack_floor_consumer_seq, st.ack_floor_stream_seq = st.delivered_consumer_seq, st.delivered_stream_seq
            self.acked += seqs
            return block
        deadline = now + self.ack_wait_for(1)
        st.pending.update(zip(seqs, map(Pending, range(first, last + 1), repeat(now), repeat(deadline))))
        st.deliveries.update(dict.fromkeys(seqs, 1))
        # Every pending sequence is below next_seq, so these sort after the whole heap: appending keeps its order.
        self._pending_order += seqs
        self._push_due_run(deadline, seqs)
        return block

    def _new_seqs(self, limit: int) -> list[int]:
        if not self.ack_none and self.config.max_ack_pending > 0:
            limit = min(limit, self.config.max_ack_pending - len(self.state.pending))
        if limit <= 0:
            return []
        out: list[int] = []
        lps = self.state.last_per_subject
        ix = self.stream.index
        for seq in list(lps)[:limit]:
            if ix.is_live(seq):
                out.append(seq)
        if len(out) >= limit or (lps and len(out) < len(lps)):
            return out[:limit]
        start = self.state.next_seq
        while len(out) < limit and start <= ix.last_seq:
            window = max(SCAN_WINDOW, limit * 4)
            found = ix.live_seqs(self.filters or None, start=start, stop=start + window)
            out += found[: limit - len(out)].tolist()
            start += window
        return out

    def num_pending_after(self, delivering: list[int]) -> int:
        """Undelivered matching messages once `delivering` (new ones, ascending) are delivered."""
        start = max(delivering[-1] + 1 if delivering else 0, self.state.next_seq)
        lps = sum(1 for s in self.state.last_per_subject if s not in delivering and self.stream.index.is_live(s))
        return self.stream.index.count_live(self.filters or None, start) + lps

    def redeliveries_queued(self) -> int:
        """Messages due for redelivery now (nats-server's `len(o.rdq)`)."""
        return len(self._redeliver)

    # -- acknowledgements ---------------------------------------------------------------------

    def ack(self, seq: int, kind: str, delay: int, now: int) -> list[AckEvent]:
        """Applies one ack of `kind` (ack, nak, wpi, term) for stream sequence `seq`."""
        self.last_activity = now
        if self.ack_none:
            raise errors.bad_request("the consumer's ack policy is none: nothing to acknowledge")
        if kind not in ACK_KINDS:
            raise errors.bad_request(f"unknown ack type {kind!r}: one of ack, nak, wpi, term")
        if delay < 0:
            raise errors.bad_request("a nak delay must not be negative")
        if seq not in self.state.pending:
            if not (self.config.ack_policy == "all" and kind in ("ack", "term") and self._acks_pending_below(seq)):
                raise self._not_pending(seq)
        event = AckEvent(ACK_KINDS[kind], seq, 0, 0, now, delay)
        self.apply(event)
        return [event]

    def _not_pending(self, seq: int) -> errors.JetStreamError:
        if 0 < seq <= self.state.delivered_stream_seq:
            return errors.bad_request(f"message {seq} is not pending acknowledgement (already acknowledged)")
        return errors.bad_request(f"message {seq} was not delivered to this consumer")

    def ack_many(self, seqs: list[int], kind: str, delay: int, now: int) -> tuple[list[errors.JetStreamError | None], AckEvents]:
        """Acks of one kind for stream sequences, in order: one result per sequence, the events as a block.

        Acks and terms of an explicit-ack consumer, the bulk of ack traffic, are applied in one loop
        without an event object each (the same state as `ack` one at a time: the ack floor moves as
        nats-server's processAckMsg moves it); anything else goes through `ack` one by one.
        """
        if kind not in ("ack", "term") or self.config.ack_policy != "explicit" or delay < 0:
            results: list[errors.JetStreamError | None] = []
            events: list[AckEvent] = []
            for seq in seqs:
                try:
                    events += self.ack(seq, kind, delay, now)
                    results.append(None)
                except errors.JetStreamError as exc:
                    results.append(exc)
            return results, AckEvents.of(events)
        self.last_activity = now
        st = self.state
        pending, deliveries = st.pending, st.deliveries
        results: list[errors.JetStreamError | None] = [None] * len(seqs)
        done: list[int] = []
        # One at a time, the floor moves when the message just above it is acked, and then to just below
        # the lowest still pending; so after the run it sits below the lowest pending one if the message
        # above it was among the acks (or at `delivered` if nothing is pending), and where it was if not.
        above_floor = st.ack_floor_consumer_seq + 1
        moved = False
        for i, seq in enumerate(seqs):
            p = pending.pop(seq, None)
            if p is None:
                results[i] = self._not_pending(seq)
                continue
            deliveries.pop(seq, None)
            done.append(seq)
            moved = moved or p.consumer_seq == above_floor
        if done:
            if not pending:
                st.ack_floor_consumer_seq, st.ack_floor_stream_seq = st.delivered_consumer_seq, st.delivered_stream_seq
            elif moved:
                low = self._lowest_pending()
                st.ack_floor_stream_seq = low - 1
                st.ack_floor_consumer_seq = pending[low].consumer_seq - 1
            st.last_acked_at = now
            self.events_since_snapshot += len(done)
            self.acked += done
        return results, AckEvents.uniform(ACK_KINDS[kind], np.array(done, np.int64), now, delay=delay)

    def _acks_pending_below(self, seq: int) -> bool:
        return any(s <= seq for s in self.state.pending)

    def _collect_due(self, now: int, events: list[AckEvent]) -> None:
        """Pending messages whose ack wait ran out join the redelivery queue, unless out of deliveries.

        nats-server's checkPending (hasMaxDeliveries) counts deliveries here as the redeliveries so far,
        at least 1: only a max_deliver of 1 ends a message when its ack wait runs out; a message
        delivered its max_deliver (> 1) times is queued and ends at the next pull (`_pick_redeliveries`),
        staying ack-pending until then. Both are what a nats-server 2.15 consumer reports.
        """
        max_deliver = self.config.max_deliver
        while self._due and self._due[0][0] <= now:
            deadline, seq = heapq.heappop(self._due)
            pending = self.state.pending.get(seq)
            if pending is None or pending.deadline != deadline:
                continue
            if max_deliver > 0 and max(self.state.deliveries.get(seq, 1) - 1, 1) >= max_deliver:
                self.exhausted_now.append((seq, self.state.deliveries.get(seq, 1)))
                event = AckEvent(EXHAUSTED, seq, 0, 0, now)
                self.apply(event)
                events.append(event)
                continue
            self._queue_redelivery(seq)

    def _queue_redelivery(self, seq: int) -> None:
        if seq not in self._queued:
            self._queued.add(seq)
            heapq.heappush(self._redeliver, seq)

    def tick(self, now: int) -> list[AckEvent]:
        """Ack timers without a pull: due messages are queued, or leave pending with a max_deliver of 1."""
        events: list[AckEvent] = []
        self._collect_due(now, events)
        return events

    def drop_removed(self, seqs: np.ndarray) -> None:
        """Messages removed from the stream count as acknowledged (nats-server's decStreamPending)."""
        if not self.state.pending or not len(seqs):
            return
        pending = np.fromiter(self.state.pending, np.int64, len(self.state.pending))
        for seq in np.sort(pending[np.isin(pending, seqs)]).tolist():
            self._drop_pending(seq)

    def drop_removed_range(self, first: int, last: int) -> None:
        """`drop_removed` for every sequence in [first, last] (a purge, an expiry, a limit)."""
        if not self.state.pending:
            return
        pending = np.fromiter(self.state.pending, np.int64, len(self.state.pending))
        for seq in np.sort(pending[(pending >= first) & (pending <= last)]).tolist():
            self._drop_pending(seq)

    def next_deadline(self) -> int | None:
        while self._due:
            deadline, seq = self._due[0]
            pending = self.state.pending.get(seq)
            if pending is not None and pending.deadline == deadline:
                return deadline
            heapq.heappop(self._due)
        return None

    # -- the state machine --------------------------------------------------------------------

    def ack_wait_for(self, count: int) -> int:
        backoff = self.config.backoff
        if backoff:
            return backoff[min(count - 1, len(backoff) - 1)]
        return self.config.ack_wait

    def apply(self, e: AckEvent) -> None:
        st = self.state
        self.events_since_snapshot += 1
        if e.kind == DELIVER:
            st.delivered_consumer_seq = max(st.delivered_consumer_seq, e.consumer_seq)
            st.delivered_stream_seq = max(st.delivered_stream_seq, e.stream_seq)
            st.last_delivered_at = e.ts
            if st.last_per_subject and st.last_per_subject[0] == e.stream_seq:
                st.last_per_subject.popleft()
            elif e.count == 1 and e.stream_seq >= st.next_seq:
                st.next_seq = e.stream_seq + 1
            if self.ack_none:
                st.ack_floor_consumer_seq, st.ack_floor_stream_seq = st.delivered_consumer_seq, st.delivered_stream_seq
                self.acked.append(e.stream_seq)
                return
            deadline = e.ts + self.ack_wait_for(e.count)
            earlier = st.pending.get(e.stream_seq)
            self._queued.discard(e.stream_seq)
            # A redelivery keeps the first delivery's consumer sequence, as nats-server's trackPending does.
            first_cseq = earlier.consumer_seq if earlier is not None else e.consumer_seq
            st.pending[e.stream_seq] = Pending(first_cseq, e.ts, deadline)
            if earlier is None:
                heapq.heappush(self._pending_order, e.stream_seq)
            st.deliveries[e.stream_seq] = e.count
            self._push_due(deadline, e.stream_seq)
        elif e.kind in (ACK, TERM):
            st.last_acked_at = e.ts
            if self.config.ack_policy == "all":
                for seq in sorted(s for s in st.pending if s <= e.stream_seq):
                    if self._drop_pending(seq):
                        self.acked.append(seq)
            elif self._drop_pending(e.stream_seq):
                self.acked.append(e.stream_seq)
        elif e.kind == NAK:
            pending = st.pending.get(e.stream_seq)
            if pending is not None:
                pending.deadline = e.ts + e.delay
                if e.delay:  # redelivered when the delay is over, not sooner (nats-server leaves the queue)
                    self._queued.discard(e.stream_seq)
                    self._push_due(pending.deadline, e.stream_seq)
                else:
                    self._queue_redelivery(e.stream_seq)
        elif e.kind == WPI:
            pending = st.pending.get(e.stream_seq)
            if pending is not None:
                pending.deadline = e.ts + self.ack_wait_for(st.deliveries.get(e.stream_seq, 1))
                self._push_due(pending.deadline, e.stream_seq)
        elif e.kind == EXHAUSTED:
            # Out of deliveries: no longer pending, but not acknowledged either, so the ack floor stays
            # below it until a later ack moves it (nats-server's consumer store, UpdateDelivered).
            st.exhausted.add(e.stream_seq)
            if st.pending.pop(e.stream_seq, None) is not None:
                st.deliveries.pop(e.stream_seq, None)

    def _push_due(self, deadline: int, seq: int) -> None:
        heapq.heappush(self._due, (deadline, seq))
        self._due_bound = max(self._due_bound, (deadline, seq))

    def _push_due_run(self, deadline: int, seqs: list[int]) -> None:
        """One deadline for ascending sequences (a pull's new deliveries). They usually sort after
        every queued deadline (one ack_wait, time moving on): then appending them keeps the heap."""
        if not self._due or (deadline, seqs[0]) >= self._due_bound:
            self._due += zip(repeat(deadline), seqs)
            self._due_bound = (deadline, seqs[-1])
            return
        for seq in seqs:
            self._push_due(deadline, seq)

    def _drop_pending(self, seq: int) -> bool:
        """Takes `seq` out of pending and moves the ack floor as nats-server's processAckMsg does."""
        st = self.state
        pending = st.pending.pop(seq, None)
        if pending is None:
            return False
        st.deliveries.pop(seq, None)
        if not st.pending:
            st.ack_floor_consumer_seq = st.delivered_consumer_seq
            st.ack_floor_stream_seq = st.delivered_stream_seq
        elif pending.consumer_seq == st.ack_floor_consumer_seq + 1:
            low = self._lowest_pending()
            st.ack_floor_stream_seq = low - 1
            st.ack_floor_consumer_seq = st.pending[low].consumer_seq - 1
        return True

    def _lowest_pending(self) -> int:
        """The lowest pending stream sequence: a heap with lazy deletion, not a scan of pending."""
        heap, pending = self._pending_order, self.state.pending
        if len(heap) > 4 * len(pending) + 64:
            heap[:] = list(pending)
            heapq.heapify(heap)
        while heap[0] not in pending:
            heapq.heappop(heap)
        return heap[0]

    # -- retention ----------------------------------------------------------------------------

    def needs(self, seqs: np.ndarray, subjects_match: np.ndarray) -> np.ndarray:
        """Which of `seqs` this consumer still needs (JetStream's interest rule)."""
        st = self.state
        above = seqs > st.ack_floor_stream_seq
        undelivered = seqs >= st.next_seq
        held = np.isin(seqs, np.fromiter(list(st.pending) + list(st.exhausted), np.int64))
        return subjects_match & above & (undelivered | held)

    def acknowledged(self, seq: int) -> bool:
        st = self.state
        return seq < st.next_seq and seq not in st.pending and seq not in st.exhausted and seq not in st.last_per_subject

    # -- info and snapshots -------------------------------------------------------------------

    def info(self, now: int) -> dict[str, Any]:
        st = self.state
        delivered: dict[str, Any] = {"consumer_seq": st.delivered_consumer_seq, "stream_seq": st.delivered_stream_seq}
        if st.last_delivered_at:
            delivered["last_active"] = rfc3339(st.last_delivered_at)
        ack_floor: dict[str, Any] = {"consumer_seq": st.ack_floor_consumer_seq, "stream_seq": st.ack_floor_stream_seq}
        if st.last_acked_at:
            ack_floor["last_active"] = rfc3339(st.last_acked_at)
        return {
            "stream_name": self.stream.name,
            "name": self.name,
            "created": rfc3339(self.created_ns),
            "config": self.config.to_json(),
            "delivered": delivered,
            "ack_floor": ack_floor,
            "num_ack_pending": len(st.pending),
            "num_redelivered": self._num_redelivered(),
            "num_waiting": self.waiting,
            "num_pending": self.num_pending_after([]),
            **({"paused": True, "pause_remaining": self.paused_until - now} if now < self.paused_until else {}),
            "ts": rfc3339(now),
            **self._priority_groups(),
        }

    def _priority_groups(self) -> dict[str, Any]:
        """nats-server's `priority_groups` state: one entry, named for the first configured group, with the
        consumer's pin (its one pin, whichever group asked for it) or Go's zero time when there is none."""
        config = self.config
        if config.priority_policy == "none" or not config.priority_groups:
            return {}
        state: dict[str, Any] = {"group": config.priority_groups[0]}
        if self.pin is not None:
            state |= {"pinned_client_id": self.pin[0], "pinned_ts": rfc3339(self.pin[1])}
        else:
            state["pinned_ts"] = ZERO_TIME
        return {"priority_groups": [state]}

    def _num_redelivered(self) -> int:
        """Messages delivered more than once: pending ones, and those that ran out of deliveries (nats-server
        keeps their redelivery count; with max_deliver 1 it reports none, as there are no redeliveries)."""
        st = self.state
        pending = sum(1 for s in st.pending if st.deliveries.get(s, 1) > 1)
        return pending + (len(st.exhausted) if self.config.max_deliver != 1 else 0)

    def snapshot(self) -> dict[str, Any]:
        st = self.state
        return {
            "next_seq": st.next_seq,
            "delivered": [st.delivered_consumer_seq, st.delivered_stream_seq, st.last_delivered_at],
            "ack_floor": [st.ack_floor_consumer_seq, st.ack_floor_stream_seq, st.last_acked_at],
            "pending": [[s, p.consumer_seq, p.delivered_at, p.deadline, st.deliveries.get(s, 1)] for s, p in st.pending.items()],
            "last_per_subject": list(st.last_per_subject),
            "exhausted": sorted(st.exhausted),
        }

    def restore(self, snap: dict[str, Any]) -> None:
        st = ConsumerState(next_seq=snap["next_seq"])
        st.delivered_consumer_seq, st.delivered_stream_seq, st.last_delivered_at = snap["delivered"]
        st.ack_floor_consumer_seq, st.ack_floor_stream_seq, st.last_acked_at = snap["ack_floor"]
        for seq, cseq, at, deadline, count in snap["pending"]:
            st.pending[seq] = Pending(cseq, at, deadline)
            st.deliveries[seq] = count
        st.last_per_subject = deque(snap["last_per_subject"])
        st.exhausted = set(snap["exhausted"])
        self.state = st
        self._due = [(p.deadline, s) for s, p in st.pending.items()]
        heapq.heapify(self._due)
        self._due_bound = max(self._due, default=(0, 0))
        self._redeliver = []
        self._queued = set()
        self._pending_order = list(st.pending)
        heapq.heapify(self._pending_order)
        self.events_since_snapshot = 0


def _pause_ns(config: ConsumerConfig) -> int:
    """`pause_until` in ns since the epoch (0: not paused); nats-server pauses delivery until then."""
    return parse_rfc3339(config.pause_until) if config.pause_until else 0
