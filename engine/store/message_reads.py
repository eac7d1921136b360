"""A file stream's message reads: the live messages the index names, from memory (the buffer of
unflushed and recent messages) first, then from the table (table_reads.py), a window ahead for consumers.
"""

from __future__ import annotations

import bisect
import logging

import numpy as np

from engine.errors import JetStreamError
from engine.index import MessageIndex
from engine.store.base import StoredMessage
from engine.store.layout import Partitioner
from engine.store.memory import MessageBuffer
from engine.store.table_reads import READ_AHEAD, READ_WINDOW_BYTES, TableReads

log = logging.getLogger(__name__)


class MessageReads:
    """Reads of one stream's messages; `unopened` holds the replayed ones whose values would not open."""

    # one per stream beside its store (thousands of streams): no instance dict
    __slots__ = ("stream", "buffer", "reads", "partitioner", "unopened")

    def __init__(self, stream: str, buffer: MessageBuffer, reads: TableReads, partitioner: Partitioner,
                 unopened: dict[int, JetStreamError]) -> None:
        self.stream = stream
        self.buffer = buffer
        self.reads = reads
        self.partitioner = partitioner
        self.unopened = unopened

    def load(self, seq: int, index: MessageIndex, subject: str | None = None) -> StoredMessage | None:
        """The live message `seq`, or None. A flushed message whose block detail is not in memory is
        read from the table without that detail: the summaries say it would be live (in range, not
        removed), and its row in the table says it is stored (the detail is read from those rows).
        `subject`, when the caller knows it, spares reading the detail for the file's partition and
        decoding the row group's subjects."""
        if not index.may_be_live(seq):
            return None
        resident = index.holds_detail(seq)
        if resident and not index.is_live(seq):
            return None
        if seq in self.unopened:
            raise self.unopened[seq]
        msg = self.buffer.get(seq)
        if msg is not None:
            return msg
        if subject is None and resident:
            subject = index.subject_of(seq)
        try:
            return self.reads.message(seq, lambda: index.subject_of(seq), subject)
        except KeyError:  # the block's detail holds no row `seq`: never stored (a gap)
            return None

    def load_many(self, seqs: list[int], index: MessageIndex) -> dict[int, StoredMessage]:
        """Live messages among `seqs` (ascending). Misses read the table a window ahead, for consumers.

        A message of an encrypted stream whose values do not open is left out and logged (a direct
        get answers its error)."""
        if not self.unopened or self.unopened.keys().isdisjoint(seqs):
            try:
                return self._load_many(seqs, index)
            except JetStreamError:
                pass
        found: dict[int, StoredMessage] = {}
        for seq in seqs:
            try:
                msg = self.load(seq, index)
            except JetStreamError as exc:
                log.error("stream %s: message %d cannot be read: %s", self.stream, seq, exc.description)
                continue
            if msg is not None:
                found[seq] = msg
        return found

    def _load_many(self, seqs: list[int], index: MessageIndex) -> dict[int, StoredMessage]:
        live = index.live_mask(np.array(seqs, np.int64)).tolist()
        found, rest = self.buffer.get_many([seq for seq, ok in zip(seqs, live) if ok])
        if not rest:
            return found
        held, misses = self.reads.windowed_many(rest)
        found.update(held)
        i = 0
        while i < len(misses):
            lo = misses[i]
            hi = self._window_end(lo, max(misses[-1], lo + READ_AHEAD), index)
            seqs_in = index.live_seqs(start=lo, stop=hi + 1)
            self.reads.read_window(lo, hi, {self.partitioner(s) for s in index.subjects_among(seqs_in)})
            stop = bisect.bisect_right(misses, hi, i)
            held, missing = self.reads.windowed_many(misses[i:stop])
            found.update(held)
            for seq in missing:
                msg = self.load(seq, index)
                if msg is not None:
                    found[seq] = msg
            i = stop
        return {seq: found[seq] for seq in seqs if seq in found}  # in sequence order, as asked

    @staticmethod
    def _window_end(lo: int, hi: int, index: MessageIndex) -> int:
        """`hi`, or less so that a window of large messages stays within READ_WINDOW_BYTES."""
        seqs = index.live_seqs(start=lo, stop=hi + 1)
        if not len(seqs):
            return hi
        cut = int(np.searchsorted(np.cumsum(index.sizes_of(seqs)), READ_WINDOW_BYTES, side="right"))
        return hi if cut >= len(seqs) else int(seqs[max(cut - 1, 0)])
