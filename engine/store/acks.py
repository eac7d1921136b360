"""The ack-tracking table: consumer state as append-only events, written like messages.

Deliveries and acks are appended to one write-ahead log for the account (one append per group
commit; the ack is answered after it) and flushed in batches to the Delta table `_system/acks`, with
a Delta app transaction (`acks`, last event sequence) so that a replay is applied once. SQL reads the
table: each consumer's latest `snapshot` row carries its delivered and ack-floor sequences, so
consumer lag is a query. Snapshots also keep restarts fast: a consumer's state is its latest
snapshot plus the events after it, and the events a snapshot folds are deleted from the table.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import orjson
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from engine.consumer import AckEvent
from engine.pipeline import GroupCommit
from engine.store.delta import ensure_table
from engine.store.layout import ACK_SCHEMA, ACK_TABLE_PROPERTIES, Layout
from engine.store.lease import commit_lease
from engine.store.wal import WriteAheadLog

log = logging.getLogger(__name__)

APP_ID = "acks"
KIND_EVENTS = 1
SNAPSHOT = "snapshot"


@dataclass(slots=True)
class EventRow:
    stream: str
    consumer: str
    consumer_id: str
    event: AckEvent
    delivered_stream_seq: int | None = None
    ack_floor_stream_seq: int | None = None
    state: str | None = None


@dataclass
class ConsumerHistory:
    """What recovery hands a consumer: its latest snapshot and the events after it, in order."""

    snapshot: dict[str, object] | None = None
    events: list[AckEvent] = field(default_factory=list)


def _batch(rows: list[EventRow], first_event_seq: int) -> pa.RecordBatch:
    ts_type = ACK_SCHEMA.field("ts").type
    return pa.RecordBatch.from_arrays(
        [
            pa.array(range(first_event_seq, first_event_seq + len(rows)), pa.int64()),
            pa.array([r.stream for r in rows], pa.string()),
            pa.array([r.consumer for r in rows], pa.string()),
            pa.array([r.consumer_id for r in rows], pa.string()),
            pa.array([r.event.kind for r in rows], pa.string()),
            pa.array([r.event.stream_seq for r in rows], pa.int64()),
            pa.array([r.event.consumer_seq for r in rows], pa.int64()),
            pa.array([r.event.count for r in rows], pa.int32()),
            pa.array([r.event.ts // 1000 for r in rows], pa.int64()).cast(ts_type),
            pa.array([r.event.delay for r in rows], pa.int64()),
            pa.array([r.delivered_stream_seq for r in rows], pa.int64()),
            pa.array([r.ack_floor_stream_seq for r in rows], pa.int64()),
            pa.array([r.state for r in rows], pa.string()),
        ],
        schema=ACK_SCHEMA,
    )


class AckStore:
    """The account's consumer events: log first, then the `_system/acks` table."""

    def __init__(self, layout: Layout, sync_always: bool = False) -> None:
        self.layout = layout
        self.path = layout.acks_table
        self.wal = WriteAheadLog(layout.acks_wal, sync_always=sync_always)
        self._lock = threading.Lock()
        self._pending: list[pa.RecordBatch] = []
        self._next_event_seq = 1
        self._commit: GroupCommit[EventRow, int] = GroupCommit(self._append_rounds)
        self._folded: dict[str, int] = {}  # consumer_id -> event_seq below which rows are folded
        self.commits = 0

    def create(self) -> None:
        ensure_table(self.path, ACK_SCHEMA, None, ACK_TABLE_PROPERTIES)

    def append(self, rows: list[EventRow]) -> None:
        """Makes the events durable (per the sync policy); concurrent callers share one log write."""
        if rows:
            self._commit.submit(rows)

    def _append_rounds(self, rounds: list[list[EventRow]]) -> list[list[int]]:
        rows = [r for group in rounds for r in group]
        with self._lock:
            batch = _batch(rows, self._next_event_seq)
            self.wal.append([(KIND_EVENTS, memoryview(batch.serialize()))])
            self._next_event_seq += len(rows)
            self._pending.append(batch)
            self._fold_snapshots(batch)
        return [[] for _ in rounds]

    def _fold_snapshots(self, batch: pa.RecordBatch) -> None:
        kinds = batch.column("kind").to_pylist()
        if SNAPSHOT not in kinds:
            return
        for kind, cid, seq in zip(kinds, batch.column("consumer_id").to_pylist(), batch.column("event_seq").to_pylist(), strict=True):
            if kind == SNAPSHOT:
                self._folded[cid] = seq

    def forget(self, consumer_id: str) -> None:
        """A deleted consumer: all its rows go at the next flush."""
        with self._lock:
            self._folded[consumer_id] = 2**62

    # -- flush --------------------------------------------------------------------------------

    def flush(self) -> int:
        """Commits the logged events; raises TimeoutError when a Spark job holds the table's lease."""
        with self._lock:
            if not self._pending and not self._folded:
                return 0
            batches, self._pending = self._pending, []
            folded, self._folded = self._folded, {}
            segments = self.wal.rotate()
        committed = False
        try:
            if batches:
                table = pa.Table.from_batches(batches, schema=ACK_SCHEMA)
                last = table.column("event_seq")[-1].as_py()
                with commit_lease(self.layout.lease_file(self.path), timeout=0):
                    write_deltalake(
                        str(self.path), table, mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(app_id=APP_ID, version=last)]),
                    )
                committed = True
                self.commits += 1
            if folded:
                self._delete_folded(folded)
        except BaseException:
            with self._lock:
                if not committed:
                    self._pending = batches + self._pending
                for cid, seq in folded.items():
                    self._folded.setdefault(cid, seq)
            raise
        self.wal.remove(segments)
        return len(batches)

    def _delete_folded(self, folded: dict[str, int]) -> None:
        predicate = " OR ".join(f"(consumer_id = '{cid}' AND event_seq < {seq})" for cid, seq in folded.items())
        with commit_lease(self.layout.lease_file(self.path), timeout=0):
            DeltaTable(str(self.path)).delete(predicate)

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> dict[str, ConsumerHistory]:
        """Every consumer's latest snapshot and later events, from the table and the log."""
        flushed = 0
        tables: list[pa.Table] = []
        try:
            dt = DeltaTable(str(self.path))
            flushed = dt.transaction_version(APP_ID) or 0
            tables.append(dt.to_pyarrow_table())
        except TableNotFoundError:
            pass
        for record in self.wal.recover():
            batch = pa.ipc.read_record_batch(pa.py_buffer(record.payload), ACK_SCHEMA)
            if batch.column("event_seq")[-1].as_py() > flushed:
                self._pending.append(batch)
                tables.append(pa.Table.from_batches([batch]))
        if not tables:
            return {}
        table = pa.concat_tables(tables).sort_by("event_seq")
        if table.num_rows:
            self._next_event_seq = table.column("event_seq")[-1].as_py() + 1
        return _histories(table)


