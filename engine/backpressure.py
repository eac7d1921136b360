"""Backpressure on publishers: a stream's messages held in memory until their commit stay under a bound.

A file stream keeps each accepted message in memory (its row group in the buffer) until the flusher
has committed it to the table (a commit hands it to delta-rs a slice at a time, store/flush_commits.py). When
publishers outrun the flusher (a 2-core machine at 200,000+ messages a second, each commit slower
than the one before as its job grows) that memory follows the ingest rate, not the configuration:
a 100 M-message load peaked at 1 GB. Here, once a stream holds `max_pending_bytes` (what waits in its
log and what is being committed), a publish waits for the commit under way to finish before it is
appended; publishers slow to the flusher's pace and memory stays near the bound. The flusher is
woken at half the bound, so one job commits while the next fills.

Waiting is flow control, not a refusal: nothing is refused or dropped here, and a message is
acknowledged only once it is in the log, as before. A stream whose commits fail (a Spark job holds
its lease, a full disk) is not waited on: its log's own bound (engine/store/backlog.py) refuses with
a 503 instead. A wait that outlasts `max_wait` seconds lets the publish through to that bound too.
Counterpart: nats-server stalls a fast producer whose pending bytes exceed its limit
(`stalledWait` in server/client.go) rather than buffering without end.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.store.delta import DeltaStore
from engine.stream import Stream

DEFAULT_MAX_PENDING_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_WAIT = 30.0
_POLL = 0.05  # a commit's end is notified; this bounds a missed wake-up


class Backpressure:
    """The bound of a stream's uncommitted messages in memory, and the wait of publishers past it."""

    def __init__(self, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES, max_wait: float = DEFAULT_MAX_WAIT) -> None:
        self.max_pending_bytes = max_pending_bytes
        self.max_wait = max_wait
        self.waits = 0  # publishes that waited
        self.wait_seconds = 0.0
        self.timeouts = 0  # waits that gave up and let the publish through to the log's bound

    @property
    def wake_bytes(self) -> int:
        """Uncommitted bytes at which the flusher is woken early: half the bound."""
        return max(self.max_pending_bytes // 2, 1)

    def over(self, stream: Stream) -> bool:
        """The stream holds its bound in memory: a publish now would have to wait."""
        store = stream.store
        return isinstance(store, DeltaStore) and store.held_bytes() >= self.max_pending_bytes

    def admit(self, stream: Stream, flushing: Callable[[Stream], bool], wake: Callable[[], None]) -> None:
        """Waits while `stream` holds its bound and its commits progress (`flushing`); `wake` the flusher."""
        if not self.over(stream) or not flushing(stream):
            return
        store = stream.store
        assert isinstance(store, DeltaStore)
        started = time.monotonic()
        deadline = started + self.max_wait
        self.waits += 1
        while self.over(stream) and flushing(stream):
            now = time.monotonic()
            if now >= deadline:
                self.timeouts += 1
                break
            wake()
            store.wait_drained(min(_POLL, deadline - now))
        self.wait_seconds += time.monotonic() - started
