"""Finding the index's rows block by block: by sequence, subject, time, count or bytes.

The summaries (engine/block_summaries.py) say which blocks hold what is sought, so only those blocks'
details (engine/block_details.py) are read; the removed set says which of their rows are live. The
stream-wide bounds (first and last sequence) are the index's: its callers clip to them first.
"""

from __future__ import annotations

import numpy as np

from engine.block_details import BlockDetails
from engine.block_summaries import BlockSummaries
from engine.seqset import SeqSet
from engine.subject_masks import masked
from engine.subject_table import SubjectTable

LiveRows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # seqs, sids, sizes, ts


class BlockRows:
    """Searches over the rows of the blocks that `blocks` summarises and `details` holds."""

    def __init__(self, blocks: BlockSummaries, details: BlockDetails, removed: SeqSet, subjects: SubjectTable) -> None:
        self.shift = blocks.shift
        self.blocks = blocks
        self.details = details
        self.removed = removed
        self.subjects = subjects

    def _span(self, block: int) -> tuple[int, int]:
        return block << self.shift, ((block + 1) << self.shift) - 1

    def live(self, block: int, lo: int, hi: int) -> LiveRows:
        """The live rows of a block within [lo, hi]: (seqs, sids, sizes, ts)."""
        seqs, sids, sizes, ts = self.details.get(block).view()
        a, b = np.searchsorted(seqs, [lo, hi + 1])
        seqs, sids, sizes, ts = seqs[a:b], sids[a:b], sizes[a:b], ts[a:b]
        alive = ~self.removed.mask(seqs)
        if alive.all():
            return seqs, sids, sizes, ts
        return seqs[alive], sids[alive], sizes[alive], ts[alive]

    def row(self, seq: int) -> tuple[int, int, int] | None:
        """(subject id, size, ts) of a stored row, live or not."""
        block = seq >> self.shift
        if not self.blocks.has(block):
            return None
        seqs, sids, sizes, ts = self.details.get(block).view()
        i = int(seqs.searchsorted(seq))
        if i < len(seqs) and int(seqs[i]) == seq:
            return int(sids[i]), int(sizes[i]), int(ts[i])
        return None

    def columns(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(present, sids, sizes) of sorted `seqs`: whether each has a stored row, and its subject and size."""
        present = np.zeros(len(seqs), np.bool_)
        sids = np.zeros(len(seqs), np.int32)
        sizes = np.zeros(len(seqs), np.int64)
        if not len(seqs):
            return present, sids, sizes
        blocks = seqs >> self.shift
        starts = np.concatenate(([0], np.flatnonzero(np.diff(blocks)) + 1, [len(seqs)]))
        for a, b in zip(starts[:-1].tolist(), starts[1:].tolist(), strict=True):
            block = int(blocks[a])
            if not self.blocks.has(block):
                continue
            rows, row_sids, row_sizes, _ = self.details.get(block).view()
            i = np.searchsorted(rows, seqs[a:b])
            i_clipped = np.minimum(i, max(len(rows) - 1, 0))
            hit = (i < len(rows)) & (rows[i_clipped] == seqs[a:b]) if len(rows) else np.zeros(b - a, np.bool_)
            present[a:b] = hit
            sids[a:b][hit] = row_sids[i_clipped[hit]]
            sizes[a:b][hit] = row_sizes[i_clipped[hit]]
        return present, sids, sizes

    def live_mask(self, seqs: np.ndarray, first_seq: int, last_seq: int) -> np.ndarray:
        """Which of `seqs` (int64) are live, vectorised; `first_seq` and `last_seq` are the stream's."""
        if not len(seqs):
            return np.zeros(0, np.bool_)
        order = np.argsort(seqs, kind="stable")
        ordered = seqs[order]
        inside = (ordered >= max(first_seq, 1)) & (ordered <= last_seq)
        present = np.zeros(len(seqs), np.bool_)
        if inside.any():
            present[inside] = self.columns(ordered[inside])[0]
        present &= ~self.removed.mask(ordered)
        out = np.zeros(len(seqs), np.bool_)
        out[order] = present
        return out

    def sizes_of(self, seqs: np.ndarray) -> np.ndarray:
        """The stored sizes of `seqs` (int64, any order), 0 for those without a row."""
        order = np.argsort(seqs, kind="stable")
        sizes = np.zeros(len(seqs), np.int64)
        sizes[order] = self.columns(seqs[order])[2]
        return sizes

    def subjects_among(self, seqs: np.ndarray) -> list[str]:
        """The distinct subjects of the stored rows of `seqs` (int64, any order)."""
        present, sids, _ = self.columns(np.sort(seqs))
        return self.subjects.names(np.unique(sids[present]))

    def seqs(self, mask: np.ndarray | None, lo: int, hi: int) -> np.ndarray:
        """Sorted live sequences in [lo, hi] whose subject `mask` selects (all when None)."""
        out: list[np.ndarray] = []
        for block in range(max(lo >> self.shift, self.blocks.base), min(hi >> self.shift, self.blocks.stop - 1) + 1):
            if self.blocks.matching_live(block, mask) == 0:
                continue
            rows, sids, _, _ = self.live(block, lo, hi)
            if mask is not None:
                rows = rows[masked(mask, sids)]
            if len(rows):
                out.append(rows)
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def count_from(self, mask: np.ndarray | None, lo: int) -> int:
        """Live messages at or after `lo` that `mask` selects: whole blocks from their summaries."""
        blocks = self.blocks
        first_block = max(lo >> self.shift, blocks.base)
        total = 0
        if first_block < blocks.stop and blocks.matching_live(first_block, mask):
            rows, sids, _, _ = self.live(first_block, lo, self._span(first_block)[1])
            total += len(rows) if mask is None else int(masked(mask, sids).sum())
        rest = range(first_block + 1, blocks.stop)
        if mask is None:
            return total + int(blocks.live[rest.start - blocks.base:].sum()) if len(rest) else total
        if len(rest) > len(blocks.live) // 2:
            before = sum(blocks.matching_live(b, mask) for b in range(blocks.base, first_block + 1))
            return int(self.subjects.msgs[: len(mask)][mask].sum()) - before + total
        return total + sum(blocks.matching_live(b, mask) for b in rest)

    def first_matching_past_block_of(self, mask: np.ndarray | None, seq: int) -> int:
        """The first live sequence `mask` selects in the blocks after `seq`'s; 0 if none."""
        for block in range(max((seq >> self.shift) + 1, self.blocks.base), self.blocks.stop):
            if self.blocks.matching_live(block, mask):
                rows, block_sids, _, _ = self.live(block, *self._span(block))
                rows = rows[masked(mask, block_sids)] if mask is not None else rows
                if len(rows):
                    return int(rows[0])
        return 0

    def next_of(self, sid: int, after: int) -> int:
        """The first live sequence of subject `sid` after `after` (0 if none)."""
        blocks = self.blocks
        for block in range(max(after >> self.shift, blocks.base), blocks.stop):
            slot = block - blocks.base
            if blocks.live[slot] == 0 or blocks.hists[slot].count(sid) <= 0:
                continue
            rows, sids, _, _ = self.live(block, after + 1, self._span(block)[1])
            rows = rows[sids == sid]
            if len(rows):
                return int(rows[0])
        return 0

    def prev_of(self, sid: int, before: int) -> int:
        """The last live sequence of subject `sid` before `before` (0 if none)."""
        blocks = self.blocks
        for block in range(min(before >> self.shift, blocks.stop - 1), blocks.base - 1, -1):
            slot = block - blocks.base
            if blocks.live[slot] == 0 or blocks.hists[slot].count(sid) <= 0:
                continue
            rows, sids, _, _ = self.live(block, self._span(block)[0], before - 1)
            rows = rows[sids == sid]
            if len(rows):
                return int(rows[-1])
        return 0

    def oldest_of(self, sid: int, want: int) -> np.ndarray:
        """The `want` oldest live sequences of subject `sid` (which has at least that many), block by
        block from its first."""
        blocks = self.blocks
        out: list[np.ndarray] = []
        got = 0
        for block in range(max(int(self.subjects.first[sid]) >> self.shift, blocks.base), blocks.stop):
            slot = block - blocks.base
            if blocks.live[slot] == 0 or blocks.hists[slot].count(sid) <= 0:
                continue
            rows, sids, _, _ = self.live(block, *self._span(block))
            rows = rows[sids == sid][: want - got]
            out.append(rows)
            got += len(rows)
            if got >= want:
                break
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def first_live(self, start: int) -> tuple[int, int] | None:
        """(seq, ts) of the first live message at or after `start`; None if there is none."""
        blocks = self.blocks
        for block in range(max(start >> self.shift, blocks.base), blocks.stop):
            if blocks.live[block - blocks.base] == 0:
                continue
            rows, _, _, ts = self.live(block, start, self._span(block)[1])
            if len(rows):
                return int(rows[0]), int(ts[0])
        return None

    def first_at_or_after_time(self, ts: int, first_seq: int, last_seq: int) -> int:
        """First live sequence in [first_seq, last_seq] published at or after `ts` (timestamps never go
        back). A block whose detail is not in memory is searched in its stored sequences and times only
        (the details' `time_seeker`)."""
        blocks, details = self.blocks, self.details
        for slot in np.flatnonzero((blocks.live != 0) & (blocks.last_ts >= ts)).tolist():
            block = blocks.base + slot
            lo, hi = self._span(block)
            if details.time_seeker is not None and not details.holds(block):
                found = details.time_seeker(max(lo, first_seq, 1), min(hi, last_seq), ts, self._unremoved)
                if found:
                    return found
                continue
            rows, _, _, row_ts = self.live(block, lo, hi)
            hit = np.flatnonzero(row_ts >= ts)
            if len(hit):
                return int(rows[hit[0]])
        return 0

    def _unremoved(self, seqs: np.ndarray) -> np.ndarray:
        return ~self.removed.mask(seqs)

    def last_before_time(self, ts: int) -> int:
        """The last live sequence stamped before `ts`, 0 if none."""
        blocks = self.blocks
        best = 0
        for block in range(blocks.base, blocks.stop):
            slot = block - blocks.base
            if blocks.live[slot] == 0:
                continue
            if blocks.first_ts[slot] >= ts:
                break
            rows, _, _, row_ts = self.live(block, *self._span(block))
            below = np.flatnonzero(row_ts < ts)
            if len(below):
                best = int(rows[below[-1]])
            if len(below) < len(rows):
                break
        return best

    def nth(self, n: int) -> int:
        """The n-th oldest live sequence (1-based, n > 0), 0 if there are fewer."""
        blocks = self.blocks
        seen = 0
        for block in range(blocks.base, blocks.stop):
            live = int(blocks.live[block - blocks.base])
            if seen + live < n:
                seen += live
                continue
            rows = self.live(block, *self._span(block))[0]
            return int(rows[n - seen - 1])
        return 0

    def covering_bytes(self, amount: int, otherwise: int) -> int:
        """The first live sequence at which the oldest live messages add up to `amount` (> 0) bytes;
        `otherwise` if they all add up to less."""
        blocks = self.blocks
        seen = 0
        for block in range(blocks.base, blocks.stop):
            size = int(blocks.bytes[block - blocks.base])
            if seen + size < amount:
                seen += size
                continue
            rows, _, sizes, _ = self.live(block, *self._span(block))
            cut = int(np.searchsorted(np.cumsum(sizes), amount - seen, side="left"))
            return int(rows[min(cut, len(rows) - 1)])
        return otherwise