def _histories(table: pa.Table) -> dict[str, ConsumerHistory]:
    out: dict[str, ConsumerHistory] = {}
    snapshots = table.filter(pc.equal(table.column("kind"), SNAPSHOT))
    last_snapshot: dict[str, int] = {}
    for cid, seq, state in zip(
        snapshots.column("consumer_id").to_pylist(), snapshots.column("event_seq").to_pylist(),
        snapshots.column("state").to_pylist(), strict=True,
    ):
        last_snapshot[cid] = seq
        out[cid] = ConsumerHistory(snapshot=orjson.loads(state))
    ts = (table.column("ts").cast(pa.int64()).to_numpy() * 1000).tolist()
    for cid, seq, kind, sseq, cseq, count, t, delay in zip(
        table.column("consumer_id").to_pylist(), table.column("event_seq").to_pylist(),
        table.column("kind").to_pylist(), table.column("stream_seq").to_pylist(),
        table.column("consumer_seq").to_pylist(), table.column("delivery_count").to_pylist(),
        ts, table.column("delay").to_pylist(), strict=True,
    ):
        if kind == SNAPSHOT or seq < last_snapshot.get(cid, 0):
            continue
        out.setdefault(cid, ConsumerHistory()).events.append(AckEvent(kind, sseq, cseq, count, t, delay))
    return out

