"""A stream's reads: a message by sequence, by subject, by time, many at once, the live sequences,
and the stream's state (STREAM.INFO). Each applies `max_age` first, so an expired message is never
read. Counterpart: server/stream.go's getMsg and state, and the paging of STREAM.INFO's subjects.

A layer of engine/stream.py's `Stream`, above its limits (engine/stream_limits.py)."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from engine import errors
from engine.clock import Clock
from engine.store.base import StoredMessage, StreamStore
from engine.stream_limits import StreamLimits
from engine.subjects import is_valid_subject

SUBJECTS_PAGE = 100_000  # nats-server's JSMaxSubjectDetails


class StreamReads(StreamLimits):
    """Every method takes the stream's lock."""

    store: StreamStore
    clock: Clock
    lock: threading.RLock

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def get(self, seq: int) -> StoredMessage:
        if seq <= 0:
            raise errors.bad_request("a message sequence must be a positive integer")
        with self.lock:
            self._expire(self.clock.now_ns())
            msg = self.store.load(seq, self.index) if seq > 0 else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def last_by_subject(self, subject: str) -> StoredMessage:
        check_filter(subject)
        with self.lock:
            self._expire(self.clock.now_ns())
            seq = self.index.last_seq_for(subject)
            literal = "*" not in subject and ">" not in subject
            msg = self.store.load(seq, self.index, subject if literal else None) if seq else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def next_by_subject(self, subject: str, start: int) -> StoredMessage:
        check_filter(subject)
        with self.lock:
            self._expire(self.clock.now_ns())
            seq = self.index.next_seq_for(subject, max(start, 1))
            msg = self.store.load(seq, self.index) if seq else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def at_or_after_time(self, ts: int, subject: str | None = None) -> StoredMessage:
        """The first message published at or after `ts` (on `subject` when given): MSG.GET's `start_time`."""
        if subject is not None:
            check_filter(subject)
        with self.lock:
            self._expire(self.clock.now_ns())
            seq = self.index.seq_at_or_after_time(ts)
            if seq and subject is not None:
                seq = self.index.next_seq_for(subject, seq)
            msg = self.store.load(seq, self.index) if seq else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def load_many(self, seqs: list[int] | np.ndarray) -> list[StoredMessage]:
        """The live messages among `seqs`, in the order given (removed ones are left out)."""
        wanted = [int(s) for s in seqs]
        with self.lock:
            found = self.store.load_many(sorted(wanted), self.index)
        return [found[s] for s in wanted if s in found]

    def last_seqs(self, filter_: str) -> np.ndarray:
        """The last live sequence per subject matching `filter_`, ascending, after `max_age`."""
        check_filter(filter_)
        with self.lock:
            self._expire(self.clock.now_ns())
            return self.index.last_seqs(filter_)

    def live_seqs(self, filter_: str | None = None, start: int = 0) -> np.ndarray:
        """Live sequences ≥ `start` on `filter_`, ascending, after `max_age`."""
        if filter_ is not None:
            check_filter(filter_)
        with self.lock:
            self._expire(self.clock.now_ns())
            return self.index.live_seqs(filter_, start=start)

    def state(self, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        """JetStream's StreamState; with `subjects_filter`, a page of the matching subjects' counts
        (sorted by name, from `offset`, at most SUBJECTS_PAGE) and `subjects_total`, as nats-server's
        STREAM.INFO pages them."""
        with self.lock:
            self._expire(self.clock.now_ns())
            ix = self.index
            state: dict[str, Any] = {
                "messages": ix.msgs,
                "bytes": ix.bytes,
                "first_seq": ix.first_seq,
                "first_ts": ix.first_ts,
                "last_seq": ix.last_seq,
                "last_ts": ix.last_ts,
                "num_subjects": ix.num_subjects,
                "num_deleted": ix.num_deleted,
                "consumer_count": self.consumer_count,
            }
            if subjects_filter:
                subjects, total = ix.subjects_page(subjects_filter, offset, SUBJECTS_PAGE)
                state["subjects_total"] = total
                if subjects:
                    state["subjects"] = subjects
            return state


def check_filter(subject: str) -> None:
    if not is_valid_subject(subject):
        raise errors.bad_request(f"invalid subject filter {subject!r}")
