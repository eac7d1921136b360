"""In-memory message storage: the whole store of a memory stream, the recent-message cache of a file stream.

Row groups are kept in sequence order; within a group sequences are consecutive (a group commit
assigns them in a row), so a lookup is a bisect and an offset.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import numpy as np

from engine.index import MessageIndex
from engine.store.base import Recovered, Removal, StoredMessage
from engine.store.layout import Partitioner
from engine.store.rows import RowGroup, blanked


class MessageBuffer:
    def __init__(self, cache_bytes: int | None = None) -> None:
        self.cache_bytes = cache_bytes
        self._firsts: list[int] = []
        self._batches: list[RowGroup] = []
        self.nbytes = 0
        self.flushed_upto = 0

    def add(self, rows: RowGroup) -> None:
        self._firsts.append(rows.first_seq)
        self._batches.append(rows)
        self.nbytes += rows.nbytes

    def get(self, seq: int) -> StoredMessage | None:
        i = bisect.bisect_right(self._firsts, seq) - 1
        if i < 0:
            return None
        rows = self._batches[i]
        row = seq - self._firsts[i]
        if row >= len(rows):
            return None
        return rows.message(row)

    def get_many(self, seqs: list[int]) -> tuple[dict[int, StoredMessage], list[int]]:
        """`get` of ascending sequences: (those found, those not here), one lookup per row group."""
        found: dict[int, StoredMessage] = {}
        missing: list[int] = []
        firsts, i, n = self._firsts, 0, len(seqs)
        while i < n:
            seq = seqs[i]
            g = bisect.bisect_right(firsts, seq) - 1
            rows = self._batches[g] if g >= 0 else None
            end = firsts[g] + len(rows) if rows is not None else 0  # one past the group's last
            if rows is None or seq >= end:
                missing.append(seq)
                i += 1
                continue
            j = bisect.bisect_left(seqs, end, i)
            first = firsts[g]
            found.update(zip(seqs[i:j], rows.messages([s - first for s in seqs[i:j]])))
            i = j
        return found, missing

    def unflushed(self) -> list[RowGroup]:
        """Row groups not yet in the table (flushes take whole groups)."""
        return self._batches[bisect.bisect_right(self._firsts, self.flushed_upto) :]

    def mark_flushed(self, upto_seq: int) -> None:
        self.flushed_upto = max(self.flushed_upto, upto_seq)
        self._evict()

    def drop_flushed(self) -> int:
        """Forgets every batch the table holds whole (a write load ended: reads find those messages in the
        table), as nats-server drops an idle block's cache. A buffer without a budget is a memory stream's
        whole store and keeps everything. Returns the bytes dropped."""
        if self.cache_bytes is None:
            return 0
        before = self.nbytes
        while self._batches and self._batches[0].last_seq <= self.flushed_upto:
            self._pop_oldest()
        return before - self.nbytes

    def drop_below(self, first_seq: int) -> None:
        """Forgets batches that hold only sequences below the stream's first (purged or expired)."""
        while self._batches and self._batches[0].last_seq < min(first_seq, self.flushed_upto + 1):
            self._pop_oldest()

    def _evict(self) -> None:
        if self.cache_bytes is None:
            return
        while self._batches and self.nbytes > self.cache_bytes:
            if self._batches[0].last_seq > self.flushed_upto:
                return
            self._pop_oldest()

    def _pop_oldest(self) -> None:
        rows = self._batches.pop(0)
        self._firsts.pop(0)
        self.nbytes -= rows.nbytes

    def clear(self) -> None:
        self._firsts.clear()
        self._batches.clear()
        self.nbytes = 0

    def matching(self, match: Callable[[str], bool], with_data: bool = False) -> dict[int, bytes | None]:
        """Every buffered message whose subject satisfies `match`, live or not: seq -> data (None
        unless asked for). Unflushed removed messages are only here and in the log."""
        found: dict[int, bytes | None] = {}
        for rows in self._batches:
            subjects = rows.subjects
            hits = {s for s in set(subjects) if s and match(s)}
            for row, subject in enumerate(subjects):
                if subject in hits:
                    found[rows.first_seq + row] = rows.message(row).data if with_data else None
        return found

    def blank(self, seqs: np.ndarray) -> int:
        """Empties the buffered copies of erased messages (see `rows.blanked`); returns how many."""
        seqs = np.unique(np.asarray(seqs, np.int64))
        count = 0
        for i, rows in enumerate(self._batches):
            inside = seqs[(seqs >= rows.first_seq) & (seqs <= rows.last_seq)]
            if len(inside):
                self._batches[i] = blanked(rows, inside - rows.first_seq)
                count += len(inside)
        return count


class MemoryStore:
    """`storage: memory`: every message in memory, nothing on disk, gone after a restart."""

    def __init__(self, partition_tokens: int = 0) -> None:
        self.buffer = MessageBuffer(cache_bytes=None)
        self.partitioner = Partitioner(partition_tokens)

    def new_index(self) -> MessageIndex:
        return MessageIndex()

    def append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        for rows in groups:
            if len(rows):
                self.buffer.add(rows)

    def load(self, seq: int, index: MessageIndex, subject: str | None = None) -> StoredMessage | None:
        if not index.is_live(seq):
            return None
        return self.buffer.get(seq)

    def load_many(self, seqs: list[int], index: MessageIndex) -> dict[int, StoredMessage]:
        found = {}
        for seq in seqs:
            msg = self.load(seq, index)
            if msg is not None:
                found[seq] = msg
        return found

    def forget(self, seqs: np.ndarray) -> None:
        """Erased messages leave the memory at once."""
        self.buffer.blank(seqs)

    def forget_below(self, first_seq: int) -> None:
        self.buffer.flushed_upto = first_seq - 1
        self.buffer.drop_below(first_seq)

    def drop_snapshot(self) -> None:
        """Nothing is persisted."""

    def recover(self, msg_id_since_ns: int) -> Recovered:
        return Recovered(index=self.new_index())

    def pending_bytes(self) -> int:
        return 0

    def refusal(self) -> str | None:
        return None

    def log_bytes(self) -> int:
        return 0

    def unflushed_age(self, now: float | None = None) -> float:
        return 0.0

    def close(self) -> None:
        self.buffer.clear()

    def destroy(self) -> None:
        self.buffer.clear()
