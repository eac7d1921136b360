"""A flush of one file stream: the job it seals, and its commit to the stream's table and the tombstones table.

The messages go to the stream's table in small row groups, in the Parquet layout below (written by
data_files.py, committed by delta_log.py); the removals go to the shared tombstones table, versioned by log
sequence number. Both commits carry their Delta app transaction (commits.py), so a job committed
again after a crash or a failed call lands once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.store.base import Removal
from engine.store.commits import TableCommitter
from engine.store.data_files import FileEncoding
from engine.store.delta_actions import Txn
from engine.store.layout import STREAM_SCHEMA, TOMBSTONE_SCHEMA, Layout, TableLocation
from engine.store.lease import commit_lease
from engine.store.leases import Lease
from engine.store.rows import RowGroup, Rows
from engine.store.sealed import Sealer
from engine.store.table_reads import TableReads

FENCE_APP_ID = "owner-token"  # the stream lease token of the last commit (several gateways)

ROW_GROUP_ROWS = 1024  # small row groups: a read by sequence decodes 1,024 rows (~0.3 ms), not a whole file
ROW_GROUP_BYTES = 8 * 1024 * 1024  # and few enough bytes that a read of a large message stays small


@dataclass
class FlushJob:
    """What one flush moves from the log to the tables, sealed under the stream's lock."""

    messages: pa.Table | None
    last_msg_seq: int
    removals: list[tuple[int, Removal]]
    last_seq: int
    segments: list[Path] | list[str]  # sealed local segments, or log objects
    buffered_upto: int
    since: float | None = None  # monotonic time of its oldest append
    messages_committed: bool = False
    snapshot: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None  # the index once this job is in
    rows: int = 0  # messages it carries (`messages` goes once committed)


def flush_table(groups: list[RowGroup]) -> pa.Table:
    """The flush's Arrow table: large groups reuse the batch their log record built."""
    batches = [g.to_arrow() for g in groups if g._arrow is not None or len(g) >= 64]
    if len(batches) == len(groups):
        return pa.Table.from_batches(batches, schema=STREAM_SCHEMA)
    merged = Rows(0, [], [], [], [], [], [], [])
    out: list[pa.RecordBatch] = []
    for g in groups:
        if g._arrow is not None:
            if merged.subjects:
                out.append(merged.to_arrow())
                merged = Rows(0, [], [], [], [], [], [], [])
            out.append(g._arrow)
            continue
        if not merged.subjects:
            merged.first_seq = g.first_seq
        elif merged.last_seq + 1 != g.first_seq:
            out.append(merged.to_arrow())
            merged = Rows(g.first_seq, [], [], [], [], [], [], [])
        for column in ("subjects", "ts", "msg_ids", "headers", "data", "sizes", "partitions"):
            getattr(merged, column).extend(getattr(g, column))
    if merged.subjects:
        out.append(merged.to_arrow())
    return pa.Table.from_batches(out, schema=STREAM_SCHEMA)


