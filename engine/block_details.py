"""The rows of the index's blocks (their details): sequence, subject id, size and time of every stored row.

A block's detail is pinned in memory while any of its rows is unflushed; once the table holds them it
moves to a byte-bounded LRU cache, and a block whose detail is in neither is read back from the table
through the store's `loader`. A stream without a table (no loader) keeps every detail pinned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.seq_ranges import seq_ranges
from engine.seqset import SeqSet
from engine.subject_table import SubjectTable

# What a store hands back for a range of sequences: the rows present in its table, in sequence order.
Rows = tuple[np.ndarray, Any, np.ndarray, np.ndarray]  # seqs, subjects (a list or an Arrow string column), sizes, ts
Loader = Callable[[int, int], Rows]
# the first stored sequence in [lo, hi] stamped at or after a time that a liveness mask keeps
TimeSeeker = Callable[[int, int, int, Callable[[np.ndarray], np.ndarray]], int]


@dataclass(slots=True)
class Detail:
    """The rows of one block that are (or were, until removed) stored: sorted by sequence."""

    seqs: np.ndarray
    sids: np.ndarray
    sizes: np.ndarray
    ts: np.ndarray
    n: int = 0  # rows in use (the arrays of an open block have room to grow)

    @classmethod
    def empty(cls, capacity: int = 16) -> Detail:
        return cls(np.zeros(capacity, np.int64), np.zeros(capacity, np.int32), np.zeros(capacity, np.int64),
                   np.zeros(capacity, np.int64))

    @property
    def nbytes(self) -> int:
        return 28 * len(self.seqs) + 64

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = self.n
        return self.seqs[:n], self.sids[:n], self.sizes[:n], self.ts[:n]

    def extend(self, seqs: np.ndarray, sids: np.ndarray, sizes: np.ndarray, ts: np.ndarray,
               most: int | None = None) -> None:
        """Appends rows; the arrays double when full, but never past `most` (the block's rows): runs of a
        thousand took a block's 8,192 rows to room for 16,256, 28 bytes a message of slack."""
        need = self.n + len(seqs)
        if need > len(self.seqs):
            capacity = max(need, 2 * len(self.seqs) if most is None else min(2 * len(self.seqs), most))
            for name in ("seqs", "sids", "sizes", "ts"):
                old = getattr(self, name)
                grown = np.zeros(capacity, old.dtype)
                grown[: self.n] = old[: self.n]
                setattr(self, name, grown)
        end = self.n + len(seqs)
        self.seqs[self.n : end] = seqs
        self.sids[self.n : end] = sids
        self.sizes[self.n : end] = sizes
        self.ts[self.n : end] = ts
        self.n = end

    def append(self, seq: int, sid: int, size: int, ts: int) -> None:
        n = self.n
        if n == len(self.seqs):
            self.extend(np.array([seq], np.int64), np.array([sid], np.int32), np.array([size], np.int64), np.array([ts], np.int64))
            return
        self.seqs[n] = seq
        self.sids[n] = sid
        self.sizes[n] = size
        self.ts[n] = ts
        self.n = n + 1

    def keep(self, mask: np.ndarray) -> None:
        """Drops the rows where `mask` is False (they never reached the table)."""
        seqs, sids, sizes, ts = (a[mask] for a in self.view())
        self.seqs, self.sids, self.sizes, self.ts, self.n = seqs, sids, sizes, ts, len(seqs)


class BlockDetails:
    """Every block's detail, by block number: pinned, cached or read back (see the module's docstring).

    `removed` is the index's set of removed sequences: rows removed before their flush leave both the
    detail and the set, so a detail read back from the table agrees with the one that was in memory."""

    __slots__ = ("shift", "cache_bytes", "subjects", "removed", "loader", "time_seeker", "flushed_upto", "pinned",
                 "cache", "cache_used", "consulted")

    def __init__(self, shift: int, cache_bytes: int, subjects: SubjectTable, removed: SeqSet) -> None:
        self.shift = shift
        self.cache_bytes = cache_bytes
        self.subjects = subjects  # gives the ids of the subjects a loader reads back
        self.removed = removed
        self.loader: Loader | None = None  # None: every detail stays in memory (memory streams)
        self.time_seeker: TimeSeeker | None = None
        self.flushed_upto = 0  # rows at or below it are in the table (when there is a loader)
        self.pinned: dict[int, Detail] = {}
        self.cache: OrderedDict[int, Detail] = OrderedDict()
        self.cache_used = 0
        self.consulted = 0  # gets of details that are not pinned: reads of what the table holds

    def get(self, block: int) -> Detail:
        found = self.pinned.get(block)
        if found is not None:
            return found
        self.consulted += 1
        found = self.cache.get(block)
        if found is not None:
            self.cache.move_to_end(block)
            return found
        lo, hi = block << self.shift, ((block + 1) << self.shift) - 1
        if self.loader is None:
            return Detail.empty(0)
        seqs, subjects, sizes, ts = self.loader(max(lo, 1), hi)
        sids = self.subjects.ids(subjects) if isinstance(subjects, list) else self.subjects.ids_of_array(subjects)
        detail = Detail(seqs.astype(np.int64), sids, sizes.astype(np.int64), ts.astype(np.int64), len(seqs))
        self._cache_put(block, detail)
        return detail

    def holds(self, block: int) -> bool:
        """Whether `block`'s detail is in memory (unflushed, or cached): reading it costs no I/O."""
        return block in self.pinned or block in self.cache or self.loader is None

    def _cache_put(self, block: int, detail: Detail) -> None:
        self.cache[block] = detail
        self.cache_used += detail.nbytes
        while self.cache_used > self.cache_bytes and len(self.cache) > 1:
            _, old = self.cache.popitem(last=False)
            self.cache_used -= old.nbytes

    def drop_cached(self) -> int:
        """Forgets the details read back from the table or unpinned by flushes (see
        MessageIndex.drop_cached_details). Returns the bytes dropped."""
        if self.loader is None:
            return 0
        dropped = self.cache_used
        self.cache.clear()
        self.cache_used = 0
        return dropped

    def open(self, block: int, last_seq: int) -> Detail:
        """The detail an append goes to, past the index's `last_seq`: pinned until its rows are flushed."""
        found = self.pinned.get(block)
        if found is None:
            found = self.cache.pop(block, None)
            if found is not None:
                self.cache_used -= found.nbytes
            elif self.loader is None or self.flushed_upto < max(block << self.shift, 1):  # the table has none of it
                found = Detail.empty()
            else:  # a block the table holds in part (after a restart): rows past the index's end come next
                found = self.get(block)
                self.cache_used -= found.nbytes
                del self.cache[block]
                if found.n and found.seqs[found.n - 1] > last_seq:
                    found.keep(found.view()[0] <= last_seq)
            self.pinned[block] = found
        return found

    def forget(self, blocks: range) -> None:
        """Forgets the details of blocks the index no longer summarises (wholly below its first message)."""
        for gone in blocks:
            self.pinned.pop(gone, None)
            old = self.cache.pop(gone, None)
            if old is not None:
                self.cache_used -= old.nbytes

    def seal(self, upto: int) -> None:
        """A flush is cut up to `upto`: rows removed before now never reach the table, so they leave the
        details and the removed set here (a detail read back later then agrees with the one in memory)."""
        for block in sorted(b for b in self.pinned if b <= upto >> self.shift):
            self.drop_removed(block, self.flushed_upto + 1, upto)

    def mark_flushed(self, upto: int) -> None:
        """Rows at or below `upto` are in the table: the details of blocks wholly below may be evicted."""
        self.flushed_upto = max(self.flushed_upto, upto)
        for block in sorted(b for b in self.pinned if b < (self.flushed_upto + 1) >> self.shift):
            self._cache_put(block, self.pinned.pop(block))

    def drop_removed(self, block: int, lo: int, hi: int) -> None:
        """Drops the removed rows in [lo, hi] from `block`'s pinned detail, and them from the removed set."""
        detail = self.pinned.get(block)
        if detail is None:
            return
        seqs = detail.view()[0]
        gone = (seqs >= lo) & (seqs <= hi)
        gone[gone] = self.removed.mask(seqs[gone])
        if gone.any():
            dropped = seqs[gone]
            detail.keep(~gone)
            for a, b in seq_ranges(dropped):
                self.removed.discard(a, b)

    @property
    def nbytes(self) -> int:
        return sum(d.nbytes for d in self.pinned.values()) + self.cache_used
