"""Restoring consumers: from their records and their histories in the ack table, at start and later.

At start the ack table and log are read once, for every stream (`prepare`); a stream opened later
(engine/catalog.py) restores its consumers from what is left of that, and takes it out. The catalog's
copy names each stream's consumers, so which streams have a consumer that acts unasked (and must be
opened at start) is known without opening them. In scoped mode a stream's ack store is read when the
stream is taken over (`open_stream`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.ack_stores import AckStores
from engine.consumer_records import consumer_of, read_record, record_keys
from engine.consumer_retention import sweep
from engine.store.acks import ConsumerHistory
from engine.store.layout import Layout
from engine.store.leases import Lease

if TYPE_CHECKING:
    from engine.stream import Stream


class ConsumerRecovery:
    """The consumers of the account's streams not restored yet, and their restoring."""

    def __init__(self, layout: Layout, stores: AckStores) -> None:
        self.layout = layout
        self.stores = stores
        # Read once at start (`prepare`) for every stream; a stream opened later takes its own out.
        self._histories: dict[str, ConsumerHistory] | None = None
        # stream -> its consumers' names, each with whether it acts unasked (from the catalog copy)
        self._unrestored: dict[str, dict[str, bool]] = {}

    def prepare(self, consumers: dict[str, dict[str, bool]]) -> None:
        """Reads every consumer's history (the ack table and log, once) and keeps every stream's consumer
        names (`consumers`, from the catalog): the streams opened at start and those opened later
        restore from them."""
        if self.stores.scoped or self._histories is not None:
            return  # scoped: each stream's ack store opens with the stream (`open_stream`)
        self.stores.acks.create()
        self._histories = self.stores.acks.recover()
        self._unrestored = {stream: names for stream, names in consumers.items() if names}

    def restore_stream(self, stream: Stream) -> None:
        """Reopens the consumers of a stream opened after the start (or at it)."""
        if self.stores.scoped or self._histories is None:
            return
        names = self._unrestored.pop(stream.name, {})
        keys = [self.layout.consumer_config_key(stream.name, n) for n in sorted(names)]
        self._restore(stream, keys, self._histories)

    def open_stream(self, stream: Stream, lease: Lease) -> None:
        """A stream this gateway now owns (scoped mode): its ack store, fenced by `lease`, and its consumers."""
        histories = self.stores.open(stream.name, lease)
        folder = self.layout.consumer_configs_key(stream.name)
        self._restore(stream, record_keys(self.layout, folder).get(folder, []), histories)

    def act_alone(self, stream: str) -> bool:
        """Whether a stream has a consumer that acts unasked, so the stream is opened at start: a push
        consumer delivers, an ephemeral one or one with an inactivity threshold goes away on its own."""
        return any(self._unrestored.get(stream, {}).values())

    def unrestored(self, stream: str) -> dict[str, bool]:
        """The consumer names (and whether each acts unasked) of a stream not opened yet."""
        return dict(self._unrestored.get(stream, {}))

    def unrestored_count(self, stream: str) -> int:
        return len(self._unrestored.get(stream, ()))

    def _restore(self, stream: Stream, keys: list[str], histories: dict[str, ConsumerHistory]) -> None:
        """Reopens a stream's consumers from their records and their histories (snapshot, later events)."""
        for key in keys:
            record = read_record(self.layout, key)
            if record is None:
                continue
            consumer = consumer_of(stream, record)
            ledger = consumer.ledger
            history = histories.pop(consumer.consumer_id, None)
            ledger.restore(history.snapshot if history and history.snapshot else record["start"])
            for event in history.events if history else []:
                ledger.apply(event)
            ledger.acked.clear()
            consumer.drop_removed(np.array([s for s in ledger.state.pending if not stream.index.is_live(s)], np.int64))
            stream.consumers[consumer.name] = consumer
        with stream.lock:
            sweep(stream)
