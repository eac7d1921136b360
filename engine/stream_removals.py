"""The removals a stream is asked for: a message deleted (or erased), a purge, the messages a
retention policy lets go (interest, workqueue) and GDPR erasure, each recorded as tombstones.
Counterpart: server/stream.go's purge and removeMsg. What leaves unasked (limits, `max_age`) is
engine/stream_limits.py's, whose primitives these use.

A layer of engine/stream.py's `Stream`, above its limits."""

from __future__ import annotations

import threading

import numpy as np

from engine import errors
from engine.clock import Clock
from engine.dedup_window import DuplicateWindow
from engine.store.base import Removal, StreamStore
from engine.stream_limits import StreamLimits
from engine.stream_reads import check_filter
from engine.subjects import FWC


class StreamRemovals(StreamLimits):
    """Every method but `forget_erased` takes the stream's lock."""

    store: StreamStore
    clock: Clock
    lock: threading.RLock
    last_msg_id: str | None
    _window: DuplicateWindow

    def delete_message(self, seq: int, erase: bool) -> None:
        with self.lock:
            if self.config.sealed:
                raise errors.sealed()
            if self.config.deny_delete:
                raise errors.msg_delete_failed("message delete not permitted")
            self._expire(self.clock.now_ns())
            if seq <= 0:
                raise errors.msg_delete_failed("no message found")  # nats-server's answer to a delete of 0
            if seq > self.index.last_seq:
                raise errors.msg_delete_failed("stream store EOF")
            if not self.index.is_live(seq):
                raise errors.sequence_not_found(seq)
            self._check_writable()
            self._record_removals({"erase" if erase else "delete": self._remove(np.array([seq], np.int64))},
                                  self.clock.now_ns(), erase)

    def purge(self, filter_: str | None = None, seq: int = 0, keep: int = 0) -> int:
        """JetStream's PurgeEx: all, by filter (wildcards), keeping the newest `keep`, or below `seq`."""
        if seq < 0 or keep < 0:
            raise errors.bad_request("purge sequence and keep must not be negative")
        if seq and keep:
            raise errors.bad_request("purge sequence and keep are mutually exclusive")
        if filter_:
            check_filter(filter_)
        with self.lock:
            if self.config.sealed:
                raise errors.sealed()
            if self.config.deny_purge:
                raise errors.purge_failed("stream purge not permitted")
            self._check_writable()
            now = self.clock.now_ns()
            self._expire(now)
            ix = self.index
            last_before = ix.last_seq
            if not filter_ or filter_ == FWC:
                if seq == 1:
                    return 0
                if seq > 1:
                    purged, ranges = self._remove_through(seq - 1)
                    if seq > ix.last_seq + 1:
                        ix.skip_to(seq)
                elif keep > 0:
                    if keep >= ix.msgs:
                        return 0
                    purged, ranges = self._remove_through(ix.last_seq - keep)
                else:
                    purged, ranges = self._remove_through(ix.last_seq)
            else:
                seqs = ix.live_seqs(filter_, stop=seq if seq > 1 else None)
                if keep > 0:
                    seqs = seqs[: max(len(seqs) - keep, 0)]
                purged, ranges = len(seqs), self._remove(seqs)
            if purged or ix.last_seq != last_before:
                self._record_removals({"purge": ranges} if purged else {}, now)
                if not purged:
                    self._store_append([], [Removal([], "purge", False, ix.last_seq, now)])
            return purged

    def remove_seqs(self, seqs: np.ndarray, reason: str) -> int:
        """Removes live messages for a retention policy (interest, workqueue); recorded as tombstones."""
        with self.lock:
            seqs = seqs[self.index.live_mask(seqs)] if len(seqs) else seqs
            if not len(seqs):
                return 0
            self._check_writable()
            self._record_removals({reason: self._remove(seqs)}, self.clock.now_ns())
            return len(seqs)

    def erase_seqs(self, seqs: np.ndarray) -> int:
        """GDPR erasure: the live messages among `seqs` leave every read at once, recorded as tombstones
        with reason "erase" and erase=True for the erase job. Not refused by `sealed` or `deny_delete`."""
        with self.lock:
            seqs = np.unique(np.asarray(seqs, np.int64))
            seqs = seqs[self.index.live_mask(seqs)] if len(seqs) else seqs
            if not len(seqs):
                return 0
            self._check_writable()
            self._record_removals({"erase": self._remove(seqs)}, self.clock.now_ns(), erase=True)
            self.index.forget_dead_subjects()  # an erased subject's name leaves memory, and the snapshot
            self.store.drop_snapshot()
            return len(seqs)

    def forget_erased(self, seqs: np.ndarray) -> None:
        """GDPR erasure, in memory: the erased messages' ids leave the duplicate window (a re-publish
        of an erased message is a new message) and the store drops its in-memory copies. The caller
        holds the lock; `seqs` may include messages removed earlier (purged, deleted, limits)."""
        erased = {int(s) for s in seqs}
        self._window.forget(erased)
        if self.index.last_seq in erased:
            self.last_msg_id = None
        self.store.forget(np.asarray(sorted(erased), np.int64))

    # -- the hook: whether the stream takes writes (engine/stream.py) --------------------------

    def _check_writable(self) -> None:
        raise NotImplementedError
