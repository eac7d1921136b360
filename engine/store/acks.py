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
import time
from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from engine import errors
from engine.ack_events import AckEvent, AckEvents
from engine.pipeline import GroupCommit, Request
from engine.store import ack_log
from engine.store.backlog import Backlog
from engine.store.commits import TableCommitter, ensure_table
from engine.store.delta_actions import AddFile, Txn
from engine.store.delta_log import TableNotFoundError, log_of
from engine.store.layout import ACK_SCHEMA, ACK_TABLE_PROPERTIES, Layout
from engine.store.lease import commit_lease
from engine.store.leases import Lease
from engine.store.object_log import open_log
from engine.store.table_scan import read_all

log = logging.getLogger(__name__)

APP_ID = "acks"
FLUSH_APP_ID = "acks/flush"  # version: the number of the flush that committed a unit of logged events
FOLD_INTERVAL = 30.0  # seconds: the background flusher deletes folded rows at most this often
SNAPSHOT = "snapshot"
ACK_LOG = ".acks"  # the ack log's name beside the streams' (no stream name has a `.`)


@dataclass(slots=True)
class EventRow:
    stream: str
    consumer: str
    consumer_id: str
    event: AckEvent
    delivered_stream_seq: int | None = None
    ack_floor_stream_seq: int | None = None
    state: str | None = None


@dataclass(slots=True)
class EventBlock:
    """One consumer's events of one request (a pull's deliveries, an ack request's acks), in columns."""

    stream: str
    consumer: str
    consumer_id: str
    events: AckEvents

    def __len__(self) -> int:
        return len(self.events)


LogItem = EventRow | EventBlock
Ticket = Request[LogItem, int]


@dataclass
class ConsumerHistory:
    """What recovery hands a consumer: its latest snapshot and the events after it, in order."""

    snapshot: dict[str, object] | None = None
    events: list[AckEvent] = field(default_factory=list)


_INT_COLUMNS = ("stream_seq", "consumer_seq", "count", "ts", "delay")


def _batch(items: list[LogItem], first_event_seq: int) -> pa.RecordBatch:
    """The log record and table rows of `items`: a block's names and kinds are runs of one value and its
    numbers arrays, so a flush of many 500-event blocks costs a few Arrow calls per block, not a Python
    value per row."""
    strings: list[list[tuple[str, int]]] = [[], [], [], []]  # runs of stream, consumer, consumer_id, kind
    numbers: list[AckEvents] = []
    # runs of delivered_stream_seq, ack_floor_stream_seq, state: values on snapshots only
    extra: list[list[tuple[object, int]]] = [[], [], []]
    for item in items:
        if isinstance(item, EventBlock):
            events, n = item.events, len(item.events)
            extra_values: tuple[object, object, object] = (None, None, None)
        else:
            events, n = AckEvents.of([item.event]), 1
            extra_values = (item.delivered_stream_seq, item.ack_floor_stream_seq, item.state)
        for column, value in zip(strings, (item.stream, item.consumer, item.consumer_id), strict=False):
            column.append((value, n))
        kinds = events.kind
        if n and kinds.count(kinds[0]) == n:
            strings[3].append((kinds[0], n))
        else:
            strings[3] += [(k, 1) for k in kinds]
        numbers.append(events)
        for column, value in zip(extra, extra_values, strict=True):
            column.append((value, n))
    events = AckEvents.concat(numbers)
    rows = len(events)
    ts_us = np.ascontiguousarray(events.ts // 1000, np.int64)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(np.arange(first_event_seq, first_event_seq + rows, dtype=np.int64)),
            *(_runs(column, pa.string()) for column in strings),
            pa.array(events.stream_seq, pa.int64()),
            pa.array(events.consumer_seq, pa.int64()),
            pa.array(events.count.astype(np.int32), pa.int32()),
            pa.Array.from_buffers(ACK_SCHEMA.field("ts").type, rows, [None, pa.py_buffer(ts_us)]),
            pa.array(events.delay, pa.int64()),
            _runs(extra[0], pa.int64()),
            _runs(extra[1], pa.int64()),
            _runs(extra[2], pa.string()),
        ],
        schema=ACK_SCHEMA,
    )


