"""Where a gateway writes its consumers' events: the account's ack store, or one per owned stream.

With one gateway on a warehouse every consumer's events go to the account's ack store. With several
(scoped mode), each owned stream's events go to an ack store of its own, fenced by the stream's lease,
so a stream moves to another gateway with its consumers. Also what of a consumer a store's log holds:
its events of one request, and its snapshot rows.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import orjson

from engine.ack_events import AckEvent, AckEvents
from engine.store.acks import SNAPSHOT, AckStore, ConsumerHistory, EventBlock, EventRow, LogItem
from engine.store.backlog import Backlog
from engine.store.layout import Layout
from engine.store.leases import Lease

if TYPE_CHECKING:
    from engine.consumer import Consumer
    from engine.stream import Stream

log = logging.getLogger(__name__)


class AckStores:
    """The account's ack store, or in scoped mode the ack store of each stream this gateway owns."""

    def __init__(self, layout: Layout, sync_always: bool, backlog: Backlog | None = None,
                 log_lease: Lease | None = None) -> None:
        self.layout = layout
        self.acks = AckStore(layout, sync_always, backlog, log_lease)
        self.scoped = False
        self._scoped: dict[str, AckStore] = {}
        self._sync_always = sync_always
        self._backlog = backlog

    def of(self, stream: Stream) -> AckStore:
        """The ack store of a stream's events: the account's, or the stream's own in scoped mode."""
        return self._scoped[stream.name] if self.scoped else self.acks

    def all(self) -> list[AckStore]:
        return list(self._scoped.values()) if self.scoped else [self.acks]

    def open(self, stream: str, lease: Lease) -> dict[str, ConsumerHistory]:
        """A stream this gateway now owns (scoped mode): its ack store, fenced by `lease`; its consumers'
        histories."""
        acks = AckStore(self.layout, self._sync_always, self._backlog, lease, scope=stream)
        acks.create()
        histories = acks.recover()
        self._scoped[stream] = acks
        return histories

    def close(self, stream: str, flush: bool = True) -> None:
        """A stream handed over (scoped mode): its events committed (`flush`), its store closed."""
        acks = self._scoped.pop(stream, None)
        if acks is None:
            return
        try:
            if flush:
                acks.flush(fold=False)
        except Exception as exc:  # noqa: BLE001 - the stream's ack log keeps what was not committed
            log.warning("the acks of stream %s were not committed at its hand-over (kept in its log): %s",
                        stream, exc)
        acks.wal.close()

    def can_log_now(self, stream: Stream) -> bool:
        """Whether a stream's events would be logged without waiting (no write under way, no fsync)."""
        acks = self.of(stream)
        return not acks.sync_always and acks.idle

    def flush(self, fold: bool = True, lease_timeout: float = 0) -> int:
        """Commits every ack store's logged events; returns the commits made."""
        return sum(acks.flush(fold, lease_timeout) for acks in self.all())


def log_items(consumer: Consumer, events: AckEvents) -> list[LogItem]:
    """A consumer's events of one request, as its ack store logs them (nothing for a memory stream)."""
    if consumer.stream.config.storage == "memory" or not len(events):
        return []
    return [EventBlock(consumer.stream.name, consumer.name, consumer.consumer_id, events)]


def snapshot_row(consumer: Consumer, now: int) -> EventRow:
    """A consumer's state as a snapshot row: a restart starts from it, and the events it folds go."""
    consumer.ledger.events_since_snapshot = 0
    st = consumer.state
    return EventRow(
        consumer.stream.name, consumer.name, consumer.consumer_id, AckEvent(SNAPSHOT, 0, 0, 0, now),
        st.delivered_stream_seq, st.ack_floor_stream_seq, orjson.dumps(st.snapshot()).decode(),
    )
