"""Publish routing: each message goes to the stream whose subjects capture it, through that stream's
group commit, after the backpressure lets it in (engine/backpressure.py); the flusher is woken once a
stream's log holds enough to commit. The no-wait variants let an event loop publish without a thread
hand-off when nothing has to wait. Counterpart: server/stream.go `processInboundJetStreamMsg` and the
account's subject routing in server/jetstream.go.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine import errors
from engine.backpressure import Backpressure
from engine.catalog import CatalogEntry
from engine.flusher import Flusher
from engine.messages import InboundMessage, PlainBatch, PublishAnswer, PublishResult
from engine.options import EngineOptions
from engine.stream import Stream
from engine.stream_registry import StreamRegistry
from engine.subjects import is_valid_publish_subject, matches_mask, valid_publish_mask

_ROUTE_AS_COLUMN = 32  # a batch of more distinct subjects is routed and validated as a column


class PublishRouter:
    """Routes an account's publishes to its streams (see the module docstring); `notify(name)` wakes
    the waits on a stream that took messages."""

    def __init__(self, options: EngineOptions, registry: StreamRegistry, backpressure: Backpressure,
                 flusher: Flusher, notify: Callable[[str], None]) -> None:
        self._options = options
        self._registry = registry
        self._backpressure = backpressure
        self._flusher = flusher
        self._notify = notify

    def publish(self, messages: list[InboundMessage]) -> list[PublishResult]:
        """Publishes in order; each result is a PubAck or the error for that message."""
        results: list[PublishResult | None] = [None] * len(messages)
        groups: dict[str, tuple[CatalogEntry, list[int], list[InboundMessage]]] = {}
        last_subject, last_entry = None, None
        for i, msg in enumerate(messages):
            if msg.subject != last_subject:
                last_subject = msg.subject
                last_entry = (self._registry.entry_for_subject(msg.subject)
                              if is_valid_publish_subject(msg.subject) else None)
            if last_entry is None:
                valid = is_valid_publish_subject(msg.subject)
                results[i] = errors.no_stream_matches_subject() if valid else errors.bad_request(
                    f"invalid publish subject {msg.subject[:100]!r}"
                )
                continue
            group = groups.get(last_entry.stream.name)
            if group is None:
                group = groups[last_entry.stream.name] = (last_entry, [], [])
            group[1].append(i)
            group[2].append(msg)
        if len(groups) == 1 and all(r is None for r in results):
            entry, _, msgs = next(iter(groups.values()))
            self._admit(entry)
            out = entry.commit.submit(msgs)
            self._maybe_wake_flusher(entry)
            return out
        for entry, positions, msgs in groups.values():
            self._admit(entry)
            for pos, result in zip(positions, entry.commit.submit(msgs), strict=True):
                results[pos] = result
            self._maybe_wake_flusher(entry)
        return [r for r in results if r is not None]

    def _maybe_wake_flusher(self, entry: CatalogEntry) -> None:
        self._notify(entry.stream.name)
        if entry.stream.store.pending_bytes() >= min(self._options.flush_bytes, self._backpressure.wake_bytes):
            self._flusher.wake()

    def _admit(self, entry: CatalogEntry) -> None:
        """Before a publish: waits while the stream holds its bound of uncommitted messages in memory."""
        self._backpressure.admit(entry.stream, self._flushing, self._flusher.wake)

    def _flushing(self, stream: Stream) -> bool:
        """The flusher runs and the stream's commits succeed: a wait for them ends (see Backpressure)."""
        health = self._flusher.health.get(stream.name)
        return self._flusher.running and stream.failure is None and stream.unavailable is None and (
            health is None or not health.consecutive_failures)

    def publish_nowait(self, messages: list[InboundMessage]) -> list[PublishResult] | None:
        """Publishes at once if that needs no waiting: one stream, its lock free, no fsync to wait for.

        Lets an event loop publish small messages without a thread hand-off; None means "use `publish`".
        """
        if self._options.sync_always or not messages:
            return None
        subject = messages[0].subject
        if (len(messages) > 1 and any(m.subject != subject for m in messages)) or not is_valid_publish_subject(subject):
            return None
        entry = self._registry.entry_for_subject(subject, open_=False)
        if entry is None or entry.stream is None or self._backpressure.over(entry.stream):
            return None  # none, not opened yet (opening waits on the disk), or publishers must wait
        if not entry.stream.lock.acquire(blocking=False):
            return None  # busy
        try:
            results = entry.stream.process([messages])[0]
        finally:
            entry.stream.lock.release()
        self._maybe_wake_flusher(entry)
        return results

    def publish_batch(self, batch: PlainBatch) -> PublishAnswer:
        """Publishes a columnar batch of messages without headers; each result as `publish` gives it.

        A batch whose subjects all go to one stream goes through that stream's group commit as columns
        (answered by an `AckRun` when every message is accepted); any other batch is published message
        by message, with the same outcome.
        """
        entry = self._plain_entry(batch)
        if entry is None:
            return self.publish(batch.messages())
        self._admit(entry)
        out: PublishAnswer = entry.commit.submit(batch)  # type: ignore[arg-type, assignment]
        self._maybe_wake_flusher(entry)
        return out

    def publish_batch_nowait(self, batch: PlainBatch) -> PublishAnswer | None:
        """`publish_batch` at once if that needs no waiting (as `publish_nowait`); None means "use `publish_batch`"."""
        if self._options.sync_always:
            return None
        entry = self._plain_entry(batch, open_=False)
        if entry is None or entry.stream is None or self._backpressure.over(entry.stream):
            return None
        if not entry.stream.lock.acquire(blocking=False):
            return None
        try:
            out = entry.stream.process([batch])[0]
        finally:
            entry.stream.lock.release()
        self._maybe_wake_flusher(entry)
        return out

    def _plain_entry(self, batch: PlainBatch, open_: bool = True) -> CatalogEntry | None:
        """The one stream every subject of a batch goes to; None if there are several, none or a bad subject.

        A batch of many distinct subjects is checked as a column: the stream of its first subject must
        capture all of them (streams' subjects never overlap, so no other stream can), and all must be
        valid literal subjects. One subject at a time, a million distinct subjects cost ~20 µs each in
        validation, routing and their caches."""
        distinct = set(batch.subjects)
        if len(distinct) > _ROUTE_AS_COLUMN:
            first = batch.subjects[0]
            entry = self._registry.entry_for_subject(first, open_) if is_valid_publish_subject(first) else None
            if entry is None:
                return None
            column = batch.subject_column()
            captured = matches_mask(list(entry.subjects), column)
            return entry if bool((captured & valid_publish_mask(column)).all()) else None
        found: CatalogEntry | None = None
        for subject in distinct:
            entry = self._registry.entry_for_subject(subject, open_) if is_valid_publish_subject(subject) else None
            if entry is None or (found is not None and entry is not found):
                return None
            found = entry
        return found

    def throttle(self, stream: Stream, timeout: float = 120.0) -> None:
        """Waits while the stream's unflushed log holds twice `flush_bytes`: a large upload cannot
        outrun the flusher and fill the memory. Gives up waiting (and lets the write through) after
        `timeout` seconds, e.g. while a Spark job holds the table's lease."""
        limit = 2 * self._options.flush_bytes
        deadline = time.monotonic() + timeout
        while stream.store.pending_bytes() >= limit and self._flusher.running and time.monotonic() < deadline:
            self._flusher.wake()
            time.sleep(0.005)