def _runs(runs: list[tuple[object, int]], type_: pa.DataType) -> pa.Array:
    """A column given as runs of (value, length): the distinct values once, repeated by a take."""
    runs = [r for r in runs if r[1]]
    total = sum(n for _, n in runs)
    if not runs:
        return pa.array([], type_)
    first = runs[0][0]
    if all(value == first for value, _ in runs):
        return pa.nulls(total, type_) if first is None else pa.repeat(pa.scalar(first, type_), total)
    codes: dict[object, int] = {}
    for value, _ in runs:
        codes.setdefault(value, len(codes))
    positions = np.repeat(np.fromiter((codes[v] for v, _ in runs), np.int64, len(runs)),
                          np.fromiter((n for _, n in runs), np.int64, len(runs)))
    return pa.array(list(codes), type_).take(pa.array(positions))


class AckStore:
    """The account's consumer events: log first, then the `_system/acks` table."""

    def __init__(self, layout: Layout, sync_always: bool = False, backlog: Backlog | None = None,
                 log_lease: Lease | None = None, scope: str | None = None) -> None:
        self.layout = layout
        self.path = layout.acks
        self.backlog = backlog or Backlog()
        # `scope`: one stream's events only (several gateways, each owning some streams, share the
        # table): a log of its own, app transactions of its own, recovery of its rows only.
        self.scope = scope
        self.app_id = APP_ID if scope is None else f"{APP_ID}:{scope}"
        self.flush_app_id = FLUSH_APP_ID if scope is None else f"{FLUSH_APP_ID}:{scope}"
        log_name = ACK_LOG if scope is None else f"{ACK_LOG}.{scope}"
        self.wal = open_log(layout, log_name, log_lease, sync_always, "acklog", self.backlog)
        self._table = TableCommitter(self.path, "acks", sync_always)
        self.sync_always = sync_always
        self._lock = threading.Lock()
        self._pending: list[Logged] = []  # logged, not yet in the table: rounds (first event seq, items) or old Arrow records
        self._next_event_seq = 1
        self._commit: GroupCommit[LogItem, int] = GroupCommit(self._append_rounds)
        self._folded: dict[str, int] = {}  # consumer_id -> event_seq below which rows are folded
        self._folded_at = time.monotonic()  # when folded rows were last deleted
        self._units: list[tuple[int, list[Logged]]] = []  # sealed for a commit that failed: retried as they are
        self._flush_no = 0
        self.commits = 0

    def create(self) -> None:
        ensure_table(self.path, ACK_SCHEMA, None, ACK_TABLE_PROPERTIES, self.sync_always)
        self._flush_no = log_of(self.path).state().transaction_version(self.flush_app_id)

    def append(self, items: list[LogItem]) -> None:
        """Makes the events durable (per the sync policy); concurrent callers share one log write."""
        self.wait(self.enqueue(items))

    def enqueue(self, items: list[LogItem]) -> Ticket | None:
        """Takes the events' place in the log without waiting for the write: called under the stream's
        lock, the log order is the order in which the events changed the consumers' state.

        Raises UnavailableError (503, 10023) when the ack log's backlog is full."""
        items = [i for i in items if isinstance(i, EventRow) or len(i)]
        if not items:
            return None
        refusal = self.backlog.refusal(self.wal.size)
        if refusal is not None:
            raise errors.UnavailableError(f"insufficient resources: the ack log is not flushed ({refusal})")
        return self._commit.enqueue(items)

    def wait(self, ticket: Ticket | None) -> None:
        """Returns once the enqueued events are durable (per the sync policy). Raises a 503 (10077)
        when the log write failed: the events are not logged, and the caller is not answered OK."""
        if ticket is not None:
            try:
                self._commit.wait(ticket)
            except OSError as exc:
                raise errors.store_failed(f"ack log write failed: {exc}") from exc

    def log_bytes(self) -> int:
        return self.wal.size

    def repair(self) -> bool:
        """After a failed write whose partial record could not be cut: tries again; True when the log is writable."""
        with self._lock:
            return self.wal.repair()

    @property
    def idle(self) -> bool:
        """No log write under way: an `append` now would not wait for another caller's."""
        return self._commit.idle

    def _append_rounds(self, rounds: list[list[LogItem]]) -> list[list[int]]:
        items = [r for group in rounds for r in group]
        with self._lock:
            first = self._next_event_seq
            self.wal.append([(ack_log.KIND_RUN_EVENTS, ack_log.encode([_packed(i) for i in items], first))])
            self._fold_snapshots(items, first)
            self._next_event_seq += sum(1 if isinstance(i, EventRow) else len(i) for i in items)
            self._pending.append((first, items))
        return [[] for _ in rounds]

    def _fold_snapshots(self, items: list[LogItem], first_event_seq: int) -> None:
        """A snapshot row folds its consumer's earlier rows: they go from the table at the next flush."""
        seq = first_event_seq
        for item in items:
            if isinstance(item, EventRow) and item.event.kind == SNAPSHOT:
                self._folded[item.consumer_id] = seq
            seq += 1 if isinstance(item, EventRow) else len(item)

    def forget(self, consumer_id: str) -> None:
        """A deleted consumer: all its rows go at the next flush."""
        with self._lock:
            self._folded[consumer_id] = 2**62

    # -- flush --------------------------------------------------------------------------------

    def flush(self, fold: bool = True, lease_timeout: float = 0) -> int:
        """Commits the logged events; returns the commits made. Raises TimeoutError when a Spark job
        holds the table's lease longer than `lease_timeout` seconds.

        Each commit is a unit numbered by the flush (`acks/flush` app transaction): a unit that fails
        is retried as it was, so a commit that landed unseen is recognised and never appended twice
        (whatever the event numbering does). Rows folded by snapshots (and a deleted consumer's) are
        deleted with it when `fold`, else at most every FOLD_INTERVAL seconds: a delete rewrites the
        table's files, which the background flusher cannot afford every second under a busy consumer
        (recovery skips folded rows anyway).
        """
        with self._lock:
            fold = fold or time.monotonic() - self._folded_at >= FOLD_INTERVAL
            if not self._pending and not self._units and not (fold and self._folded):
                return 0
            segments = self.wal.rotate()  # first: if sealing fails, nothing below has been taken
            if self._pending:
                self._flush_no += 1
                self._units.append((self._flush_no, self._pending))
                self._pending = []
            units = list(self._units)
            folded: dict[str, int] = {}
            if fold:
                folded, self._folded = self._folded, {}
        try:
            for unit in units:
                self._commit_unit(*unit, lease_timeout)
                with self._lock:
                    self._units.remove(unit)
                self.commits += 1
            if folded:
                self._delete_folded(folded, lease_timeout)
                self._folded_at = time.monotonic()
        except BaseException:
            with self._lock:
                for cid, seq in folded.items():
                    self._folded.setdefault(cid, seq)
            raise
        self.wal.remove(segments)
        return len(units)

    def _commit_unit(self, flush_no: int, logged: list[Logged], lease_timeout: float) -> None:
        table = pa.Table.from_batches(_to_batches(logged), schema=ACK_SCHEMA)
        last = table.column("event_seq")[-1].as_py()
        with commit_lease(self.layout.lease_file(self.path), timeout=lease_timeout):
            self._table.append(lambda _: table, self.flush_app_id, flush_no,
                               extra=[Txn(self.app_id, last)], fence=self._fence())

    def _fence(self) -> tuple[str, int] | None:
        """A stream's ack store (several gateways) fences its commits with the stream lease's token."""
        lease = getattr(self.wal, "lease", None)
        if self.scope is None or lease is None:
            return None
        return f"owner-token:{self.scope}", lease.fence()

    def _delete_folded(self, folded: dict[str, int], lease_timeout: float) -> None:
        """Deletes each consumer's rows below the event its latest snapshot folded."""
        ids = pa.array(list(folded), pa.string())
        floors = pa.array(list(folded.values()), pa.int64())
        highest = max(folded.values())

        def doomed(rows: pa.Table) -> pa.Array:
            floor = pc.take(floors, pc.index_in(rows.column("consumer_id"), value_set=ids))
            return pc.less(rows.column("event_seq"), floor)

        def may_hold(add: AddFile) -> bool:
            low = add.bounds("event_seq")[0]
            return low is None or low < highest

        with commit_lease(self.layout.lease_file(self.path), timeout=lease_timeout):
            self._table.delete(doomed, may_hold)

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> dict[str, ConsumerHistory]:
        """Every consumer's latest snapshot and later events, from the table and the log.

        Event numbering resumes above the table's app transaction as well as above the rows and the
        log: deleted consumers' rows leave the table, and an event numbered at or below the app
        transaction would be taken for flushed by the next recovery and skipped.
        """
        flushed = 0
        tables: list[pa.Table] = []
        try:
            state = log_of(self.path).state()
            flushed = state.transaction_version(self.app_id)
            rows = read_all(self.path, state, ACK_SCHEMA)
            if self.scope is not None:
                rows = rows.filter(pc.equal(rows.column("stream"), self.scope))
            tables.append(rows)
        except TableNotFoundError:
            pass
        last = flushed
        for record in self.wal.recover():
            logged = _read_record(record.kind, record.payload)
            batch = _to_batches([logged])[0]
            if not batch.num_rows:
                continue
            end = batch.column("event_seq")[-1].as_py()
            last = max(last, end)
            if end > flushed:
                self._pending.append(logged)
                tables.append(pa.Table.from_batches([batch]))
        table = pa.concat_tables(tables).sort_by("event_seq") if tables else None
        if table is not None and table.num_rows:
            last = max(last, table.column("event_seq")[-1].as_py())
        self._next_event_seq = last + 1
        return _histories(table) if table is not None else {}


