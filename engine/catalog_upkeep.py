"""Keeping the catalog's compact copy (engine/catalog_store.py) in step with an account's streams.

The copy is a cache of the per-stream files; this module owns what keeps it useful: the mark around
each change of a stream's files, the rewrites (at start when marks or a missing copy call for one, in
the background once many marks gather, at close), what a rewrite writes (an unopened stream's record,
consumer names and counters as read at start; an opened stream's config, consumers and counters now;
a marked stream's own files again), and the counters an account info sums for streams not opened yet,
used only while their table and tombstones are where they were when the counters were taken.
With several gateways there is no copy: no marks, no rewrites, no counters.
Counterpart: nats-server keeps no such copy (each stream's `meta.inf` is read at start).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from engine.catalog import CatalogEntry, CatalogRead, StreamRecord, read_catalog, record_json
from engine.catalog_store import CatalogItem, CatalogStore
from engine.store.commits import is_latest_version
from engine.store.delta import DeltaStore
from engine.store.tombstones import TombstoneView
from engine.stream import Stream

if TYPE_CHECKING:
    from engine.consumer import Consumer
    from engine.consumers import Consumers

log = logging.getLogger(__name__)


class CatalogUpkeep:
    """The account's catalog copy kept in step with its streams (see the module docstring).

    `entries` returns the registry's (name, entry) pairs, taken under the registry's lock; `enabled`
    is False with several gateways (each owns streams one by one: the account has no copy)."""

    def __init__(self, store: CatalogStore, consumers: Consumers,
                 entries: Callable[[], list[tuple[str, CatalogEntry]]], enabled: bool) -> None:
        self.store = store
        self.enabled = enabled
        self._consumers = consumers
        self._entries = entries
        self._counters: dict[str, dict[str, int]] = {}  # unopened streams' counters from the copy
        self.rewriter: threading.Thread | None = None
        self._rewriter_lock = threading.Lock()

    def changing(self, name: str) -> AbstractContextManager[None]:
        """The mark for a change of a stream's files, durable before the change writes anything."""
        return self.store.changing(name) if self.enabled else nullcontext()

    def read(self) -> CatalogRead:
        """What a start takes from the catalog (engine/catalog.py `read_catalog`); keeps its counters."""
        found = read_catalog(self.store)
        self._counters = found.counters
        return found

    def start(self, rewrite: bool) -> None:
        """The streams are registered: the copy is rewritten now if the start found it stale, and in the
        background whenever many marks gather from here on."""
        if rewrite:
            self.rewrite()
        self.store.on_marks = self.rewrite_in_background

    def close(self) -> None:
        """Waits for a background rewrite, then writes the copy once more (every stream is flushed)."""
        if self.rewriter is not None:
            self.rewriter.join()
        if self.enabled:
            self.rewrite()

    def rewrite(self) -> None:
        """Rewrites the copy. The copy is a cache: a failure leaves the marks, and the next start reads
        the marked streams' files."""
        try:
            started = time.monotonic()
            if self.store.rewrite(self._items):
                log.info("catalog copy of %d streams written in %.2fs", len(self._entries()), time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - a cache: the marks stay for the next start
            log.warning("the catalog copy was not rewritten (the next start reads the marked streams): %s", exc)

    def rewrite_in_background(self) -> None:
        """Many marks gathered (streams made or changed): the copy is rewritten off the caller's thread."""
        with self._rewriter_lock:  # not the registry's lock: a consumer change calls this under its stream's lock
            if self.rewriter is not None and self.rewriter.is_alive():
                return
            self.rewriter = threading.Thread(target=self.rewrite, name="jetlake-catalog", daemon=True)
            self.rewriter.start()

    def _items(self, marked: set[str]) -> dict[str, CatalogItem]:
        """The copy to write: the marked streams from their files again, the others from memory (an
        unopened stream's record, consumer names and counters; an opened one's config, consumers and
        counters now)."""
        items: dict[str, CatalogItem] = {}
        for name, entry in self._entries():
            stream = entry.stream
            if stream is None:
                assert entry.record is not None
                items[name] = CatalogItem(entry.record.to_json(), self._consumers.unrestored(name),
                                          self._counters.get(name))
            elif isinstance(stream.store, DeltaStore) and not stream.deleted:
                with stream.lock:
                    consumers = {c.name: acts_alone(c) for c in stream.consumers.values()}
                    state = stream_counters(stream)
                items[name] = CatalogItem(record_json(stream), consumers, state)
        for name in marked:
            item = self.store.read_stream(name)
            if item is None:
                items.pop(name, None)
                continue
            previous = items.get(name)
            item.record = StreamRecord.from_json(item.record).to_json()
            item.state = previous.state if previous is not None else None
            items[name] = item
        return items

    def stored_counters(self, name: str, entry: CatalogEntry, tombstones: TombstoneView | None) -> dict[str, int] | None:
        """An unopened stream's counters from the copy, if nothing changed its table or its tombstones
        since they were taken (two HEADs, and `tombstones`, the view read at start); else None."""
        counted, record = self._counters.get(name), entry.record
        if counted is None or record is None or tombstones is None:
            return None
        if tombstones.for_stream(record.stream_id).lsn != counted["tombstone_lsn"]:
            return None
        if not is_latest_version(self.store.layout.stream_table_location(name), counted["table_version"]):
            return None
        return counted


def acts_alone(consumer: Consumer) -> bool:
    """engine/catalog_store.py's `acts_alone` of a live consumer."""
    config = consumer.config
    return bool(consumer.ephemeral or config.deliver_subject or config.inactive_threshold)


def stream_counters(stream: Stream) -> dict[str, int] | None:
    """A stream's counters for the copy, with the table version and committed tombstone lsn they hold
    at (taken under the stream's lock). A message or removal the index holds beyond them is in the
    stream's log until its commit, which moves one of the two: either opens the stream at the next start
    (a log to replay; or counters no longer current, `CatalogUpkeep.stored_counters`)."""
    store = stream.store
    if not isinstance(store, DeltaStore) or store.table_version is None:
        return None
    return {"messages": stream.index.msgs, "bytes": stream.index.bytes, "table_version": store.table_version,
            "tombstone_lsn": store.tombstone_lsn}
