"""A consumer: JetStream's delivery cursor over its stream, and the front of its acknowledgements.

Every change of state is an `AckEvent` (a delivery, an ack, a nak, ...). Live operations choose the
messages or check the ack here, build the event, log it (the caller appends it to the ack log before
answering) and apply it to the consumer's ledger (engine/ack_ledger.py), which recovery replays. The
machine is synchronous and driven by the timestamps in its events; the stream's lock serialises it with
the stream it reads. Glossary against nats-server: `dseq` = delivered.consumer_seq, `sseq` = next_seq.
Counterpart: server/consumer.go (getNextMsg, processAckMsg).
"""

from __future__ import annotations

from collections import deque
from itertools import repeat
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from engine import errors
from engine.ack_events import DELIVER, AckEvent, AckEvents
from engine.ack_ledger import ACK_KINDS, AckLedger
from engine.consumer_config import ConsumerConfig, filters
from engine.consumer_state import ConsumerState
from engine.delivery import Delivery, message_bytes
from engine.info import ZERO_TIME, parse_rfc3339, rfc3339
from engine.index import MessageIndex
from engine.messages import STORE_OVERHEAD
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

SCAN_WINDOW = 4096


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
        self.ledger = AckLedger(config)
        self.waiting = 0
        self.budget_exhausted = False  # the last fetch stopped at its max_bytes
        self.last_activity = created_ns
        self.deleted = False
        # pinned_client: (pin id, when pinned in ns) of the client the front door pinned; None when unpinned
        self.pin: tuple[str, int] | None = None

    @property
    def state(self) -> ConsumerState:
        """The ledger's state (a restore replaces it: read it here, do not keep it)."""
        return self.ledger.state

    # -- position -----------------------------------------------------------------------------

    def start(self) -> None:
        """Places the cursor by the deliver policy, on a new consumer (stream lock held)."""
        c, ix, st = self.config, self.stream.index, self.ledger.state
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
            st.last_per_subject = deque(lps)
            start = lps[0] if lps else last + 1
            st.next_seq = last + 1
        if policy != "last_per_subject":
            st.next_seq = max(start, 1)
        st.delivered_stream_seq = st.ack_floor_stream_seq = max(start - 1, 0)

    def reconfigure(self, config: ConsumerConfig) -> None:
        self.config = config
        self.ledger.config = config
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

        The new messages, the bulk of a busy pull, are applied as one block (`AckLedger.deliver_run`),
        leaving exactly the state that one DELIVER event at a time would leave.
        """
        self.last_activity = now
        self.budget_exhausted = False
        if now < self.paused_until:  # `pause_until`: nothing is delivered, not even redeliveries
            return [], AckEvents.of([])
        ledger = self.ledger
        ix = self.stream.index
        events: list[AckEvent] = []
        ledger.collect_due(now, events)
        budget = max_bytes if max_bytes > 0 else None
        again, budget, self.budget_exhausted = ledger.pick_redeliveries(batch, budget, ix, now, events)
        new = self._pick_new(batch - len(again), budget, max_bytes, bool(again)) if len(again) < batch else []
        wanted = sorted([s for s, _ in again] + new) if again else new
        loaded = self.stream.store.load_many(wanted, ix) if wanted else {}
        if len(loaded) < len(wanted):
            new = [s for s in new if s in loaded]
        remaining = self.num_pending_after(new)
        deliveries: list[Delivery] = []
        for seq, count in again:
            msg = loaded.get(seq)
            if msg is None:
                ledger.drop_pending(seq)
                continue
            event = AckEvent(DELIVER, seq, ledger.state.delivered_consumer_seq + 1, count + 1, now)
            ledger.apply(event)
            events.append(event)
            deliveries.append(
                Delivery(msg, event.consumer_seq, event.count, remaining + len(new), self.consumer_id,
                         message_bytes(ix, seq))
            )
        block = ledger.deliver_run(new, now)
        if new:
            n, first, consumer_id = len(new), int(block.consumer_seq[0]), self.consumer_id
            sizes = (ix.sizes_of(block.stream_seq) - STORE_OVERHEAD).tolist()
            # a map over ranges: no loop of Python bytecode per message besides Delivery's own __init__
            pending_left = range(remaining + n - 1, remaining - 1, -1)
            deliveries += map(Delivery, map(loaded.__getitem__, new), range(first, first + n), repeat(1), pending_left,
                              repeat(consumer_id), sizes)
        return deliveries, AckEvents.concat([AckEvents.of(events), block])

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

    def _new_seqs(self, limit: int) -> list[int]:
        st = self.ledger.state
        if not self.ack_none and self.config.max_ack_pending > 0:
            limit = min(limit, self.config.max_ack_pending - len(st.pending))
        if limit <= 0:
            return []
        out: list[int] = []
        lps = st.last_per_subject
        ix = self.stream.index
        for seq in list(lps)[:limit]:
            if ix.is_live(seq):
                out.append(seq)
        if len(out) >= limit or (lps and len(out) < len(lps)):
            return out[:limit]
        start = st.next_seq
        while len(out) < limit and start <= ix.last_seq:
            window = max(SCAN_WINDOW, limit * 4)
            found = ix.live_seqs(self.filters or None, start=start, stop=start + window)
            out += found[: limit - len(out)].tolist()
            start += window
        return out

    def num_pending_after(self, delivering: list[int]) -> int:
        """Undelivered matching messages once `delivering` (new ones, ascending) are delivered."""
        st = self.ledger.state
        start = max(delivering[-1] + 1 if delivering else 0, st.next_seq)
        lps = sum(1 for s in st.last_per_subject if s not in delivering and self.stream.index.is_live(s))
        return self.stream.index.count_live(self.filters or None, start) + lps

    def redeliveries_queued(self) -> int:
        """Messages due for redelivery now (nats-server's `len(o.rdq)`)."""
        return self.ledger.redeliveries_queued()

    def next_deadline(self) -> int | None:
        """The next ack timer's deadline in ns, None when nothing is pending."""
        return self.ledger.next_deadline()

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
        ledger = self.ledger
        if seq not in ledger.state.pending:
            if not (self.config.ack_policy == "all" and kind in ("ack", "term") and self._acks_pending_below(seq)):
                raise ledger.not_pending(seq)
        event = AckEvent(ACK_KINDS[kind], seq, 0, 0, now, delay)
        ledger.apply(event)
        return [event]

    def ack_many(self, seqs: list[int], kind: str, delay: int, now: int) -> tuple[list[errors.JetStreamError | None], AckEvents]:
        """Acks of one kind for stream sequences, in order: one result per sequence, the events as a block.

        Acks and terms of an explicit-ack consumer, the bulk of ack traffic, are applied in one loop
        without an event object each (`AckLedger.ack_run`); anything else goes through `ack` one by one.
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
        return self.ledger.ack_run(seqs, kind, delay, now)

    def _acks_pending_below(self, seq: int) -> bool:
        return any(s <= seq for s in self.ledger.state.pending)

    def drop_removed(self, seqs: np.ndarray) -> None:
        """Messages removed from the stream count as acknowledged (nats-server's decStreamPending)."""
        self.ledger.drop_removed(seqs)

    def drop_removed_range(self, first: int, last: int) -> None:
        """`drop_removed` for every sequence in [first, last] (a purge, an expiry, a limit)."""
        self.ledger.drop_removed_range(first, last)

    # -- info ---------------------------------------------------------------------------------

    def info(self, now: int) -> dict[str, Any]:
        st = self.ledger.state
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
        st = self.ledger.state
        pending = sum(1 for s in st.pending if st.deliveries.get(s, 1) > 1)
        return pending + (len(st.exhausted) if self.config.max_deliver != 1 else 0)


def _pause_ns(config: ConsumerConfig) -> int:
    """`pause_until` in ns since the epoch (0: not paused); nats-server pauses delivery until then."""
    return parse_rfc3339(config.pause_until) if config.pause_until else 0
