"""A stream: JetStream's publish checks, limits, retention of messages, purge, get and delete.

The state machine is synchronous and deterministic, driven by an injected clock; the stream's lock
serialises it. `process` takes the messages of one group commit, checks each in JetStream's order
(sealed, expected stream, duplicate window, expected last sequence / subject sequence / msg id,
rollup, size, limits with discard new), assigns sequences to the accepted ones, applies limits with
discard old and rollups, and hands the store one append of messages and removals, so a refused
publish takes no sequence and a PubAck always follows the log write. Counterpart: server/stream.go
(processJetStreamMsg, purge, removeMsg) and the limit handling of server/memstore.go.

`Stream` holds the state, the lock, the one write to the store, recovery and config updates, and is
built in layers, one concept each, all on the one object (the publish path stays plain method calls
on it): the limits and the removal primitives (engine/stream_limits.py), the publish checks
(engine/publish_checks.py) and the publish path above them (engine/publisher.py), the reads
(engine/stream_reads.py) and the removals asked for (engine/stream_removals.py). The duplicate
window is engine/dedup_window.py's.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from engine import errors
from engine.accepted import Accepted
from engine.clock import Clock
from engine.config import StreamConfig
from engine.dedup_window import DuplicateWindow
from engine.index import MessageIndex
from engine.messages import DEFAULT_MAX_PAYLOAD, PublishAnswer, PublishRequest
from engine.publish_checks import Quota as Quota
from engine.publisher import Publisher
from engine.store.base import Removal, StreamStore
from engine.store.rows import RowGroup
from engine.stream_reads import SUBJECTS_PAGE as SUBJECTS_PAGE, StreamReads
from engine.stream_removals import StreamRemovals

if TYPE_CHECKING:
    from engine.consumer import Consumer


class Stream(StreamRemovals, StreamReads, Publisher):
    """One stream's state. Every public method takes the stream's lock."""

    def __init__(
        self,
        config: StreamConfig,
        created_ns: int,
        stream_id: str,
        store: StreamStore,
        clock: Clock,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self.config = config
        self.created_ns = created_ns
        self.stream_id = stream_id
        self.store = store
        self.clock = clock
        self.max_payload = max_payload
        self.index: MessageIndex = store.new_index()
        self.lock = threading.RLock()
        self._window = DuplicateWindow()
        self.last_msg_id: str | None = None
        self.consumers: dict[str, Consumer] = {}
        self.deleted = False
        self.failure: str | None = None  # set: writes are refused (503)
        self.unavailable: str | None = None  # set: every request is refused (503): memory is not what the disk holds
        self.recovered = True  # False: its recovery failed at start; only a restart loads it
        self.quota: Quota | None = None  # set when the account limits its bytes: publishes are then checked one by one

    @property
    def name(self) -> str:
        return self.config.name

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> None:
        with self.lock:
            since = self.clock.now_ns() - self.config.duplicate_window
            recovered = self.store.recover(since)
            assert recovered.index is not None
            self.index = recovered.index
            for msg_id, seq, ts in recovered.msg_ids:
                self._window.remember(msg_id, seq, ts)
            self.last_msg_id = recovered.last_msg_id
            if self.config.first_seq and self.index.last_seq == 0:
                self.index.skip_to(self.config.first_seq)
            self._expire(self.clock.now_ns())

    def reload(self, store: StreamStore) -> None:
        """Forgets the in-memory state and rebuilds it from the disk through a fresh `store`: after a
        failed log write, whose messages and removals memory had already applied. Writes stay refused
        (`failure`) until the flusher finds the log writable again."""
        with self.lock:
            old, self.store = self.store, store
            try:
                old.close()
            except OSError:
                pass  # its segment is re-read from disk below; a failed close loses nothing acknowledged
            self.index = store.new_index()
            self._window.clear()
            self.last_msg_id = None
            self.recover()
            self.unavailable = None

    def start_at_first_seq(self) -> None:
        """A new stream with `first_seq`: its first message gets that sequence, durably."""
        with self.lock:
            if self.config.first_seq and self.config.first_seq > 1:
                self.index.skip_to(self.config.first_seq)
                self._store_append([], [Removal([], "first_seq", last_seq=self.index.last_seq, ts=self.clock.now_ns())])

    # -- publish (engine/publisher.py) ----------------------------------------------------------

    def process(self, groups: list[PublishRequest]) -> list[PublishAnswer]:
        """Checks and stores the messages of one group commit; one store append for all of them."""
        with self.lock:
            self._check_writable()
            refusal = self.store.refusal()
            if refusal is not None:
                raise errors.UnavailableError(f"insufficient resources: stream {self.name} is not flushed ({refusal})")
            now = self.clock.now_ns()
            accepted = Accepted()
            self._expire(now, accepted)
            plain = self._plain_path_allowed()
            results = [self._process_group(group, plain, now, accepted) for group in groups]
            self._append(accepted, now)
            if self.config.storage == "memory":
                self.store.forget_below(self.index.first_seq)  # type: ignore[attr-defined]
            return results

    def _check_writable(self) -> None:
        if self.deleted:
            raise errors.StreamNotFoundError()
        if self.unavailable is not None:
            raise errors.UnavailableError(f"stream {self.name} is unavailable: {self.unavailable}")
        if self.failure is not None:
            raise errors.store_failed(f"stream {self.name} refuses writes: {self.failure}")

    def _store_append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        """Every write to the store. A failed log write leaves the log as it was (wal.py) but memory
        ahead of it: the stream refuses everything until the flusher has re-read it (`reload`)."""
        if self.deleted:
            raise errors.StreamNotFoundError()
        cause: OSError | None = None
        if self.failure is None:
            try:
                self.store.append(groups, removals)
                return
            except OSError as exc:
                cause = exc
                self.failure = f"write-ahead log write failed: {exc}"
        self.unavailable = self.failure
        raise errors.store_failed(f"stream {self.name} refuses writes: {self.failure}") from cause

    def _append(self, acc: Accepted, now: int) -> None:
        acc.close()
        self._store_append(acc.groups, self._removals(acc.removed, now))

    def dedup_window(self) -> tuple[list[tuple[str, int, int]], str | None]:
        """The duplicate window's (msg_id, seq, ts) in sequence order and the last msg id: what an index
        snapshot keeps so that a restart finds them without reading the table."""
        return self._window.entries(), self.last_msg_id

    # -- config -------------------------------------------------------------------------------

    def apply_config(self, config: StreamConfig) -> None:
        """An update: lower limits take effect at once, as in JetStream."""
        with self.lock:
            self.config = config
            if self.failure is not None:
                return  # the lower limits apply after the stream is writable again, at its next publish
            acc = Accepted()
            now = self.clock.now_ns()
            self._expire(now, acc)
            self._enforce_limits(None, acc)
            self._record_removals(acc.removed, now)
            if self.config.duplicate_window:
                self._window.expire(now, self.config.duplicate_window)

    # -- expiry (engine/stream_limits.py); reads are engine/stream_reads.py's -------------------

    def tick(self) -> None:
        with self.lock:
            self._expire(self.clock.now_ns())

    def expire_now(self) -> None:
        """`max_age` before a read (the caller holds the lock)."""
        self._expire(self.clock.now_ns())