Logged = tuple[int, list[LogItem]] | pa.RecordBatch


def _packed(item: LogItem) -> tuple[str, str, str, AckEvents, list[object] | None]:
    if isinstance(item, EventBlock):
        return item.stream, item.consumer, item.consumer_id, item.events, None
    extra = [item.delivered_stream_seq, item.ack_floor_stream_seq, item.state]
    return item.stream, item.consumer, item.consumer_id, AckEvents.of([item.event]), extra


def _read_record(kind: int, payload: bytes) -> Logged:
    if kind == ack_log.KIND_ARROW_EVENTS:
        return pa.ipc.read_record_batch(pa.py_buffer(payload), ACK_SCHEMA)
    first, blocks = ack_log.decode(payload, kind)
    items: list[LogItem] = []
    for stream, consumer, consumer_id, events, extra in blocks:
        if extra is None:
            items.append(EventBlock(stream, consumer, consumer_id, events))
        else:
            (event,) = events.to_list()
            items.append(EventRow(stream, consumer, consumer_id, event, *extra))  # type: ignore[arg-type]
    return first, items


def _to_batches(logged: list[Logged]) -> list[pa.RecordBatch]:
    """Arrow batches of logged rounds; consecutive rounds (consecutive event sequences) become one."""
    out: list[pa.RecordBatch] = []
    run: list[LogItem] = []
    first = following = 0
    for entry in logged:
        if run and (isinstance(entry, pa.RecordBatch) or entry[0] != following):
            out.append(_batch(run, first))
            run = []
        if isinstance(entry, pa.RecordBatch):
            out.append(entry)
            continue
        if not run:
            first = following = entry[0]
        run += entry[1]
        following += sum(1 if isinstance(i, EventRow) else len(i) for i in entry[1])
    if run:
        out.append(_batch(run, first))
    return out


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

