"""A consumer's ledger of acknowledgements: its pending messages, their ack timers, the redelivery
queue and the ack floor, changed only by `AckEvent`s.

Live operations (engine/consumer.py) build the event, log it and apply it here; recovery restores a
snapshot (engine/consumer_state.py) and applies the logged events again, so the state after a restart
is the state before it. Driven by the timestamps in its events, under the stream's lock. Glossary
against nats-server: `adflr`/`asflr` = the ack floor, `rdc` = deliveries, `rdq` = the redelivery queue.
Counterpart: server/consumer.go (processAckMsg, checkPending, trackPending).
"""

from __future__ import annotations

import heapq
from itertools import repeat
from typing import Any

import numpy as np

from engine import errors
from engine.ack_events import ACK, DELIVER, EXHAUSTED, NAK, TERM, WPI, AckEvent, AckEvents
from engine.consumer_config import ConsumerConfig
from engine.consumer_state import ConsumerState, Pending
from engine.delivery import message_bytes
from engine.index import MessageIndex

ACK_KINDS = {"ack": ACK, "nak": NAK, "wpi": WPI, "term": TERM}


class AckLedger:
    """The acknowledgement state of one consumer and the event machine that changes it."""

    def __init__(self, config: ConsumerConfig) -> None:
        self.config = config
        self.state = ConsumerState(next_seq=1)
        self._due: list[tuple[int, int]] = []  # (deadline, stream_seq), lazily invalidated
        self._due_bound = (0, 0)  # at least every entry of _due: a run above it may be appended as is
        self._redeliver: list[int] = []  # stream seqs due for redelivery, a heap
        self._queued: set[int] = set()
        self._pending_order: list[int] = []  # heap of pending stream seqs, lazily pruned
        self.acked: list[int] = []  # stream seqs the last applied events took out of pending by an ack
        self.exhausted_now: list[tuple[int, int]] = []  # (stream seq, deliveries) that just ran out of deliveries
        self.events_since_snapshot = 0

    @property
    def ack_none(self) -> bool:
        return self.config.ack_policy == "none"

    def ack_wait_for(self, count: int) -> int:
        backoff = self.config.backoff
        if backoff:
            return backoff[min(count - 1, len(backoff) - 1)]
        return self.config.ack_wait

    # -- the event machine --------------------------------------------------------------------

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
                    if self.drop_pending(seq):
                        self.acked.append(seq)
            elif self.drop_pending(e.stream_seq):
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

    def deliver_run(self, seqs: list[int], now: int) -> AckEvents:
        """DELIVER events (first deliveries) of ascending new sequences, applied as one block: the state
        one `apply` at a time would leave, without an event object each (the bulk of a busy pull)."""
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

    def ack_run(
        self, seqs: list[int], kind: str, delay: int, now: int
    ) -> tuple[list[errors.JetStreamError | None], AckEvents]:
        """Acks (or terms) of an explicit-ack consumer, applied in one loop without an event object each:
        the state `apply` one at a time would leave, the ack floor moved as nats-server's processAckMsg
        moves it. One result per sequence (None, or why it was not pending)."""
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
                results[i] = self.not_pending(seq)
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

    def not_pending(self, seq: int) -> errors.JetStreamError:
        if 0 < seq <= self.state.delivered_stream_seq:
            return errors.bad_request(f"message {seq} is not pending acknowledgement (already acknowledged)")
        return errors.bad_request(f"message {seq} was not delivered to this consumer")

    # -- ack timers and redeliveries ----------------------------------------------------------

    def collect_due(self, now: int, events: list[AckEvent]) -> None:
        """Pending messages whose ack wait ran out join the redelivery queue, unless out of deliveries.

        nats-server's checkPending (hasMaxDeliveries) counts deliveries here as the redeliveries so far,
        at least 1: only a max_deliver of 1 ends a message when its ack wait runs out; a message
        delivered its max_deliver (> 1) times is queued and ends at the next pull (`pick_redeliveries`),
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

    def pick_redeliveries(
        self, batch: int, budget: int | None, ix: MessageIndex, now: int, events: list[AckEvent]
    ) -> tuple[list[tuple[int, int]], int | None, bool]:
        """(stream_seq, deliveries so far) of queued redeliveries, what is left of the byte budget, and
        whether the budget stopped them.

        A queued message already delivered `max_deliver` times leaves pending here instead of being
        delivered again (nats-server's getNextMsg: the count that would exceed it ends the message).
        """
        picks: list[tuple[int, int]] = []
        max_deliver = self.config.max_deliver
        while len(picks) < batch and self._redeliver:
            seq = heapq.heappop(self._redeliver)
            if seq not in self._queued:  # redelivered since it was queued (a replayed nak, then its delivery)
                continue
            self._queued.discard(seq)
            if seq not in self.state.pending:
                continue
            if not ix.is_live(seq):
                self.drop_pending(seq)
                continue
            if max_deliver > 0 and self.state.deliveries.get(seq, 1) >= max_deliver:
                self.exhausted_now.append((seq, self.state.deliveries.get(seq, 1)))
                event = AckEvent(EXHAUSTED, seq, 0, 0, now)
                self.apply(event)
                events.append(event)
                continue
            if budget is not None and message_bytes(ix, seq) > budget:
                self._queue_redelivery(seq)
                return picks, budget, True
            if budget is not None:
                budget -= message_bytes(ix, seq)
            picks.append((seq, self.state.deliveries.get(seq, 1)))
        return picks, budget, False

    def redeliveries_queued(self) -> int:
        """Messages due for redelivery now (nats-server's `len(o.rdq)`)."""
        return len(self._redeliver)

    def tick(self, now: int) -> list[AckEvent]:
        """Ack timers without a pull: due messages are queued, or leave pending with a max_deliver of 1."""
        events: list[AckEvent] = []
        self.collect_due(now, events)
        return events

    def next_deadline(self) -> int | None:
        while self._due:
            deadline, seq = self._due[0]
            pending = self.state.pending.get(seq)
            if pending is not None and pending.deadline == deadline:
                return deadline
            heapq.heappop(self._due)
        return None

    def _queue_redelivery(self, seq: int) -> None:
        if seq not in self._queued:
            self._queued.add(seq)
            heapq.heappush(self._redeliver, seq)

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

    # -- leaving pending ----------------------------------------------------------------------

    def drop_pending(self, seq: int) -> bool:
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

    def drop_removed(self, seqs: np.ndarray) -> None:
        """Messages removed from the stream count as acknowledged (nats-server's decStreamPending)."""
        if not self.state.pending or not len(seqs):
            return
        pending = np.fromiter(self.state.pending, np.int64, len(self.state.pending))
        for seq in np.sort(pending[np.isin(pending, seqs)]).tolist():
            self.drop_pending(seq)

    def drop_removed_range(self, first: int, last: int) -> None:
        """`drop_removed` for every sequence in [first, last] (a purge, an expiry, a limit)."""
        if not self.state.pending:
            return
        pending = np.fromiter(self.state.pending, np.int64, len(self.state.pending))
        for seq in np.sort(pending[(pending >= first) & (pending <= last)]).tolist():
            self.drop_pending(seq)

    def _lowest_pending(self) -> int:
        """The lowest pending stream sequence: a heap with lazy deletion, not a scan of pending."""
        heap, pending = self._pending_order, self.state.pending
        if len(heap) > 4 * len(pending) + 64:
            heap[:] = list(pending)
            heapq.heapify(heap)
        while heap[0] not in pending:
            heapq.heappop(heap)
        return heap[0]

    # -- snapshots ----------------------------------------------------------------------------

    def restore(self, snap: dict[str, Any]) -> None:
        """The state of a snapshot row; the ack timers are rebuilt from its pending messages' deadlines."""
        st = ConsumerState.from_snapshot(snap)
        self.state = st
        self._due = [(p.deadline, s) for s, p in st.pending.items()]
        heapq.heapify(self._due)
        self._due_bound = max(self._due, default=(0, 0))
        self._redeliver = []
        self._queued = set()
        self._pending_order = list(st.pending)
        heapq.heapify(self._pending_order)
        self.events_since_snapshot = 0