def _row_group_rows(table: pa.Table) -> int:
    """Rows per row group: ROW_GROUP_ROWS, fewer for large messages (object chunks) to bound a group's bytes."""
    average = max(table.nbytes // max(table.num_rows, 1), 1)
    return int(min(ROW_GROUP_ROWS, max(16, ROW_GROUP_BYTES // average)))


def message_encoding(rows: pa.Table) -> FileEncoding:
    """Small row groups, in sequence order, so a read by sequence decodes one; `seq` delta-encoded
    (ascending unique integers: a dictionary of them is larger than the column, and each small group
    would repeat it); no Parquet statistics on payloads (each row group's footer entry would carry two
    payloads; nothing prunes by them)."""
    return FileEncoding(row_group_rows=_row_group_rows(rows), compression="snappy",
                         delta_encoded=frozenset({"seq"}), no_statistics=frozenset({"data"}))


def sealed_message_encoding(rows: pa.Table) -> FileEncoding:
    """An encrypted stream's (sealed.py): its sealed columns are ciphertext, distinct per value and
    incompressible, so they get no dictionary (built for most of each row group, then dropped) and no
    statistics, and the files no compression (the sealed values are nearly all of their bytes).
    Measured on 20,000 1 KiB messages: 1.7 µs of CPU per message against 2.5, files 1.4 % larger."""
    protected = pa.types.is_binary(rows.schema.field("subject").type)
    sealed = frozenset({"data", "headers", *(["subject"] if protected else [])})
    return FileEncoding(row_group_rows=_row_group_rows(rows), compression="none", plain=sealed,
                         delta_encoded=frozenset({"seq"}), no_statistics=sealed)


class FlushCommitter:
    """Commits a stream's sealed jobs, and keeps where its tables stand: the stream table's version as
    this store last committed or read it, and the stream's last committed tombstone."""

    # one per stream beside its store (thousands of streams): no instance dict
    __slots__ = (
        "layout", "table", "stream", "stream_id", "reads", "sealer", "fence_lease", "_table", "_tombstones",
        "version", "tombstone_lsn", "commits",
    )

    def __init__(self, layout: Layout, table: TableLocation, stream: str, stream_id: str, reads: TableReads,
                 sync_always: bool = False, sealer: Sealer | None = None, fence_lease: Lease | None = None) -> None:
        self.layout = layout
        self.table = table
        self.stream = stream
        self.stream_id = stream_id
        self.reads = reads
        self.sealer = sealer
        self.fence_lease = fence_lease
        self._table = TableCommitter(table, "stream", sync_always)
        self._tombstones = TableCommitter(layout.tombstones, "tombstones", sync_always)
        self.version: int | None = None  # the table's version as this store last committed or read it
        self.tombstone_lsn = 0  # the stream's last committed tombstone's log sequence number (its app transaction)
        self.commits = 0

    @property
    def lsn_app(self) -> str:
        return f"{self.stream_id}/lsn"

    @property
    def _seq_app(self) -> str:
        return f"{self.stream_id}/seq"

    def commit(self, job: FlushJob, lease_timeout: float | None = None) -> None:
        """Writes the job's messages, then its removals, each under its table's commit lease, exactly once.

        Raises TimeoutError when a lease stays taken (a Spark job is committing) past `lease_timeout`.
        """
        if job.messages is not None and not job.messages_committed:
            messages = job.messages
            encoding = (message_encoding if self.sealer is None else sealed_message_encoding)(messages)
            with commit_lease(self.layout.lease_file(self.table), timeout=lease_timeout):
                version = self._table.append(
                    lambda done: messages.filter(pc.greater(messages.column("seq"), done)) if done else messages,
                    self.stream_id, job.last_msg_seq, encoding=encoding,
                    fence=None if self.fence_lease is None else (FENCE_APP_ID, self.fence_lease.fence()),
                )
            job.messages_committed = True
            job.messages = None  # the buffer keeps its own batches as the recent-rows cache; this copy goes now
            self.commits += 1
            self.version = version  # a job's commit in between changes no index content (see recover)
            self.reads.learn_files(self._table.added)
        if job.removals:
            self._commit_removals(job, lease_timeout)

    def ensure_durable(self) -> None:
        """What earlier runs committed to both tables is durable (under sync) before the log lets go of it."""
        self._table.ensure_durable(self.stream_id)
        self._tombstones.ensure_durable(self.lsn_app)

    def _commit_removals(self, job: FlushJob, lease_timeout: float | None) -> None:
        extra = [Txn(self._seq_app, max(job.last_seq, 0))]
        with commit_lease(self.layout.lease_file(self.layout.tombstones), timeout=lease_timeout):
            self._tombstones.append(
                lambda done: self._tombstone_rows([r for lsn, r in job.removals if lsn > done]),
                self.lsn_app, job.removals[-1][0], extra=extra,
            )
        self.tombstone_lsn = max(self.tombstone_lsn, job.removals[-1][0])

    def _tombstone_rows(self, removals: list[Removal]) -> pa.Table:
        rows: dict[str, list[object]] = {name: [] for name in TOMBSTONE_SCHEMA.names}
        for removal in removals:
            for first, last in removal.ranges:
                rows["stream"].append(self.stream)
                rows["stream_id"].append(self.stream_id)
                rows["first_seq"].append(first)
                rows["last_seq"].append(last)
                rows["reason"].append(removal.reason)
                rows["erase"].append(removal.erase)
                rows["ts"].append(removal.ts // 1000)
        table = pa.table(
            {k: pa.array(v, TOMBSTONE_SCHEMA.field(k).type if k != "ts" else pa.int64()) for k, v in rows.items()}
        )
        ts = table.column("ts").cast(TOMBSTONE_SCHEMA.field("ts").type)
        return table.set_column(6, "ts", ts).cast(TOMBSTONE_SCHEMA)
