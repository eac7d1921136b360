"""The summaries of the index's blocks: per block of consecutive sequences, its live messages and bytes,
first and last timestamp, and how many live messages each subject has there.

They let a read, a limit or a purge skip or settle whole blocks without their rows (engine/block_details.py).
Slot `i` of every array is block `base + i`: blocks wholly below the stream's first message are dropped.
"""

from __future__ import annotations

import numpy as np


def counted(sids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct subject ids among `sids` and how many times each occurs."""
    if len(sids) == 1 or (sids == sids[0]).all():
        return sids[:1].astype(np.int32), np.array([len(sids)], np.int64)
    unique, counts = np.unique(sids, return_counts=True)
    return unique.astype(np.int32), counts.astype(np.int64)


class BlockHistogram:
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

    @property
    def nbytes(self) -> int:
        return self.sids.nbytes + self.counts.nbytes + (100 * len(self.open) if self.open is not None else 0)


class BlockSummaries:
    """The summaries of blocks `base` to `stop - 1` (see the module's docstring); the arrays are read and
    updated in place by the index, whose appends and removals keep them."""

    __slots__ = ("shift", "base", "live", "bytes", "first_ts", "last_ts", "hists")

    def __init__(self, shift: int) -> None:
        self.shift = shift
        self.base = 0  # block number of slot 0
        self.live = np.zeros(0, np.int64)
        self.bytes = np.zeros(0, np.int64)
        self.first_ts = np.zeros(0, np.int64)
        self.last_ts = np.zeros(0, np.int64)
        self.hists: list[BlockHistogram] = []

    @property
    def stop(self) -> int:
        """One past the last block summarised."""
        return self.base + len(self.live)

    def has(self, block: int) -> bool:
        return self.base <= block < self.base + len(self.live)

    def ensure(self, block: int) -> None:
        """Makes room for summaries up to `block` (new blocks start empty)."""
        if not len(self.live):
            self.base = block
        need = block - self.base + 1
        if need <= len(self.live):
            return
        grow = need - len(self.live)
        last_ts = int(self.last_ts[-1]) if len(self.last_ts) else 0
        self.live = np.concatenate((self.live, np.zeros(grow, np.int64)))
        self.bytes = np.concatenate((self.bytes, np.zeros(grow, np.int64)))
        self.first_ts = np.concatenate((self.first_ts, np.full(grow, last_ts, np.int64)))
        self.last_ts = np.concatenate((self.last_ts, np.full(grow, last_ts, np.int64)))
        for hist in self.hists[-1:]:
            hist.close()
        self.hists.extend(BlockHistogram() for _ in range(grow))

    def written_hist(self, slot: int) -> BlockHistogram:
        """The histogram an append adds to: only the last block's is a dict (see BlockHistogram)."""
        hist = self.hists[slot]
        if hist.open is None and slot == len(self.hists) - 1:
            hist.reopen()
        return hist

    def add(self, block: int, sids: np.ndarray, sizes: np.ndarray, ts: np.ndarray, opened: bool) -> None:
        """Counts rows appended to `block` (`opened`: they are its first)."""
        slot = block - self.base
        self.live[slot] += len(sizes)
        self.bytes[slot] += int(sizes.sum())
        if opened:
            self.first_ts[slot] = int(ts[0])
        self.last_ts[slot] = int(ts[-1])
        unique, counts = counted(sids)
        self.written_hist(slot).add(unique, counts)

    def matching_live(self, block: int, mask: np.ndarray | None) -> int:
        """Live messages of `block` whose subject is in `mask` (all when None)."""
        slot = block - self.base
        if self.live[slot] == 0:
            return 0
        return int(self.live[slot]) if mask is None else self.hists[slot].matching(mask)

    def drop_below(self, block: int) -> range:
        """Forgets the summaries of blocks below `block`; returns the blocks dropped."""
        drop = min(block - self.base, len(self.live))
        if drop <= 0:
            return range(0)
        self.live, self.bytes = self.live[drop:], self.bytes[drop:]
        self.first_ts, self.last_ts = self.first_ts[drop:], self.last_ts[drop:]
        del self.hists[:drop]
        self.base += drop
        return range(self.base - drop, self.base)

    def to_arrays(self) -> dict[str, np.ndarray]:
        hists = [h.arrays() for h in self.hists]
        lengths = np.array([len(sids) for sids, _ in hists], np.int64)
        return {
            "block_live": self.live.copy(),
            "block_bytes": self.bytes.copy(),
            "block_first_ts": self.first_ts.copy(),
            "block_last_ts": self.last_ts.copy(),
            "hist_offsets": np.concatenate(([0], np.cumsum(lengths))).astype(np.int64),
            "hist_sids": np.concatenate([s for s, _ in hists]).astype(np.int32) if hists else np.zeros(0, np.int32),
            "hist_counts": np.concatenate([c for _, c in hists]).astype(np.int32) if hists else np.zeros(0, np.int32),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], shift: int, base: int) -> BlockSummaries:
        blocks = cls(shift)
        blocks.base = base
        blocks.live = arrays["block_live"].astype(np.int64, copy=False)
        blocks.bytes = arrays["block_bytes"].astype(np.int64, copy=False)
        blocks.first_ts = arrays["block_first_ts"].astype(np.int64, copy=False)
        blocks.last_ts = arrays["block_last_ts"].astype(np.int64, copy=False)
        offsets = arrays["hist_offsets"]
        sids, counts = arrays["hist_sids"].astype(np.int32, copy=False), arrays["hist_counts"].astype(np.int32, copy=False)
        for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            hist = BlockHistogram()
            hist.open = None
            order = np.argsort(sids[a:b], kind="stable")
            hist.sids, hist.counts = sids[a:b][order], counts[a:b][order]
            blocks.hists.append(hist)
        return blocks

    @property
    def nbytes(self) -> int:
        return int(self.live.nbytes * 4 + 100 * len(self.hists)) + sum(h.nbytes for h in self.hists)
