"""A file stream's recovery at a restart: its index from the snapshot (or the table), the tombstones
and the write-ahead log, and the log's unflushed records back in memory.

With a snapshot the table is read only for what was flushed after it, and tombstones only where the
snapshot does not already hold them removed; without one (an older warehouse, a damaged file) the
index is rebuilt from the table's `seq`, `subject`, `size` and `ts` columns, a window at a time. The
log's torn tail is cut and damage inside it read past (wal.py). Each log record is applied exactly
once: the tables' app transactions say which ones they hold already.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.errors import JetStreamError
from engine.index import MessageIndex
from engine.seqset import SeqSet
from engine.store.base import Recovered
from engine.store.commits import latest_version
from engine.store.delta_log import TableNotFoundError, log_of
from engine.store.flush_commits import FlushCommitter
from engine.store.index_snapshots import IndexSnapshots
from engine.store.layout import PARTITION_COLUMN, Partitioner
from engine.store.memory import MessageBuffer
from engine.store.object_log import ObjectLog
from engine.store.removal_records import KIND_REMOVE, decode_removal
from engine.store.rows import KIND_ARROW, KIND_PACKED, RowGroup, Rows, decode
from engine.store.sealed import SEALED_KINDS, Sealer
from engine.store.table_reads import TableReads
from engine.store.tombstones import TombstoneView
from engine.store.unflushed import Unflushed
from engine.store.wal import Record, WriteAheadLog

log = logging.getLogger(__name__)

REBUILD_WINDOW = 1 << 20  # sequences read at a time when the index is rebuilt from the table


def _partition_values(rows: RowGroup) -> set[str]:
    if isinstance(rows, Rows):
        return set(rows.partitions)
    return set(pc.unique(rows.to_arrow().column(PARTITION_COLUMN)).to_pylist())


class StreamRecovery:
    """One recovery of one stream's store; it fills the store's parts it is given."""

    def __init__(
        self,
        stream: str,
        stream_id: str,
        wal: WriteAheadLog | ObjectLog,
        buffer: MessageBuffer,
        partitioner: Partitioner,
        reads: TableReads,
        snapshots: IndexSnapshots,
        committer: FlushCommitter,
        unflushed: Unflushed,
        new_index: Callable[[], MessageIndex],
        tombstones: Callable[[], TombstoneView],
        sealer: Sealer | None,
        unopened: dict[int, JetStreamError],
    ) -> None:
        self.stream = stream
        self.stream_id = stream_id
        self.table = committer.table
        self.wal = wal
        self.buffer = buffer
        self.partitioner = partitioner
        self.reads = reads
        self.snapshots = snapshots
        self.committer = committer
        self.unflushed = unflushed
        self.new_index = new_index
        self.tombstones = tombstones  # the account's view, or the table read: called once
        self.sealer = sealer
        self.unopened = unopened  # replayed messages whose values would not open, filled here

    def recover(self, msg_id_since_ns: int) -> Recovered:
        """Rebuilds the index from its snapshot (or the table), the tombstones and the log. The next
        sequence is after the highest one any of them holds, so no sequence is given twice. Segments
        whose every record is already in the tables (a crash between a commit and their removal) are
        removed at once."""
        recovered = Recovered()
        flushed_seq = 0
        snapshot = self.snapshots.read()
        current = snapshot is not None and self.snapshots.is_current(snapshot[0])
        if current:
            assert snapshot is not None
            self.committer.version = snapshot[0]["table_version"]
        else:
            self.committer.version = latest_version(self.table)
        has_table = self.committer.version is not None
        snapshot = snapshot if has_table else None
        if current:
            assert snapshot is not None
            flushed_seq = snapshot[0]["flushed_seq"]
        elif has_table:
            try:
                flushed_seq = log_of(self.table).state().transaction_version(self.stream_id)
            except TableNotFoundError:
                has_table = False
        index, covered = self.snapshots.index_from(snapshot, flushed_seq) if has_table else (None, None)
        if index is None:
            index = self.new_index()
        msg_ids, last_msg_id = (None, None)
        if current and snapshot:
            msg_ids, last_msg_id = self.snapshots.msg_ids(snapshot, msg_id_since_ns)
        if has_table and not current:
            self.partitioner.learn(self.reads.partitions())
            self._read_table_into(index, flushed_seq)
            self.snapshots.request()  # the next flush or close writes a snapshot the next start can trust
        if msg_ids is not None:
            recovered.msg_ids, recovered.last_msg_id = msg_ids, last_msg_id
        elif has_table:
            recovered.msg_ids, recovered.last_msg_id = self.reads.recent_msg_ids(msg_id_since_ns)
        index.mark_flushed(flushed_seq)
        applied_lsn = int(snapshot[0].get("lsn", 0)) if covered is not None and snapshot is not None else 0
        tomb_lsn, last_seq = self._apply_tombstones(index, covered, applied_lsn)
        self.committer.tombstone_lsn = tomb_lsn
        grouped, segments = self.wal.recover_segments()
        self.wal.next_lsn = max(self.wal.next_lsn, tomb_lsn + 1)
        in_tables: list[Path | str] = []
        for path, records in zip(segments, grouped, strict=True):
            flushed = True
            for record in records:
                seq, done = self._replay(record, flushed_seq, tomb_lsn, index, msg_id_since_ns, recovered)
                last_seq = max(last_seq, seq)
                flushed = flushed and done
            if flushed:
                in_tables.append(path)
        last_seq = max(last_seq, flushed_seq) + self._sequences_maybe_lost()
        if last_seq > index.last_seq:
            index.skip_to(last_seq + 1)
        self.buffer.flushed_upto = flushed_seq
        if self.unflushed.has_pending():
            self.unflushed.oldest = time.monotonic()
        if in_tables:
            self._remove_flushed(in_tables)
        recovered.index = index
        return recovered

    def _sequences_maybe_lost(self) -> int:
        """How many sequences a damaged last record of the log may have held (no later record bounds
        them): skipped, so that none is given twice. A sequence takes at least 8 bytes in any record."""
        lost = sum(d.length // 8 for d in self.wal.damage if d.tail and d.written)
        if lost:
            log.error("stream %s: the damaged last log record may have held up to %d messages; their "
                      "sequences are skipped", self.stream, lost)
        return lost

    def _read_table_into(self, index: MessageIndex, flushed_seq: int) -> None:
        """Appends the table's rows above the index's last sequence (all of them without a snapshot),
        a window of sequences at a time, so memory holds one window's columns, never the table's."""
        low, high = self.reads.seq_bounds()
        start = max(index.last_seq + 1, low, 1)
        high = max(high, flushed_seq) if low else 0
        started, rows = time.monotonic(), 0
        for lo in range(start, high + 1, REBUILD_WINDOW):
            hi = min(lo + REBUILD_WINDOW - 1, high)
            seqs, subjects, sizes, ts = self.reads.index_rows(lo, hi)
            keep = seqs > index.last_seq
            if not keep.all():
                seqs, subjects, sizes, ts = seqs[keep], subjects.filter(pa.array(keep)), sizes[keep], ts[keep]
            index.append_rows(seqs, subjects, sizes, ts)
            index.mark_flushed(hi)  # their details may be evicted: the rebuild holds one window at a time
            rows += len(seqs)
        if rows:
            log.info("stream %s: %d messages read from the table into the index in %.2fs", self.stream, rows,
                     time.monotonic() - started)

    def _remove_flushed(self, segments: list[Path | str]) -> None:
        """Removes log segments a commit of an earlier run replaced (made durable first under sync)."""
        self.committer.ensure_durable()
        log.info("stream %s: removing %d log segment(s) already committed to the tables", self.stream, len(segments))
        self.wal.remove(segments)

    def _apply_tombstones(self, index: MessageIndex, covered: SeqSet | None, applied_lsn: int) -> tuple[int, int]:
        """Removes the tombstoned ranges (the parts a snapshot does not already count as removed). When
        every tombstone of the stream comes from a log record at or below `applied_lsn` (the snapshot's:
        its index had applied them all in memory) there is nothing to remove; the removed set alone
        cannot say so, since rows removed before their flush never reached the table nor that set."""
        mine = self.tombstones().for_stream(self.stream_id)
        if covered is not None and mine.lsn <= applied_lsn:
            return mine.lsn, mine.last_seq
        for first, last in mine.ranges():
            for a, b in covered.uncovered(first, last) if covered is not None else [(first, last)]:
                index.remove_range(a, b)
        return mine.lsn, mine.last_seq

    def _replay(
        self, record: Record, flushed_seq: int, tomb_lsn: int, index: MessageIndex, since_ns: int, recovered: Recovered
    ) -> tuple[int, bool]:
        """Applies a log record; returns the last sequence it names and whether the tables hold it already."""
        if record.kind in (KIND_ARROW, KIND_PACKED, *SEALED_KINDS):
            rows = self._decode(record)
            if rows.last_seq <= flushed_seq:
                return rows.last_seq, True
            new = max(index.last_seq + 1 - rows.first_seq, 0)
            if new < len(rows):
                index.append_rows(
                    np.arange(rows.first_seq + new, rows.last_seq + 1, dtype=np.int64), list(rows.subjects[new:]),
                    np.asarray(rows.sizes[new:], np.int64), np.asarray(rows.ts[new:], np.int64),
                )
            for i, (t, msg_id) in enumerate(zip(rows.ts, rows.msg_ids, strict=True)):
                if msg_id and t >= since_ns:
                    recovered.msg_ids.append((msg_id, rows.first_seq + i, t))
            recovered.last_msg_id = rows.msg_ids[-1]
            self.partitioner.learn(_partition_values(rows))
            self.buffer.add(rows)
            self.unflushed.bytes += rows.nbytes
            return rows.last_seq, False
        if record.kind == KIND_REMOVE:
            removal = decode_removal(record.payload)
            if record.lsn > tomb_lsn:
                for first, last in removal.ranges:
                    index.remove_range(first, last)
                if removal.last_seq > index.last_seq:
                    index.skip_to(removal.last_seq + 1)
                self.unflushed.removals.append((record.lsn, removal))
            return removal.last_seq, record.lsn <= tomb_lsn
        raise RuntimeError(f"unknown write-ahead log record kind {record.kind}")

    def _decode(self, record: Record) -> RowGroup:
        if record.kind not in SEALED_KINDS:
            return decode(record.kind, record.payload)
        if self.sealer is None:
            raise RuntimeError(f"stream {self.stream}: its log holds encrypted records and no key was given")
        rows, unopened = self.sealer.decode(record.kind, record.payload)
        self.unopened.update(unopened)
        return rows
