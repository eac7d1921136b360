"""Removing messages from the index's blocks: the removed rows are marked in the removed set and taken
from their blocks' summaries and their subjects' counts at once, so nothing is recomputed later.

A range removal (purge, expiry, limits) settles whole blocks from their summaries without reading them.
The stream-wide totals and first message are the index's: each removal here returns the messages and
bytes it removed. Without a table behind the details (a memory stream) removed rows leave them at once.
"""

from __future__ import annotations

import numpy as np

from engine.block_details import BlockDetails
from engine.block_rows import BlockRows
from engine.block_summaries import BlockSummaries, counted
from engine.seqset import SeqSet
from engine.subject_counts import uncount, uncount_one
from engine.subject_table import SubjectTable


class BlockRemovals:
    """Removals from the blocks of one index (see the module's docstring)."""

    def __init__(self, rows: BlockRows, removed: SeqSet, subjects: SubjectTable) -> None:
        self.shift = rows.shift
        self.rows = rows
        self.blocks: BlockSummaries = rows.blocks
        self.details: BlockDetails = rows.details
        self.removed = removed
        self.subjects = subjects

    def one(self, seq: int) -> int | None:
        """Removes `seq`, which the summaries say may be live, in scalars (a KV put past its history, a
        message delete: for one row numpy's per-call set-up costs far more than the work). Its size, or
        None if it has no stored row."""
        row = self.rows.row(seq)
        if row is None:
            return None
        sid, size, _ = row
        block = seq >> self.shift
        blocks = self.blocks
        slot = block - blocks.base
        self.removed.add(seq, seq)
        blocks.live[slot] -= 1
        blocks.bytes[slot] -= size
        hist = blocks.hists[slot]
        if hist.open is not None:
            hist.open[sid] -= 1
        else:
            hist.take(np.array([sid], np.int32), np.array([1], np.int32))
        uncount_one(self.subjects, sid, seq, self.rows)
        if self.details.loader is None:
            self.details.drop_removed(block, seq, seq)
        return size

    def many(self, seqs: np.ndarray) -> tuple[int, int]:
        """Removes the live ones among `seqs` (sorted, unique, within the stream's bounds), block by block:
        (messages, bytes) removed."""
        removed = size = 0
        cuts = np.flatnonzero(np.diff(seqs >> self.shift)) + 1
        for part in np.split(seqs, cuts):
            count, nbytes = self.in_block(int(part[0]) >> self.shift, part)
            removed += count
            size += nbytes
        return removed, size

    def in_block(self, block: int, seqs: np.ndarray) -> tuple[int, int]:
        """Removes the live ones among `seqs` (sorted, unique, all in `block`): (messages, bytes) removed."""
        blocks = self.blocks
        if not blocks.has(block) or blocks.live[block - blocks.base] == 0:
            return 0, 0
        rows, sids, sizes, _ = self.rows.live(block, int(seqs[0]), int(seqs[-1]))
        hit = np.isin(rows, seqs, assume_unique=True) if len(seqs) > 1 else rows == seqs[0]
        if not hit.any():
            return 0, 0
        rows, sids, sizes = rows[hit], sids[hit], sizes[hit]
        self.removed.add_many(rows)
        size = self._settle(block, rows, sids, sizes)
        if self.details.loader is None:
            self.details.drop_removed(block, int(rows[0]), int(rows[-1]))
        return len(rows), size

    def _settle(self, block: int, seqs: np.ndarray, sids: np.ndarray, sizes: np.ndarray) -> int:
        """Counts the removal of live rows of one block (already marked removed); returns their bytes."""
        slot = block - self.blocks.base
        size = int(sizes.sum())
        self.blocks.live[slot] -= len(seqs)
        self.blocks.bytes[slot] -= size
        unique, counts = counted(sids)
        self.blocks.hists[slot].take(unique, counts)
        uncount(self.subjects, unique, counts, int(seqs[0]), int(seqs[-1]), self.rows, seqs)
        return size

    def span(self, first: int, last: int) -> tuple[int, int]:
        """Removes every live message in [first, last] (within the stream's bounds): (messages, bytes)
        removed. Blocks wholly inside are settled from their summaries."""
        blocks = self.blocks
        removed = size = 0
        touched: dict[int, int] = {}
        lo_block, hi_block = first >> self.shift, last >> self.shift
        for block in range(max(lo_block, blocks.base), min(hi_block, blocks.stop - 1) + 1):
            slot = block - blocks.base
            if blocks.live[slot] == 0:
                continue
            lo, hi = block << self.shift, ((block + 1) << self.shift) - 1
            if lo < first or hi > last:
                rows, sids, sizes, _ = self.rows.live(block, max(lo, first), min(hi, last))
                if len(rows):
                    blocks.live[slot] -= len(rows)
                    blocks.bytes[slot] -= int(sizes.sum())
                    removed += len(rows)
                    size += int(sizes.sum())
                    unique, counts = counted(sids)
                    blocks.hists[slot].take(unique, counts)
                    _tally(touched, unique, counts)
                continue
            sids, counts = blocks.hists[slot].arrays()
            live = counts > 0
            _tally(touched, sids[live], counts[live])
            removed += int(blocks.live[slot])
            size += int(blocks.bytes[slot])
            blocks.live[slot] = blocks.bytes[slot] = 0
            blocks.hists[slot].take(sids[live], counts[live])
        self.removed.add(first, last)
        if self.details.loader is None:
            for block in list(self.details.pinned):
                if lo_block <= block <= hi_block:
                    self.details.drop_removed(block, first, last)
        if touched:
            sids = np.fromiter(touched.keys(), np.int32, len(touched))
            uncount(self.subjects, sids, np.fromiter(touched.values(), np.int64, len(touched)), first, last, self.rows)
        return removed, size


def _tally(touched: dict[int, int], sids: np.ndarray, counts: np.ndarray) -> None:
    for sid, count in zip(sids.tolist(), counts.tolist(), strict=True):
        touched[sid] = touched.get(sid, 0) + count
