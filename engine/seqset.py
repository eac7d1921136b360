"""A set of stream sequences kept as sorted, disjoint inclusive ranges.

The index keeps the sequences removed from a stream (deleted, purged, expired, superseded KV
revisions) whose rows may still be in the table until a job rewrites it. Removals come in ranges
(a purge, an expiry, a limit) or one at a time (a KV update drops the previous revision), so the set
is two int64 columns of range starts and ends, plus a short unsorted list of recent additions merged
in when it grows: membership of a batch of sequences is one `searchsorted`. 16 bytes a range.
Counterpart: the `dmap` (avl.SequenceSet) of server/filestore.go.
"""

from __future__ import annotations

import numpy as np

_MERGE_AT = 512


class SeqSet:
    def __init__(self) -> None:
        self._starts = np.zeros(0, np.int64)
        self._ends = np.zeros(0, np.int64)
        self._recent: list[tuple[int, int]] = []

    def __len__(self) -> int:
        """The number of ranges (after merging)."""
        self._merge()
        return len(self._starts)

    def add(self, first: int, last: int) -> None:
        if first <= last:
            self._recent.append((first, last))
            if len(self._recent) >= _MERGE_AT:
                self._merge()

    def add_many(self, seqs: np.ndarray) -> None:
        """Adds sorted unique sequences, collapsed into ranges."""
        if not len(seqs):
            return
        breaks = np.flatnonzero(np.diff(seqs) != 1)
        starts = np.concatenate((seqs[:1], seqs[breaks + 1]))
        ends = np.concatenate((seqs[breaks], seqs[-1:]))
        self._merge(starts, ends)

    def contains(self, seq: int) -> bool:
        for a, b in self._recent:
            if a <= seq <= b:
                return True
        if not len(self._starts):  # nothing removed in bulk: the common case of a read
            return False
        i = int(self._starts.searchsorted(seq, side="right")) - 1
        return i >= 0 and seq <= int(self._ends[i])

    def mask(self, seqs: np.ndarray) -> np.ndarray:
        """Which of `seqs` are in the set."""
        self._merge()
        if not len(self._starts) or not len(seqs):
            return np.zeros(len(seqs), np.bool_)
        i = np.searchsorted(self._starts, seqs, side="right") - 1
        inside = i >= 0
        out = np.zeros(len(seqs), np.bool_)
        out[inside] = seqs[inside] <= self._ends[i[inside]]
        return out

    def count(self, first: int, last: int) -> int:
        """How many sequences of [first, last] are in the set."""
        self._merge()
        if first > last or not len(self._starts):
            return 0
        lo = int(np.searchsorted(self._ends, first, side="left"))
        hi = int(np.searchsorted(self._starts, last, side="right"))
        if lo >= hi:
            return 0
        starts = np.maximum(self._starts[lo:hi], first)
        ends = np.minimum(self._ends[lo:hi], last)
        return int(np.sum(ends - starts + 1))

    def discard(self, first: int, last: int) -> None:
        """Forgets [first, last] (rows that left the table, or sequences below the stream's first)."""
        self._merge()
        if first > last or not len(self._starts):
            return
        starts, ends = self._starts, self._ends
        keep = (ends < first) | (starts > last)
        left = (starts < first) & (ends >= first)
        right = (ends > last) & (starts <= last)
        new_starts = [starts[keep], starts[left], np.full(int(right.sum()), last + 1, np.int64)]
        new_ends = [ends[keep], np.full(int(left.sum()), first - 1, np.int64), ends[right]]
        s, e = np.concatenate(new_starts), np.concatenate(new_ends)
        order = np.argsort(s, kind="stable")
        self._starts, self._ends = s[order], e[order]

    def uncovered(self, first: int, last: int) -> list[tuple[int, int]]:
        """The parts of [first, last] not in the set."""
        self._merge()
        out: list[tuple[int, int]] = []
        at = first
        lo = int(np.searchsorted(self._ends, first, side="left"))
        hi = int(np.searchsorted(self._starts, last, side="right"))
        for a, b in zip(self._starts[lo:hi].tolist(), self._ends[lo:hi].tolist(), strict=True):
            if a > at:
                out.append((at, a - 1))
            at = max(at, b + 1)
        if at <= last:
            out.append((at, last))
        return out

    def ranges(self) -> list[tuple[int, int]]:
        self._merge()
        return list(zip(self._starts.tolist(), self._ends.tolist(), strict=True))

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        self._merge()
        return self._starts.copy(), self._ends.copy()

    @classmethod
    def from_arrays(cls, starts: np.ndarray, ends: np.ndarray) -> SeqSet:
        out = cls()
        out._merge(starts.astype(np.int64), ends.astype(np.int64))
        return out

    @property
    def nbytes(self) -> int:
        return int(self._starts.nbytes + self._ends.nbytes) + 64 * len(self._recent)

    def _merge(self, starts: np.ndarray | None = None, ends: np.ndarray | None = None) -> None:
        """Folds recent additions (and the given ranges) in: sort, then join overlapping or adjacent ranges."""
        if not self._recent and starts is None:
            return
        parts_s, parts_e = [self._starts], [self._ends]
        if self._recent:
            recent = np.array(self._recent, np.int64).reshape(-1, 2)
            parts_s.append(recent[:, 0])
            parts_e.append(recent[:, 1])
            self._recent = []
        if starts is not None and ends is not None:
            parts_s.append(starts)
            parts_e.append(ends)
        s, e = np.concatenate(parts_s), np.concatenate(parts_e)
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        reach = np.maximum.accumulate(e)
        new = np.ones(len(s), np.bool_)
        new[1:] = s[1:] > reach[:-1] + 1
        self._starts = s[new]
        self._ends = np.maximum.reduceat(e, np.flatnonzero(new)) if len(s) else e
