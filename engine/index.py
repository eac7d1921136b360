"""The per-stream index of live messages: what a read, a limit or a purge needs, in memory bounded by
configuration rather than by the number of messages.

Sequences are cut into blocks of `block_size` consecutive sequences. Per block the index keeps a
summary (live messages and bytes, first and last timestamp, and how many live messages each subject
has there: engine/block_summaries.py); per subject JetStream's `SimpleState` (engine/subject_table.py,
kept by engine/subject_counts.py); and the set of removed sequences whose rows may still be stored
(engine/seqset.py). The rows of a block (sequence, subject id, size, time) are its detail
(engine/block_details.py): held in memory while any of them is unflushed, then read back on demand from
the table through the store's `loader` and kept in a byte-bounded cache. So a stream of a hundred
million messages costs a few bytes a block and a few dozen bytes a subject, and a read by sequence, time
or subject finds its block from the summaries, then one detail (engine/block_rows.py). A message is live
when its row is present in its block's detail (or table) and its sequence is not removed: so a store may
read a flushed message straight from its table when `may_be_live` holds and the block's detail is not in
memory (the row it finds is the detail's row), and a search by time reads a cold block's stored
sequences and times only (`time_seeker`).

Counts are kept, not recomputed: a removal takes the removed rows' subjects and sizes from the detail
and updates the block, the subject and the stream at once; a range removal (purge, expiry, limits)
settles whole blocks from their summaries without reading them (engine/block_removals.py). Counterpart:
the message blocks' per-subject state (`fss`) and the stream-wide `psim` of server/filestore.go.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from engine import index_arrays
from engine.block_details import BlockDetails, Loader, TimeSeeker
from engine.block_removals import BlockRemovals
from engine.block_rows import BlockRows
from engine.block_summaries import BlockSummaries
from engine.seqset import SeqSet
from engine.subject_counts import count_appended, counts_matching, counts_page
from engine.subject_masks import SubjectMasks
from engine.subject_table import SubjectTable

DEFAULT_BLOCK_SIZE = 1 << 14
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024


class MessageIndex:
    """Live sequences of one stream with JetStream's stream state (first/last seq and time, counts).

    The stream-wide state is kept here, and the append path, whose single message must not pay for a
    call per part; blocks, details, searches, removals and subject filters are the parts' (see the
    module's docstring), which share the one SubjectTable and removed set."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, cache_bytes: int = DEFAULT_CACHE_BYTES, *,
                 subjects: SubjectTable | None = None, removed: SeqSet | None = None,
                 blocks: BlockSummaries | None = None) -> None:
        """`subjects`, `removed` and `blocks` are a snapshot's (`from_arrays`); new ones are empty."""
        if block_size & (block_size - 1):
            raise ValueError("block_size must be a power of two")
        self._shift = block_size.bit_length() - 1
        self.block_size = block_size
        self.subjects = SubjectTable() if subjects is None else subjects
        self.removed = SeqSet() if removed is None else removed
        self.blocks = BlockSummaries(self._shift) if blocks is None else blocks
        self.details = BlockDetails(self._shift, cache_bytes, self.subjects, self.removed)
        self.rows = BlockRows(self.blocks, self.details, self.removed, self.subjects)
        self.removals = BlockRemovals(self.rows, self.removed, self.subjects)
        self.masks = SubjectMasks(self.subjects)
        self.first_seq = 0
        self.last_seq = 0
        self.first_ts = 0
        self.last_ts = 0
        self.msgs = 0
        self.bytes = 0

    @property
    def loader(self) -> Loader | None:
        """Reads a block's rows back from the table (the store sets it); None: every detail stays in memory."""
        return self.details.loader

    @loader.setter
    def loader(self, loader: Loader | None) -> None:
        self.details.loader = loader

    @property
    def time_seeker(self) -> TimeSeeker | None:
        """Searches a block that is not in memory by time in the table (the store sets it)."""
        return self.details.time_seeker

    @time_seeker.setter
    def time_seeker(self, seeker: TimeSeeker | None) -> None:
        self.details.time_seeker = seeker

    @property
    def flushed_upto(self) -> int:
        """Rows at or below it are in the table (when there is a loader)."""
        return self.details.flushed_upto

    @flushed_upto.setter
    def flushed_upto(self, upto: int) -> None:
        self.details.flushed_upto = upto

    @property
    def cache_bytes(self) -> int:
        return self.details.cache_bytes

    @property
    def consulted(self) -> int:
        """How many times the details of flushed rows were read (cached or read back): a count that moves
        while something reads what the table holds, or removes from it."""
        return self.details.consulted

    # -- writes -------------------------------------------------------------------------------

    def skip_to(self, next_seq: int) -> None:
        """Moves the next sequence to `next_seq` (purge past the end, `first_seq`); the gap holds no message."""
        if next_seq <= self.last_seq + 1:
            return
        self.last_seq = next_seq - 1
        if self.msgs == 0:
            self.first_seq = next_seq
            self.first_ts = 0
            self._drop_blocks_below(next_seq >> self._shift)

    def append(self, seq: int, subject: str, size: int, ts: int) -> None:
        """One message: `_append_rows` with scalars (a single publish must not pay numpy's set-up costs)."""
        if seq <= self.last_seq:
            raise ValueError(f"sequence {seq} is not after the last sequence {self.last_seq}")
        sid = self.subjects.id(subject)
        block = seq >> self._shift
        blocks = self.blocks
        live = blocks.live  # loaded once: this is every publish's path
        if not len(live) or block >= blocks.base + len(live):
            blocks.ensure(block)
            live = blocks.live
        detail = self.details.pinned.get(block) or self.details.open(block, self.last_seq)
        detail.append(seq, sid, size, ts)
        slot = block - blocks.base
        live[slot] += 1
        blocks.bytes[slot] += size
        if detail.n == 1:
            blocks.first_ts[slot] = ts
        blocks.last_ts[slot] = ts
        blocks.written_hist(slot).add_one(sid)
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
        self.blocks.ensure(int(blocks[0]))
        self.blocks.ensure(int(blocks[-1]))
        cuts = np.flatnonzero(np.diff(blocks)) + 1 if blocks[0] != blocks[-1] else np.zeros(0, np.int64)
        for part in np.split(np.arange(len(seqs)), cuts) if len(cuts) else (slice(None),):
            block = int(blocks[part][0])
            detail = self.details.open(block, self.last_seq)
            detail.extend(seqs[part], sids[part], sizes[part], ts[part], most=1 << self._shift)
            part_sizes = sizes[part]
            self.blocks.add(block, sids[part], part_sizes, ts[part], opened=detail.n == len(part_sizes))
        count_appended(self.subjects, sids, seqs)
        self.msgs += len(seqs)
        self.bytes += int(sizes.sum())
        self.last_seq, self.last_ts = last, int(ts[-1])

    # -- removals: the blocks' and subjects' part is BlockRemovals' --------------------------

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
        removed, size = self.removals.many(seqs)
        self.msgs -= removed
        self.bytes -= size
        if removed:
            self._fix_first()
        return removed

    def _remove_one(self, seq: int) -> int:
        """`remove_many` of one sequence (a KV put past its history, a message delete) in scalars."""
        if not self.may_be_live(seq):
            return 0
        size = self.removals.one(seq)
        if size is None:
            return 0
        self.msgs -= 1
        self.bytes -= size
        self._fix_first()
        return 1

    def remove_range(self, first: int, last: int) -> int:
        """Removes every live message in [first, last]; whole blocks are settled from their summaries."""
        first, last = max(first, self.first_seq, 1), min(last, self.last_seq)
        if first > last or self.msgs == 0:
            return 0
        removed, size = self.removals.span(first, last)
        self.msgs -= removed
        self.bytes -= size
        self._fix_first()
        return removed

    def _fix_first(self) -> None:
        if self.msgs == 0:
            self.first_seq = self.last_seq + 1
            self.first_ts = 0
            self._drop_blocks_below(self.first_seq >> self._shift)
            return
        if self.first_seq >= 1 and self.is_live(self.first_seq):
            return
        start = max(self.first_seq, 1)
        if self.first_seq >= 1 and self.is_live(start + 1):  # the first message went alone (a KV put past its history): no block scan
            row = self.rows.row(start + 1)
            assert row is not None
            self.first_seq, self.first_ts = start + 1, row[2]
            self._drop_blocks_below((start + 1) >> self._shift)
            return
        found = self.rows.first_live(start)
        if found is None:
            raise AssertionError("index counts live messages but finds none")
        self.first_seq, self.first_ts = found
        self._drop_blocks_below(self.first_seq >> self._shift)

    def _drop_blocks_below(self, block: int) -> None:
        """Forgets the summaries and details of blocks wholly below the first live message."""
        dropped = self.blocks.drop_below(block)
        if dropped:
            self.details.forget(dropped)
            self.removed.discard(0, (self.blocks.base << self._shift) - 1)

    # -- flushing: the details' -----------------------------------------------------------------

    def seal(self, upto: int) -> None:
        """A flush is cut up to `upto` (see BlockDetails.seal)."""
        self.details.seal(upto)

    def mark_flushed(self, upto: int) -> None:
        """Rows at or below `upto` are in the table: the details of blocks wholly below may be evicted."""
        self.details.mark_flushed(upto)

    def drop_cached_details(self) -> int:
        """Forgets the details read back from the table or unpinned by flushes (a write load ended: the
        table holds them, and a read reads a block's back when it needs it), as nats-server drops an
        idle block's cache. The pinned details of unflushed blocks stay, and so does every detail of a
        stream without a table. Returns the bytes dropped."""
        return self.details.drop_cached()

    # -- reads by sequence ----------------------------------------------------------------------

    def may_be_live(self, seq: int) -> bool:
        """Whether `seq` is live if its row is stored: in range, in a block with live messages, not removed.
        Answered from the summaries, without reading the block's detail."""
        if seq < max(self.first_seq, 1) or seq > self.last_seq:
            return False
        block = seq >> self._shift
        blocks = self.blocks
        return blocks.has(block) and blocks.live[block - blocks.base] != 0 and not self.removed.contains(seq)

    def holds_detail(self, seq: int) -> bool:
        """Whether the detail of `seq`'s block is in memory (unflushed, or cached): reading it costs no I/O."""
        return self.details.holds(seq >> self._shift)

    def is_live(self, seq: int) -> bool:
        if not self.may_be_live(seq):
            return False
        detail = self.details.get(seq >> self._shift)
        n = detail.n
        i = int(detail.seqs[:n].searchsorted(seq))  # the method: no numpy dispatch wrapper per read
        return i < n and int(detail.seqs[i]) == seq

    def subject_of(self, seq: int) -> str:
        row = self.rows.row(seq)
        if row is None:
            raise KeyError(seq)
        return self.subjects.name(row[0])

    def ts_of(self, seq: int) -> int:
        row = self.rows.row(seq)
        if row is None:
            raise KeyError(seq)
        return row[2]

    def size_of(self, seq: int) -> int:
        row = self.rows.row(seq)
        if row is None:
            raise KeyError(seq)
        return row[1]

    def live_mask(self, seqs: np.ndarray) -> np.ndarray:
        """Which of `seqs` are live, vectorised."""
        return self.rows.live_mask(np.asarray(seqs, np.int64), self.first_seq, self.last_seq)

    def sizes_of(self, seqs: np.ndarray) -> np.ndarray:
        return self.rows.sizes_of(np.asarray(seqs, np.int64))

    def subjects_among(self, seqs: np.ndarray) -> list[str]:
        """The distinct subjects of live `seqs`."""
        return self.rows.subjects_among(np.asarray(seqs, np.int64))

    # -- reads by subject -----------------------------------------------------------------------

    def subject_state(self, subject: str) -> tuple[int, int, int]:
        """(msgs, first_seq, last_seq) of a literal subject; zeros if it has none."""
        return self.subjects.state(subject)

    @property
    def num_subjects(self) -> int:
        return self.subjects.live

    def subjects_state(self, filter_: str) -> dict[str, int]:
        return counts_matching(self.subjects, filter_)

    def subjects_page(self, filter_: str, offset: int, limit: int) -> tuple[dict[str, int], int]:
        """STREAM.INFO's subject paging (see subject_counts.counts_page)."""
        return counts_page(self.subjects, filter_, offset, limit)

    def iter_subject_states(self) -> Iterator[tuple[str, int, int, int]]:
        return self.subjects.iter_states()

    def live_seqs(self, filter_: str | list[str] | None = None, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Sorted live sequences in [start, stop) whose subject matches `filter_` (one or several; all when None)."""
        lo = max(start, self.first_seq, 1)
        hi = self.last_seq if stop is None else min(stop - 1, self.last_seq)
        if lo > hi or self.msgs == 0:
            return np.zeros(0, np.int64)
        return self.rows.seqs(self.masks.of(filter_), lo, hi)

    def count_live(self, filter_: str | list[str] | None = None, start: int = 0) -> int:
        """Live messages at or after `start` matching `filter_`: whole blocks from their summaries."""
        lo = max(start, self.first_seq, 1)
        if lo > self.last_seq or self.msgs == 0:
            return 0
        return self.rows.count_from(self.masks.of(filter_), lo)

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
        found = self.live_seqs(filter_, start=start, stop=((start >> self._shift) + 1) << self._shift)
        if len(found):
            return int(found[0])
        return self.rows.first_matching_past_block_of(self.masks.of(filter_), start)

    def oldest_seqs(self, subject: str, count: int) -> np.ndarray:
        """The `count` oldest live sequences of a literal subject, block by block from its first."""
        sid = self.subjects.find(subject)
        if sid < 0 or self.subjects.msgs[sid] == 0 or count <= 0:
            return np.zeros(0, np.int64)
        return self.rows.oldest_of(sid, min(count, int(self.subjects.msgs[sid])))

    # -- reads by time, count and size ----------------------------------------------------------

    def seq_at_or_after_time(self, ts: int) -> int:
        """First live sequence published at or after `ts` (timestamps never go back). A block whose detail
        is not in memory is searched in its stored sequences and times only (`time_seeker`)."""
        return self.rows.first_at_or_after_time(ts, self.first_seq, self.last_seq)

    def last_seq_before_time(self, ts: int) -> int:
        """The last live sequence stamped before `ts`, 0 if none: `max_age` removes up to it."""
        if self.msgs == 0 or self.first_ts >= ts:
            return 0
        return self.rows.last_before_time(ts)

    def nth_live_seq(self, n: int) -> int:
        """The n-th oldest live sequence (1-based), 0 if there are fewer: `max_msgs` removes up to it."""
        if n <= 0 or n > self.msgs:
            return 0
        return self.rows.nth(n)

    def seq_covering_bytes(self, amount: int) -> int:
        """The first live sequence at which the oldest live messages add up to `amount` bytes (`max_bytes`)."""
        if amount <= 0:
            return 0
        return self.rows.covering_bytes(amount, self.last_seq)

    @property
    def num_deleted(self) -> int:
        if self.msgs == 0 or self.first_seq == 0:
            return 0
        return self.last_seq - self.first_seq + 1 - self.msgs

    # -- persistence --------------------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        """The index without its details (which the table holds): summaries, subjects, removed ranges."""
        scalars = [self.block_size, self.first_seq, self.last_seq, self.first_ts, self.last_ts, self.msgs,
                   self.bytes, self.blocks.base, self.flushed_upto]
        return index_arrays.to_arrays(scalars, self.blocks, self.removed, self.subjects)

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], cache_bytes: int = DEFAULT_CACHE_BYTES) -> MessageIndex:
        scalars, blocks, removed, subjects = index_arrays.from_arrays(arrays)
        index = cls(scalars["block_size"], cache_bytes, subjects=subjects, removed=removed, blocks=blocks)
        index.first_seq, index.last_seq = scalars["first_seq"], scalars["last_seq"]
        index.first_ts, index.last_ts = scalars["first_ts"], scalars["last_ts"]
        index.msgs, index.bytes, index.flushed_upto = scalars["msgs"], scalars["bytes"], scalars["flushed_upto"]
        return index

    @property
    def memory_bytes(self) -> int:
        """What the index holds in memory: summaries, subjects, removed ranges and details."""
        return self.blocks.nbytes + self.removed.nbytes + self.subjects.nbytes + self.details.nbytes
