"""The per-stream index of live messages: what a read, a limit or a purge needs, in memory bounded by
configuration rather than by the number of messages.

Sequences are cut into blocks of `block_size` consecutive sequences. Per block the index keeps a
summary (live messages and bytes, first and last timestamp, and how many live messages each subject
has there); per subject JetStream's `SimpleState` (engine/subject_table.py); and the set of removed
sequences whose rows may still be stored (engine/seqset.py). The rows of a block (sequence, subject
id, size, time) are its detail: held in memory while any of them is unflushed, then read back on
demand from the table through the store's `loader` and kept in a byte-bounded cache. So a stream of
a hundred million messages costs a few bytes a block and a few dozen bytes a subject, and a read by
sequence, time or subject finds its block from the summaries, then one detail. A message is live when
its row is present in its block's detail (or table) and its sequence is not removed: so a store may
read a flushed message straight from its table when `may_be_live` holds and the block's detail is not
in memory (the row it finds is the detail's row), and a search by time reads a cold block's stored
sequences and times only (`time_seeker`).

Counts are kept, not recomputed: a removal takes the removed rows' subjects and sizes from the detail
and updates the block, the subject and the stream at once; a range removal (purge, expiry, limits)
settles whole blocks from their summaries without reading them. Counterpart: the message blocks'
per-subject state (`fss`) and the stream-wide `psim` of server/filestore.go.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.seqset import SeqSet
from engine.subject_table import SubjectTable

DEFAULT_BLOCK_SIZE = 1 << 14
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024
_FEW = 8
_MASKS = 16  # wildcard filters whose subject masks are kept

# What a store hands back for a range of sequences: the rows present in its table, in sequence order.
Rows = tuple[np.ndarray, Any, np.ndarray, np.ndarray]  # seqs, subjects (a list or an Arrow string column), sizes, ts
Loader = Callable[[int, int], Rows]


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

    def extend(self, seqs: np.ndarray, sids: np.ndarray, sizes: np.ndarray, ts: np.ndarray) -> None:
        need = self.n + len(seqs)
        if need > len(self.seqs):
            capacity = max(need, 2 * len(self.seqs))
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


class _Hist:
    """Live messages per subject in one block: a dict while the block is written, sorted arrays after.

    Only the block being written holds the dict (~100 B a subject); a closed block's pairs cost 8 B
    (int32 subject id, int32 count: a block holds far fewer than 2**31 messages). A closed block that
    gains messages (a batch straddling two blocks, rows appended after a restart) merges them into its
    arrays and stays closed: reopening every block a batch crossed once left each block's histogram a
    dict for good, ~90 B a message with a million distinct subjects."""

    __slots__ = ("open", "sids", "counts")

    def __init__(self) -> None:
        self.open: dict[int, int] | None = {}
        self.sids = np.zeros(0, np.int32)
        self.counts = np.zeros(0, np.int32)

    def close(self) -> None:
        if self.open is not None:
            sids = np.fromiter(self.open.keys(), np.int32, len(self.open))
            counts = np.fromiter(self.open.values(), np.int32, len(self.open))
            order = np.argsort(sids, kind="stable")
            self.sids, self.counts = sids[order], counts[order]
            self.open = None

    def reopen(self) -> None:
        """The block is written again (the last block, after a restart): back to a dict."""
        if self.open is None:
            self.open = dict(zip(self.sids.tolist(), self.counts.tolist(), strict=True))

    def add(self, sids: np.ndarray, counts: np.ndarray) -> None:
        if self.open is None:
            self._merge(sids, counts)
            return
        for sid, count in zip(sids.tolist(), counts.tolist(), strict=True):
            self.open[sid] = self.open.get(sid, 0) + count

    def _merge(self, sids: np.ndarray, counts: np.ndarray) -> None:
        merged, at = np.unique(np.concatenate((self.sids, np.asarray(sids, np.int32))), return_inverse=True)
        totals = np.zeros(len(merged), np.int32)
        np.add.at(totals, at, np.concatenate((self.counts, np.asarray(counts, np.int32))))
        self.sids, self.counts = merged.astype(np.int32), totals

    def add_one(self, sid: int) -> None:
        if self.open is None:
            self._merge(np.array([sid], np.int32), np.array([1], np.int32))
        else:
            self.open[sid] = self.open.get(sid, 0) + 1

    def take(self, sids: np.ndarray, counts: np.ndarray) -> None:
        if self.open is not None:
            for sid, count in zip(sids.tolist(), counts.tolist(), strict=True):
                self.open[sid] -= count
        else:
            np.subtract.at(self.counts, np.searchsorted(self.sids, sids), counts)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if self.open is not None:
            return np.fromiter(self.open.keys(), np.int32, len(self.open)), np.fromiter(self.open.values(), np.int32, len(self.open))
        return self.sids, self.counts

    def count(self, sid: int) -> int:
        if self.open is not None:
            return self.open.get(sid, 0)
        i = int(np.searchsorted(self.sids, sid))
        return int(self.counts[i]) if i < len(self.sids) and self.sids[i] == sid else 0

    def matching(self, mask: np.ndarray | None) -> int:
        sids, counts = self.arrays()
        if mask is None:
            return int(counts.sum())
        inside = sids < len(mask)
        return int(counts[inside][mask[sids[inside]]].sum())


class MessageIndex:
    """Live sequences of one stream with JetStream's stream state (first/last seq and time, counts)."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if block_size & (block_size - 1):
            raise ValueError("block_size must be a power of two")
        self._shift = block_size.bit_length() - 1
        self.block_size = block_size
        self.cache_bytes = cache_bytes
        self.loader: Loader | None = None  # None: every detail stays in memory (memory streams)
        # the first stored sequence in [lo, hi] stamped at or after a time that a liveness mask keeps
        self.time_seeker: Callable[[int, int, int, Callable[[np.ndarray], np.ndarray]], int] | None = None
        self.subjects = SubjectTable()
        self.removed = SeqSet()
        self.first_seq = 0
        self.last_seq = 0
        self.first_ts = 0
        self.last_ts = 0
        self.msgs = 0
        self.bytes = 0
        self.flushed_upto = 0  # rows at or below it are in the table (when there is a loader)
        self._base = 0  # block number of slot 0
        self._live = np.zeros(0, np.int64)
        self._bytes = np.zeros(0, np.int64)
        self._first_ts = np.zeros(0, np.int64)
        self._last_ts = np.zeros(0, np.int64)
        self._hist: list[_Hist] = []
        self._pinned: dict[int, Detail] = {}
        self._cache: OrderedDict[int, Detail] = OrderedDict()
        self._cache_used = 0
        self._masks: OrderedDict[str, np.ndarray] = OrderedDict()

    # -- blocks -------------------------------------------------------------------------------

    def _block(self, seq: int) -> int:
        return seq >> self._shift

    def _span(self, block: int) -> tuple[int, int]:
        return block << self._shift, ((block + 1) << self._shift) - 1

    def _slot(self, block: int) -> int:
        return block - self._base

    @property
    def _blocks(self) -> range:
        return range(self._base, self._base + len(self._live))

    def _ensure_block(self, block: int) -> None:
        """Makes room for summaries up to `block` (new blocks start empty)."""
        if not len(self._live):
            self._base = block
        need = block - self._base + 1
        if need <= len(self._live):
            return
        grow = need - len(self._live)
        last_ts = int(self._last_ts[-1]) if len(self._last_ts) else 0
        self._live = np.concatenate((self._live, np.zeros(grow, np.int64)))
        self._bytes = np.concatenate((self._bytes, np.zeros(grow, np.int64)))
        self._first_ts = np.concatenate((self._first_ts, np.full(grow, last_ts, np.int64)))
        self._last_ts = np.concatenate((self._last_ts, np.full(grow, last_ts, np.int64)))
        for hist in self._hist[-1:]:
            hist.close()
        self._hist.extend(_Hist() for _ in range(grow))

    def _written_hist(self, slot: int) -> _Hist:
        """The histogram an append adds to: only the last block's is a dict (see _Hist)."""
        hist = self._hist[slot]
        if hist.open is None and slot == len(self._hist) - 1:
            hist.reopen()
        return hist

    def _detail(self, block: int) -> Detail:
        found = self._pinned.get(block)
        if found is not None:
            return found
        found = self._cache.get(block)
        if found is not None:
            self._cache.move_to_end(block)
            return found
        lo, hi = self._span(block)
        if self.loader is None:
            return Detail.empty(0)
        seqs, subjects, sizes, ts = self.loader(max(lo, 1), hi)
        sids = self.subjects.ids(subjects) if isinstance(subjects, list) else self.subjects.ids_of_array(subjects)
        detail = Detail(seqs.astype(np.int64), sids, sizes.astype(np.int64), ts.astype(np.int64), len(seqs))
        self._cache_put(block, detail)
        return detail

    def _cache_put(self, block: int, detail: Detail) -> None:
        self._cache[block] = detail
        self._cache_used += detail.nbytes
        while self._cache_used > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cache_used -= old.nbytes

    def drop_cached_details(self) -> int:
        """Forgets the details read back from the table or unpinned by flushes (a write load ended: the
        table holds them, and `_detail` reads a block's back when a read needs it), as nats-server drops an
        idle block's cache. The pinned details of unflushed blocks stay, and so does every detail of a
        stream without a table. Returns the bytes dropped."""
        if self.loader is None:
            return 0
        dropped = self._cache_used
        self._cache.clear()
        self._cache_used = 0
        return dropped

    def _open_detail(self, block: int) -> Detail:
        """The detail an append goes to: pinned until its rows are flushed."""
        found = self._pinned.get(block)
        if found is None:
            found = self._cache.pop(block, None)
            if found is not None:
                self._cache_used -= found.nbytes
            elif self.loader is None or self.flushed_upto < max(self._span(block)[0], 1):  # the table has none of it
                found = Detail.empty()
            else:  # a block the table holds in part (after a restart): rows past the index's end come next
                found = self._detail(block)
                self._cache_used -= found.nbytes
                del self._cache[block]
                if found.n and found.seqs[found.n - 1] > self.last_seq:
                    found.keep(found.view()[0] <= self.last_seq)
            self._pinned[block] = found
        return found

    def _live_rows(self, block: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The live rows of a block within [lo, hi]: (seqs, sids, sizes, ts)."""
        seqs, sids, sizes, ts = self._detail(block).view()
        a, b = np.searchsorted(seqs, [lo, hi + 1])
        seqs, sids, sizes, ts = seqs[a:b], sids[a:b], sizes[a:b], ts[a:b]
        alive = ~self.removed.mask(seqs)
        if alive.all():
            return seqs, sids, sizes, ts
        return seqs[alive], sids[alive], sizes[alive], ts[alive]

    # -- writes -------------------------------------------------------------------------------

    def subject_id(self, subject: str) -> int:
        return self.subjects.id(subject)

    def skip_to(self, next_seq: int) -> None:
        """Moves the next sequence to `next_seq` (purge past the end, `first_seq`); the gap holds no message."""
        if next_seq <= self.last_seq + 1:
            return
        self.last_seq = next_seq - 1
        if self.msgs == 0:
            self.first_seq = next_seq
            self.first_ts = 0
            self._drop_blocks_below(self._block(next_seq))

    def append(self, seq: int, subject: str, size: int, ts: int) -> None:
        """One message: `_append_rows` with scalars (a single publish must not pay numpy's set-up costs)."""
        if seq <= self.last_seq:
            raise ValueError(f"sequence {seq} is not after the last sequence {self.last_seq}")
        sid = self.subjects.id(subject)
        block = seq >> self._shift
        if not len(self._live) or block >= self._base + len(self._live):
            self._ensure_block(block)
        detail = self._pinned.get(block) or self._open_detail(block)
        detail.append(seq, sid, size, ts)
        slot = block - self._base
        self._live[slot] += 1
        self._bytes[slot] += size
        if detail.n == 1:
            self._first_ts[slot] = ts
        self._last_ts[slot] = ts
        self._written_hist(slot).add_one(sid)
        table = self.subjects
        table.fit(seq)
        if table.msgs[sid] == 0:
            table.first[sid] = seq
            table.live += 1
        table.msgs[sid] += 1
        table.last[sid] = seq
        if self.msgs == 0:
            self.first_seq, self.first_ts = seq, ts
        self.msgs += 1
        self.bytes += size
        self.last_seq, self.last_ts = seq, ts

    def append_run(self, first_seq: int, subjects: list[str], sizes: list[int] | np.ndarray, ts: int) -> None:
        """Appends consecutive sequences from `first_seq`, all stamped `ts`."""
        count = len(subjects)
        if count == 0:
            return
        if count == 1:  # a sync publish: the scalar path, without numpy's per-array set-up
            self.append(first_seq, subjects[0], int(sizes[0]), ts)
            return
        if first_seq <= self.last_seq:
            raise ValueError(f"sequence {first_seq} is not after the last sequence {self.last_seq}")
        if subjects.count(subjects[0]) == count:
            sids = np.full(count, self.subjects.id(subjects[0]), np.int32)
        else:
            sids = self.subjects.ids(subjects)
        self._append_rows(np.arange(first_seq, first_seq + count, dtype=np.int64), sids,
                          np.asarray(sizes, np.int64), np.full(count, ts, np.int64))

    def append_rows(self, seqs: np.ndarray, subjects: Any, sizes: np.ndarray, ts: np.ndarray) -> None:
        """Appends rows in ascending sequence order, gaps allowed (a rebuild from the table); `subjects`
        is a list or an Arrow string column."""
        if len(seqs):
            sids = self.subjects.ids(subjects) if isinstance(subjects, list) else self.subjects.ids_of_array(subjects)
            self._append_rows(seqs.astype(np.int64), sids, sizes.astype(np.int64), ts.astype(np.int64))

    def forget_dead_subjects(self) -> int:
        """Forgets the names of subjects with no live message (see SubjectTable.forget)."""
        table = self.subjects
        return table.forget(np.flatnonzero((table.msgs[: table.count] == 0)))

    def _append_rows(self, seqs: np.ndarray, sids: np.ndarray, sizes: np.ndarray, ts: np.ndarray) -> None:
        first, last = int(seqs[0]), int(seqs[-1])
        if first <= self.last_seq:
            raise ValueError(f"sequence {first} is not after the last sequence {self.last_seq}")
        if self.msgs == 0:
            self.first_seq, self.first_ts = first, int(ts[0])
        blocks = seqs >> self._shift
        self._ensure_block(int(blocks[0]))
        self._ensure_block(int(blocks[-1]))
        cuts = np.flatnonzero(np.diff(blocks)) + 1 if blocks[0] != blocks[-1] else np.zeros(0, np.int64)
        for part in np.split(np.arange(len(seqs)), cuts) if len(cuts) else (slice(None),):
            block = int(blocks[part][0])
            detail = self._open_detail(block)
            detail.extend(seqs[part], sids[part], sizes[part], ts[part])
            slot = self._slot(block)
            part_sizes = sizes[part]
            self._live[slot] += len(part_sizes)
            self._bytes[slot] += int(part_sizes.sum())
            if detail.n == len(part_sizes):
                self._first_ts[slot] = int(ts[part][0])
            self._last_ts[slot] = int(ts[part][-1])
            unique, counts = _counted(sids[part])
            self._written_hist(slot).add(unique, counts)
        self._count_subjects(sids, seqs)
        self.msgs += len(seqs)
        self.bytes += int(sizes.sum())
        self.last_seq, self.last_ts = last, int(ts[-1])

    def _count_subjects(self, sids: np.ndarray, seqs: np.ndarray) -> None:
        table = self.subjects
        table.fit(int(seqs[-1]))
        if len(sids) == 1 or sids[0] == sids[-1] and (sids == sids[0]).all():
            sid = int(sids[0])
            if table.msgs[sid] == 0:
                table.first[sid] = seqs[0]
                table.live += 1
            table.msgs[sid] += len(sids)
            table.last[sid] = seqs[-1]
            return
        unique, first_at, counts = np.unique(sids, return_index=True, return_counts=True)
        last_at = len(sids) - 1 - np.unique(sids[::-1], return_index=True)[1]
        fresh = table.msgs[unique] == 0
        table.first[unique[fresh]] = seqs[first_at[fresh]]
        table.live += int(fresh.sum())
        table.msgs[unique] += counts
        table.last[unique] = seqs[last_at]

    # -- removals -----------------------------------------------------------------------------

    def remove(self, seq: int) -> bool:
        """Removes one live message; False if it is not live."""
        return self.remove_many(np.array([seq], np.int64)) == 1

    def remove_many(self, seqs: np.ndarray) -> int:
        """Removes the live messages among `seqs` (sorted, unique); returns how many were live."""
        if len(seqs) == 1:
            return self._remove_one(int(seqs[0]))
        seqs = np.asarray(seqs, np.int64)
        seqs = seqs[(seqs >= max(self.first_seq, 1)) & (seqs <= self.last_seq)]
        if not len(seqs):
            return 0
        removed = 0
        blocks = seqs >> self._shift
        cuts = np.flatnonzero(np.diff(blocks)) + 1
        for part in np.split(seqs, cuts):
            removed += self._remove_in_block(int(part[0]) >> self._shift, part)
        if removed:
            self._fix_first()
        return removed

    def _remove_one(self, seq: int) -> int:
        """`remove_many` of one sequence (a KV put past its history, a message delete) in scalars: for
        one row, numpy's per-call set-up costs far more than the work."""
        if not self.may_be_live(seq):
            return 0
        row = self._row(seq)
        if row is None:
            return 0
        sid, size, _ = row
        block = self._block(seq)
        slot = self._slot(block)
        self.removed.add(seq, seq)
        self._live[slot] -= 1
        self._bytes[slot] -= size
        self.msgs -= 1
        self.bytes -= size
        hist = self._hist[slot]
        if hist.open is not None:
            hist.open[sid] -= 1
        else:
            hist.take(np.array([sid], np.int32), np.array([1], np.int32))
        self._uncount_one(sid, seq)
        if self.loader is None:
            self._drop_removed_rows(block, seq, seq)
        self._fix_first()
        return 1

    def _uncount_one(self, sid: int, seq: int) -> None:
        """`_uncount_subjects` of one removed message `seq` of subject `sid`."""
        table = self.subjects
        table.msgs[sid] -= 1
        if table.msgs[sid] == 0:
            table.first[sid] = table.last[sid] = 0
            table.live -= 1
            return
        first, last = int(table.first[sid]), int(table.last[sid])
        if table.msgs[sid] == 1 and (first == seq) != (last == seq):
            table.first[sid] = table.last[sid] = last if first == seq else first
            return
        if first == seq:
            table.first[sid] = self._next_of(sid, seq)
        if last == seq:
            table.last[sid] = self._prev_of(sid, seq)

    def _remove_in_block(self, block: int, seqs: np.ndarray) -> int:
        if not self._has_block(block) or self._live[self._slot(block)] == 0:
            return 0
        rows, sids, sizes, _ = self._live_rows(block, int(seqs[0]), int(seqs[-1]))
        hit = np.isin(rows, seqs, assume_unique=True) if len(seqs) > 1 else rows == seqs[0]
        if not hit.any():
            return 0
        rows, sids, sizes = rows[hit], sids[hit], sizes[hit]
        self.removed.add_many(rows)
        self._settle(block, rows, sids, sizes)
        if self.loader is None:
            self._drop_removed_rows(block, int(rows[0]), int(rows[-1]))
        return len(rows)

    def _settle(self, block: int, seqs: np.ndarray, sids: np.ndarray, sizes: np.ndarray) -> None:
        """Counts the removal of live rows of one block (already marked removed)."""
        slot = self._slot(block)
        self._live[slot] -= len(seqs)
        self._bytes[slot] -= int(sizes.sum())
        self.msgs -= len(seqs)
        self.bytes -= int(sizes.sum())
        unique, counts = _counted(sids)
        self._hist[slot].take(unique, counts)
        self._uncount_subjects(unique, counts, int(seqs[0]), int(seqs[-1]), seqs)

    def _uncount_subjects(
        self, sids: np.ndarray, counts: np.ndarray, lo: int, hi: int, seqs: np.ndarray | None = None
    ) -> None:
        """Subject states after removing `counts` messages of `sids`: every live one in [lo, hi], or the
        sorted `seqs` when given. Vectorised, but for subjects whose first or last message went while
        others remain (those walk to the next one)."""
        table = self.subjects
        table.msgs[sids] -= counts
        left = table.msgs[sids]
        gone = sids[left == 0]
        table.first[gone] = table.last[gone] = 0
        table.live -= len(gone)
        rest = sids[left > 0]
        if seqs is None:
            first_in = (table.first[rest] >= lo) & (table.first[rest] <= hi)
            last_in = (table.last[rest] >= lo) & (table.last[rest] <= hi)
        else:
            first_in = np.isin(table.first[rest], seqs)
            last_in = np.isin(table.last[rest], seqs)
        single = (table.msgs[rest] == 1) & (first_in != last_in)
        keep = np.where(first_in, table.last[rest], table.first[rest])[single]
        table.first[rest[single]] = table.last[rest[single]] = keep
        walk = ~single & (first_in | last_in)
        for sid, f, l in zip(rest[walk].tolist(), first_in[walk].tolist(), last_in[walk].tolist(), strict=True):
            if f:
                table.first[sid] = self._next_of(sid, int(table.first[sid]))
            if l:
                table.last[sid] = self._prev_of(sid, int(table.last[sid]))

    def remove_range(self, first: int, last: int) -> int:
        """Removes every live message in [first, last]; whole blocks are settled from their summaries."""
        first, last = max(first, self.first_seq, 1), min(last, self.last_seq)
        if first > last or self.msgs == 0:
            return 0
        removed = 0
        touched: dict[int, int] = {}
        lo_block, hi_block = self._block(first), self._block(last)
        for block in range(max(lo_block, self._base), min(hi_block, self._blocks.stop - 1) + 1):
            slot = self._slot(block)
            if self._live[slot] == 0:
                continue
            lo, hi = self._span(block)
            if lo < first or hi > last:
                rows, sids, sizes, _ = self._live_rows(block, max(lo, first), min(hi, last))
                if len(rows):
                    self._live[slot] -= len(rows)
                    self._bytes[slot] -= int(sizes.sum())
                    removed += len(rows)
                    self.bytes -= int(sizes.sum())
                    unique, counts = _counted(sids)
                    self._hist[slot].take(unique, counts)
                    for sid, count in zip(unique.tolist(), counts.tolist(), strict=True):
                        touched[sid] = touched.get(sid, 0) + count
                continue
            sids, counts = self._hist[slot].arrays()
            live = counts > 0
            for sid, count in zip(sids[live].tolist(), counts[live].tolist(), strict=True):
                touched[sid] = touched.get(sid, 0) + count
            removed += int(self._live[slot])
            self.bytes -= int(self._bytes[slot])
            self._live[slot] = self._bytes[slot] = 0
            self._hist[slot].take(sids[live], counts[live])
        self.removed.add(first, last)
        self.msgs -= removed
        if self.loader is None:  # no table behind the details: removed rows go at once
            for block in list(self._pinned):
                if lo_block <= block <= hi_block:
                    self._drop_removed_rows(block, first, last)
        if touched:
            sids = np.fromiter(touched.keys(), np.int32, len(touched))
            self._uncount_subjects(sids, np.fromiter(touched.values(), np.int64, len(touched)), first, last)
        self._fix_first()
        return removed

    def _fix_first(self) -> None:
        if self.msgs == 0:
            self.first_seq = self.last_seq + 1
            self.first_ts = 0
            self._drop_blocks_below(self._block(self.first_seq))
            return
        if self.first_seq >= 1 and self.is_live(self.first_seq):
            return
        start = max(self.first_seq, 1)
        if self.first_seq >= 1 and self.is_live(start + 1):  # the first message went alone (a KV put past its history): no block scan
            row = self._row(start + 1)
            assert row is not None
            self.first_seq, self.first_ts = start + 1, row[2]
            self._drop_blocks_below(self._block(start + 1))
            return
        for block in range(max(self._block(start), self._base), self._blocks.stop):
            if self._live[self._slot(block)] == 0:
                continue
            rows, _, _, ts = self._live_rows(block, start, self._span(block)[1])
            if len(rows):
                self.first_seq, self.first_ts = int(rows[0]), int(ts[0])
                self._drop_blocks_below(block)
                return
        raise AssertionError("index counts live messages but finds none")

    def _drop_blocks_below(self, block: int) -> None:
        """Forgets the summaries and details of blocks wholly below the first live message."""
        drop = min(block - self._base, len(self._live))
        if drop <= 0:
            return
        for gone in range(self._base, self._base + drop):
            self._pinned.pop(gone, None)
            old = self._cache.pop(gone, None)
            if old is not None:
                self._cache_used -= old.nbytes
        self._live, self._bytes = self._live[drop:], self._bytes[drop:]
        self._first_ts, self._last_ts = self._first_ts[drop:], self._last_ts[drop:]
        del self._hist[:drop]
        self._base += drop
        self.removed.discard(0, (self._base << self._shift) - 1)

    # -- flushing -----------------------------------------------------------------------------

    def seal(self, upto: int) -> None:
        """A flush is cut up to `upto`: rows removed before now never reach the table, so they leave the
        details and the removed set here (a detail read back later then agrees with the one in memory)."""
        for block in sorted(b for b in self._pinned if b <= self._block(upto)):
            self._drop_removed_rows(block, self.flushed_upto + 1, upto)

    def mark_flushed(self, upto: int) -> None:
        """Rows at or below `upto` are in the table: the details of blocks wholly below may be evicted."""
        self.flushed_upto = max(self.flushed_upto, upto)
        for block in sorted(b for b in self._pinned if b < self._block(self.flushed_upto + 1)):
            self._cache_put(block, self._pinned.pop(block))

    def _drop_removed_rows(self, block: int, lo: int, hi: int) -> None:
        detail = self._pinned.get(block)
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

    # -- reads --------------------------------------------------------------------------------

    def _has_block(self, block: int) -> bool:
        return self._base <= block < self._blocks.stop

    def may_be_live(self, seq: int) -> bool:
        """Whether `seq` is live if its row is stored: in range, in a block with live messages, not removed.
        Answered from the summaries, without reading the block's detail."""
        if seq < max(self.first_seq, 1) or seq > self.last_seq:
            return False
        block = self._block(seq)
        return self._has_block(block) and self._live[self._slot(block)] != 0 and not self.removed.contains(seq)

    def holds_detail(self, seq: int) -> bool:
        """Whether the detail of `seq`'s block is in memory (unflushed, or cached): reading it costs no I/O."""
        block = self._block(seq)
        return block in self._pinned or block in self._cache or self.loader is None

    def is_live(self, seq: int) -> bool:
        if not self.may_be_live(seq):
            return False
        detail = self._detail(self._block(seq))
        n = detail.n
        i = int(detail.seqs[:n].searchsorted(seq))  # the method: no numpy dispatch wrapper per read
        return i < n and int(detail.seqs[i]) == seq

    def _row(self, seq: int) -> tuple[int, int, int] | None:
        """(subject id, size, ts) of a stored row, live or not."""
        block = self._block(seq)
        if not self._has_block(block):
            return None
        seqs, sids, sizes, ts = self._detail(block).view()
        i = int(seqs.searchsorted(seq))
        if i < len(seqs) and int(seqs[i]) == seq:
            return int(sids[i]), int(sizes[i]), int(ts[i])
        return None

    def subject_of(self, seq: int) -> str:
        row = self._row(seq)
        if row is None:
            raise KeyError(seq)
        return self.subjects.name(row[0])

    def ts_of(self, seq: int) -> int:
        row = self._row(seq)
        if row is None:
            raise KeyError(seq)
        return row[2]

    def size_of(self, seq: int) -> int:
        row = self._row(seq)
        if row is None:
            raise KeyError(seq)
        return row[1]

    def _columns_of(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(present, sids, sizes) of sorted `seqs`: whether each has a stored row, and its subject and size."""
        present = np.zeros(len(seqs), np.bool_)
        sids = np.zeros(len(seqs), np.int32)
        sizes = np.zeros(len(seqs), np.int64)
        if not len(seqs):
            return present, sids, sizes
        blocks = seqs >> self._shift
        starts = np.concatenate(([0], np.flatnonzero(np.diff(blocks)) + 1, [len(seqs)]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            block = int(blocks[a])
            if not self._has_block(block):
                continue
            rows, row_sids, row_sizes, _ = self._detail(block).view()
            i = np.searchsorted(rows, seqs[a:b])
            i_clipped = np.minimum(i, max(len(rows) - 1, 0))
            hit = (i < len(rows)) & (rows[i_clipped] == seqs[a:b]) if len(rows) else np.zeros(b - a, np.bool_)
            present[a:b] = hit
            sids[a:b][hit] = row_sids[i_clipped[hit]]
            sizes[a:b][hit] = row_sizes[i_clipped[hit]]
        return present, sids, sizes

    def live_mask(self, seqs: np.ndarray) -> np.ndarray:
        """Which of `seqs` are live, vectorised."""
        seqs = np.asarray(seqs, np.int64)
        if not len(seqs):
            return np.zeros(0, np.bool_)
        order = np.argsort(seqs, kind="stable")
        ordered = seqs[order]
        inside = (ordered >= max(self.first_seq, 1)) & (ordered <= self.last_seq)
        present = np.zeros(len(seqs), np.bool_)
        if inside.any():
            present[inside] = self._columns_of(ordered[inside])[0]
        present &= ~self.removed.mask(ordered)
        out = np.zeros(len(seqs), np.bool_)
        out[order] = present
        return out

    def sizes_of(self, seqs: np.ndarray) -> np.ndarray:
        seqs = np.asarray(seqs, np.int64)
        order = np.argsort(seqs, kind="stable")
        sizes = np.zeros(len(seqs), np.int64)
        sizes[order] = self._columns_of(seqs[order])[2]
        return sizes

    def subjects_among(self, seqs: np.ndarray) -> list[str]:
        """The distinct subjects of live `seqs`."""
        seqs = np.sort(np.asarray(seqs, np.int64))
        present, sids, _ = self._columns_of(seqs)
        return self.subjects.names(np.unique(sids[present]))

    def subject_state(self, subject: str) -> tuple[int, int, int]:
        """(msgs, first_seq, last_seq) of a literal subject; zeros if it has none."""
        return self.subjects.state(subject)

    @property
    def num_subjects(self) -> int:
        return self.subjects.live

    def matching_subject_ids(self, filter_: str) -> list[int]:
        return self.subjects.matching(filter_).tolist()  # type: ignore[no-any-return]

    def subjects_state(self, filter_: str) -> dict[str, int]:
        sids = self.subjects.matching(filter_)
        return {self.subjects.name(sid): int(self.subjects.msgs[sid]) for sid in sids.tolist()}

    def subjects_page(self, filter_: str, offset: int, limit: int) -> tuple[dict[str, int], int]:
        """({subject: msgs} of the matching subjects sorted by name, from `offset`, at most `limit`), and
        how many match in all: STREAM.INFO's subject paging."""
        sids = self.subjects.matching(filter_)
        total = len(sids)
        if offset == 0 and total <= limit:
            return {self.subjects.name(sid): int(self.subjects.msgs[sid]) for sid in sids.tolist()}, total
        names = sorted(zip(self.subjects.names(sids), sids.tolist(), strict=True))[offset : offset + limit]
        return {name: int(self.subjects.msgs[sid]) for name, sid in names}, total

    def iter_subject_states(self) -> Iterator[tuple[str, int, int, int]]:
        return self.subjects.iter_states()

    def _mask(self, filter_: str | list[str] | None) -> np.ndarray | None:
        """A boolean mask over subject ids for a filter (or several), None for "everything"."""
        filters = [filter_] if isinstance(filter_, str) else list(filter_ or [])
        if not filters or ">" in filters:
            return None
        count = len(self.subjects)
        mask = np.zeros(count, np.bool_)
        for f in filters:
            mask |= self._filter_mask(f, count)
        return mask

    def _filter_mask(self, filter_: str, count: int) -> np.ndarray:
        if "*" not in filter_ and ">" not in filter_:
            mask = np.zeros(count, np.bool_)
            sid = self.subjects.find(filter_)
            if sid >= 0:
                mask[sid] = True
            return mask
        cached = self._masks.get(filter_)
        if cached is None or len(cached) < count:
            start = 0 if cached is None else len(cached)
            tail = self.subjects.match_mask(filter_, start)
            cached = tail if cached is None else np.concatenate((cached, tail))
            self._masks[filter_] = cached
            if len(self._masks) > _MASKS:
                self._masks.popitem(last=False)
        self._masks.move_to_end(filter_)
        return cached

    def _matching_live(self, block: int, mask: np.ndarray | None) -> int:
        slot = self._slot(block)
        if self._live[slot] == 0:
            return 0
        return int(self._live[slot]) if mask is None else self._hist[slot].matching(mask)

    def live_seqs(self, filter_: str | list[str] | None = None, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Sorted live sequences in [start, stop) whose subject matches `filter_` (one or several; all when None)."""
        lo = max(start, self.first_seq, 1)
        hi = self.last_seq if stop is None else min(stop - 1, self.last_seq)
        if lo > hi or self.msgs == 0:
            return np.zeros(0, np.int64)
        mask = self._mask(filter_)
        out: list[np.ndarray] = []
        for block in range(max(self._block(lo), self._base), min(self._block(hi), self._blocks.stop - 1) + 1):
            if self._matching_live(block, mask) == 0:
                continue
            rows, sids, _, _ = self._live_rows(block, lo, hi)
            if mask is not None:
                rows = rows[_masked(mask, sids)]
            if len(rows):
                out.append(rows)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def count_live(self, filter_: str | list[str] | None = None, start: int = 0) -> int:
        """Live messages at or after `start` matching `filter_`: whole blocks from their summaries."""
        lo = max(start, self.first_seq, 1)
        if lo > self.last_seq or self.msgs == 0:
            return 0
        mask = self._mask(filter_)
        first_block = max(self._block(lo), self._base)
        total = 0
        if first_block < self._blocks.stop and self._matching_live(first_block, mask):
            rows, sids, _, _ = self._live_rows(first_block, lo, self._span(first_block)[1])
            total += len(rows) if mask is None else int(_masked(mask, sids).sum())
        rest = range(first_block + 1, self._blocks.stop)
        if mask is None:
            return total + int(self._live[self._slot(rest.start):].sum()) if len(rest) else total
        if len(rest) > len(self._live) // 2:
            before = sum(self._matching_live(b, mask) for b in range(self._base, first_block + 1))
            return int(self.subjects.msgs[: len(mask)][mask].sum()) - before + total
        return total + sum(self._matching_live(b, mask) for b in rest)

    def last_seq_for(self, filter_: str) -> int:
        if "*" not in filter_ and ">" not in filter_:  # one subject (a KV get): no id arrays
            return self.subjects.state(filter_)[2]
        sids = self.subjects.matching(filter_)
        return int(self.subjects.last[sids].max()) if len(sids) else 0

    def last_seqs(self, filter_: str) -> np.ndarray:
        """The last live sequence of every subject matching `filter_`, ascending: JetStream's last-per-subject."""
        return np.sort(self.subjects.last[self.subjects.matching(filter_)]).astype(np.int64, copy=False)

    def next_seq_for(self, filter_: str, start: int) -> int:
        """First live sequence ≥ start on `filter_`; 0 if none."""
        sids = self.subjects.matching(filter_)
        if not len(sids):
            return 0
        firsts = self.subjects.first[sids]
        if int(firsts.min()) >= start:
            return int(firsts.min())
        found = self.live_seqs(filter_, start=start, stop=self._first_block_end(start))
        if len(found):
            return int(found[0])
        mask = self._mask(filter_)
        for block in range(max(self._block(start) + 1, self._base), self._blocks.stop):
            if self._matching_live(block, mask):
                rows, block_sids, _, _ = self._live_rows(block, *self._span(block))
                rows = rows[_masked(mask, block_sids)] if mask is not None else rows
                if len(rows):
                    return int(rows[0])
        return 0

    def _first_block_end(self, seq: int) -> int:
        return self._span(self._block(seq))[1] + 1

    def _next_of(self, sid: int, after: int) -> int:
        """The first live sequence of subject `sid` after `after` (0 if none)."""
        for block in range(max(self._block(after), self._base), self._blocks.stop):
            slot = self._slot(block)
            if self._live[slot] == 0 or self._hist[slot].count(sid) <= 0:
                continue
            rows, sids, _, _ = self._live_rows(block, after + 1, self._span(block)[1])
            rows = rows[sids == sid]
            if len(rows):
                return int(rows[0])
        return 0

    def _prev_of(self, sid: int, before: int) -> int:
        """The last live sequence of subject `sid` before `before` (0 if none)."""
        for block in range(min(self._block(before), self._blocks.stop - 1), self._base - 1, -1):
            slot = self._slot(block)
            if self._live[slot] == 0 or self._hist[slot].count(sid) <= 0:
                continue
            rows, sids, _, _ = self._live_rows(block, self._span(block)[0], before - 1)
            rows = rows[sids == sid]
            if len(rows):
                return int(rows[-1])
        return 0

    def oldest_seqs(self, subject: str, count: int) -> np.ndarray:
        """The `count` oldest live sequences of a literal subject, block by block from its first."""
        sid = self.subjects.find(subject)
        if sid < 0 or self.subjects.msgs[sid] == 0 or count <= 0:
            return np.zeros(0, np.int64)
        want = min(count, int(self.subjects.msgs[sid]))
        out: list[np.ndarray] = []
        got = 0
        for block in range(max(self._block(int(self.subjects.first[sid])), self._base), self._blocks.stop):
            slot = self._slot(block)
            if self._live[slot] == 0 or self._hist[slot].count(sid) <= 0:
                continue
            rows, sids, _, _ = self._live_rows(block, *self._span(block))
            rows = rows[sids == sid][: want - got]
            out.append(rows)
            got += len(rows)
            if got >= want:
                break
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def oldest_in_subject(self, subject: str) -> int:
        return self.subject_state(subject)[1]

    def seq_at_or_after_time(self, ts: int) -> int:
        """First live sequence published at or after `ts` (timestamps never go back). A block whose detail
        is not in memory is searched in its stored sequences and times only (`time_seeker`)."""
        for slot in np.flatnonzero((self._live != 0) & (self._last_ts >= ts)).tolist():
            block = self._base + slot
            lo, hi = self._span(block)
            if self.time_seeker is not None and not self.holds_detail(lo):
                found = self.time_seeker(max(lo, self.first_seq, 1), min(hi, self.last_seq), ts, self._unremoved)
                if found:
                    return found
                continue
            rows, _, _, row_ts = self._live_rows(block, lo, hi)
            hit = np.flatnonzero(row_ts >= ts)
            if len(hit):
                return int(rows[hit[0]])
        return 0

    def _unremoved(self, seqs: np.ndarray) -> np.ndarray:
        return ~self.removed.mask(seqs)

    def last_seq_before_time(self, ts: int) -> int:
        """The last live sequence stamped before `ts`, 0 if none: `max_age` removes up to it."""
        if self.msgs == 0 or self.first_ts >= ts:
            return 0
        best = 0
        for block in range(self._base, self._blocks.stop):
            slot = self._slot(block)
            if self._live[slot] == 0:
                continue
            if self._first_ts[slot] >= ts:
                break
            rows, _, _, row_ts = self._live_rows(block, *self._span(block))
            below = np.flatnonzero(row_ts < ts)
            if len(below):
                best = int(rows[below[-1]])
            if len(below) < len(rows):
                break
        return best

    def seqs_before_time(self, ts: int) -> np.ndarray:
        last = self.last_seq_before_time(ts)
        return self.live_seqs(stop=last + 1) if last else np.zeros(0, np.int64)

    def nth_live_seq(self, n: int) -> int:
        """The n-th oldest live sequence (1-based), 0 if there are fewer: `max_msgs` removes up to it."""
        if n <= 0 or n > self.msgs:
            return 0
        seen = 0
        for block in range(self._base, self._blocks.stop):
            live = int(self._live[self._slot(block)])
            if seen + live < n:
                seen += live
                continue
            rows = self._live_rows(block, *self._span(block))[0]
            return int(rows[n - seen - 1])
        return 0

    def seq_covering_bytes(self, amount: int) -> int:
        """The first live sequence at which the oldest live messages add up to `amount` bytes (`max_bytes`)."""
        if amount <= 0:
            return 0
        seen = 0
        for block in range(self._base, self._blocks.stop):
            size = int(self._bytes[self._slot(block)])
            if seen + size < amount:
                seen += size
                continue
            rows, _, sizes, _ = self._live_rows(block, *self._span(block))
            cut = int(np.searchsorted(np.cumsum(sizes), amount - seen, side="left"))
            return int(rows[min(cut, len(rows) - 1)])
        return self.last_seq

    @property
    def num_deleted(self) -> int:
        if self.msgs == 0 or self.first_seq == 0:
            return 0
        return self.last_seq - self.first_seq + 1 - self.msgs

    # -- persistence --------------------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The index without its details (which the table holds): summaries, subjects, removed ranges."""
        hists = [h.arrays() for h in self._hist]
        lengths = np.array([len(sids) for sids, _ in hists], np.int64)
        starts, ends = self.removed.to_arrays()
        scalars = [self.block_size, self.first_seq, self.last_seq, self.first_ts, self.last_ts, self.msgs,
                   self.bytes, self._base, self.flushed_upto]
        return {
            "scalars": np.array(scalars, np.int64),
            "block_live": self._live.copy(),
            "block_bytes": self._bytes.copy(),
            "block_first_ts": self._first_ts.copy(),
            "block_last_ts": self._last_ts.copy(),
            "hist_offsets": np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
            "hist_sids": np.concatenate([s for s, _ in hists]).astype(np.int32) if hists else np.zeros(0, np.int32),
            "hist_counts": np.concatenate([c for _, c in hists]).astype(np.int32) if hists else np.zeros(0, np.int32),
            "removed_starts": starts,
            "removed_ends": ends,
            **self.subjects.to_arrays(),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], cache_bytes: int = DEFAULT_CACHE_BYTES) -> MessageIndex:
        block_size, first_seq, last_seq, first_ts, last_ts, msgs, nbytes, base, flushed = arrays["scalars"].tolist()
        index = cls(block_size, cache_bytes)
        index.first_seq, index.last_seq, index.first_ts, index.last_ts = first_seq, last_seq, first_ts, last_ts
        index.msgs, index.bytes, index._base, index.flushed_upto = msgs, nbytes, base, flushed
        index._live = arrays["block_live"].astype(np.int64, copy=False)
        index._bytes = arrays["block_bytes"].astype(np.int64, copy=False)
        index._first_ts = arrays["block_first_ts"].astype(np.int64, copy=False)
        index._last_ts = arrays["block_last_ts"].astype(np.int64, copy=False)
        offsets = arrays["hist_offsets"]
        sids, counts = arrays["hist_sids"].astype(np.int32, copy=False), arrays["hist_counts"].astype(np.int32, copy=False)
        index._hist = []
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            hist = _Hist()
            hist.open = None
            order = np.argsort(sids[a:b], kind="stable")
            hist.sids, hist.counts = sids[a:b][order], counts[a:b][order]
            index._hist.append(hist)
        index.removed = SeqSet.from_arrays(arrays["removed_starts"], arrays["removed_ends"])
        index.subjects = SubjectTable.from_arrays(arrays)
        return index

    @property
    def memory_bytes(self) -> int:
        """What the index holds in memory: summaries, subjects, removed ranges and details."""
        details = sum(d.nbytes for d in self._pinned.values()) + self._cache_used
        hists = sum(h.sids.nbytes + h.counts.nbytes + (100 * len(h.open) if h.open is not None else 0) for h in self._hist)
        return int(self._live.nbytes * 4 + 100 * len(self._hist)) + hists + self.removed.nbytes + self.subjects.nbytes + details


def _counted(sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(sids) == 1 or (sids == sids[0]).all():
        return sids[:1].astype(np.int32), np.array([len(sids)], np.int64)
    unique, counts = np.unique(sids, return_counts=True)
    return unique.astype(np.int32), counts.astype(np.int64)


def _masked(mask: np.ndarray, sids: np.ndarray) -> np.ndarray:
    inside = sids < len(mask)
    out = np.zeros(len(sids), np.bool_)
    out[inside] = mask[sids[inside]]
    return out


def seq_ranges(seqs: Iterable[int] | np.ndarray) -> list[tuple[int, int]]:
    """Collapses sorted sequences into inclusive ranges."""
    if not isinstance(seqs, np.ndarray):
        seqs = list(seqs)
    if len(seqs) <= _FEW:
        return _few_ranges([int(s) for s in seqs])
    arr = np.asarray(seqs, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(arr) != 1)
    starts = np.concatenate(([arr[0]], arr[breaks + 1]))
    ends = np.concatenate((arr[breaks], [arr[-1]]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive ranges sorted, with overlapping or adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _few_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and ranges[-1][1] + 1 == seq:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges
