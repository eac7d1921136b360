"""A file stream's storage: write-ahead log first, then its Delta table, written with delta-rs.

Publishes are made durable in the stream's log and kept in memory until the flusher commits them to
the table: one commit per stream per flush, carrying a Delta app transaction (`txn`, app id = the
stream's id, version = the last sequence it holds) so that replaying the log after a crash applies
each message exactly once. Removals go the same way into the shared tombstones table, versioned by
log sequence number. Reads of messages no longer in memory prune the table's files by partition and
by the `seq` statistics of the Delta log, then read one row group. The only module that imports
`deltalake`. Counterpart: server/filestore.go.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, Transaction, WriterProperties
from deltalake.exceptions import TableNotFoundError

from engine.index import MessageIndex
from engine.store.rows import KIND_ARROW, KIND_PACKED, RowGroup, Rows, decode
from engine.store.backlog import Backlog
from engine.store.base import Recovered, Removal, StoredMessage
from engine.store.commits import TableCommitter, ensure_table
from engine.store.layout import (
    PARTITION_COLUMN,
    STREAM_SCHEMA,
    STREAM_TABLE_PROPERTIES,
    TOMBSTONE_SCHEMA,
    TOMBSTONE_TABLE_PROPERTIES,
    Layout,
    partition_value,
)
from engine.store.lease import commit_lease
from engine.store.memory import MessageBuffer
from engine.store.wal import Record, WriteAheadLog

log = logging.getLogger(__name__)

KIND_REMOVE = 2
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
ROW_GROUP_ROWS = 8192  # small row groups: a read by sequence decodes one group, not a whole file
ROW_GROUP_BYTES = 8 * 1024 * 1024  # and few enough bytes that a read of a large message stays small
READ_AHEAD = ROW_GROUP_ROWS
READ_WINDOWS = 8  # decoded row groups reads keep at hand (the groups of several partitions overlap in sequences)
READ_WINDOW_BYTES = 16 * 1024 * 1024
_FILE_COLUMNS = [name for name in STREAM_SCHEMA.names if name != PARTITION_COLUMN]


def _encode_removal(r: Removal) -> bytes:
    return orjson.dumps({"ranges": r.ranges, "reason": r.reason, "erase": r.erase, "last_seq": r.last_seq, "ts": r.ts})


def _decode_removal(payload: bytes) -> Removal:
    d = orjson.loads(payload)
    return Removal([tuple(x) for x in d["ranges"]], d["reason"], d["erase"], d["last_seq"], d["ts"])


def _to_table(groups: list[RowGroup]) -> pa.Table:
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


def _once_per_seq(table: pa.Table, stream: str) -> pa.Table:
    """A table sorted by `seq` with each sequence once: an earlier version could append a commit twice
    (when delta-rs raised after the commit landed); such a warehouse opens, with a warning."""
    seqs = table.column("seq").to_numpy()
    if len(seqs) < 2:
        return table
    first = np.ones(len(seqs), np.bool_)
    np.not_equal(seqs[1:], seqs[:-1], out=first[1:])
    if first.all():
        return table
    log.warning("stream %s: its table holds %d rows twice (a commit appended again); each is read once",
                stream, int((~first).sum()))
    return table.filter(pa.array(first))


def _ranges_to_seqs(ranges: list[tuple[int, int]]) -> np.ndarray:
    if not ranges:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(a, b + 1, dtype=np.int64) for a, b in ranges])


@dataclass
class FlushJob:
    """What one flush moves from the log to the tables, sealed under the stream's lock."""

    messages: pa.Table | None
    last_msg_seq: int
    removals: list[tuple[int, Removal]]
    last_seq: int
    segments: list[Path]
    buffered_upto: int
    since: float | None = None  # monotonic time of its oldest append
    messages_committed: bool = False


class _Window:
    """Messages read from the table for a range of sequences, as Python columns: O(1) per message."""

    def __init__(self, table: pa.Table) -> None:
        self.seqs = table.column("seq").to_numpy()
        self._positions = {int(s): i for i, s in enumerate(self.seqs.tolist())}
        self.subjects = table.column("subject").to_pylist()
        self.ts = (table.column("ts").cast(pa.int64()).to_numpy() * 1000).tolist()
        self.msg_ids = table.column("msg_id").to_pylist()
        self.headers = table.column("headers").to_pylist()
        self.data = table.column("data").to_pylist()

    def get(self, seq: int) -> StoredMessage | None:
        i = self._positions.get(seq)
        if i is None:
            return None
        headers = self.headers[i]
        return StoredMessage(self.subjects[i], seq, self.ts[i], self.data[i] or b"", dict(headers) if headers else None, self.msg_ids[i])


class _RowGroups:
    """Decoded row groups of the table's files, least recently used first out, within a byte budget.

    A file's footer is parsed once; a point read decodes the one row group whose `seq` statistics
    hold the sequence, and later reads in that group are dictionary lookups.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._meta: dict[Path, tuple[pq.FileMetaData, np.ndarray, np.ndarray]] = {}
        self._groups: OrderedDict[tuple[Path, int], tuple[_Window, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def find(self, path: Path, seq: int) -> StoredMessage | None:
        """The message `seq` of the file at `path`, from the row groups whose statistics may hold it."""
        meta, lows, highs = self._footer(path)
        for group in np.flatnonzero((lows <= seq) & (highs >= seq)).tolist():
            msg = self._window(path, meta, group).get(seq)
            if msg is not None:
                return msg
        return None

    def _window(self, path: Path, meta: pq.FileMetaData, group: int) -> _Window:
        key = (path, group)
        with self._lock:
            cached = self._groups.get(key)
            if cached is not None:
                self._groups.move_to_end(key)
                return cached[0]
        table = pq.ParquetFile(path, metadata=meta).read_row_group(group, columns=_FILE_COLUMNS)
        window = _Window(table)
        with self._lock:
            self._groups[key] = (window, table.nbytes)
            self._bytes += table.nbytes
            while self._bytes > self.budget and len(self._groups) > 1:
                _, (_, size) = self._groups.popitem(last=False)
                self._bytes -= size
        return window

    def _footer(self, path: Path) -> tuple[pq.FileMetaData, np.ndarray, np.ndarray]:
        found = self._meta.get(path)
        if found is None:
            meta = pq.read_metadata(path)
            column = meta.schema.to_arrow_schema().get_field_index("seq")
            stats = [meta.row_group(i).column(column).statistics for i in range(meta.num_row_groups)]
            lows = np.array([st.min if st is not None and st.has_min_max else -1 for st in stats], np.int64)
            highs = np.array([st.max if st is not None and st.has_min_max else 2**62 for st in stats], np.int64)
            found = self._meta[path] = (meta, lows, highs)
        return found

    def clear(self) -> None:
        with self._lock:
            self._meta.clear()
            self._groups.clear()
            self._bytes = 0


@dataclass
class _FileMap:
    version: int = -1
    paths: list[str] = field(default_factory=list)
    partitions: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    min_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    max_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


class DeltaStore:
    """Storage of one file stream. The stream's lock serialises every call but `commit`."""

    def __init__(
        self,
        layout: Layout,
        stream: str,
        stream_id: str,
        partition_tokens: int = 0,
        sync_always: bool = False,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        backlog: Backlog | None = None,
    ) -> None:
        self.layout = layout
        self.stream = stream
        self.stream_id = stream_id
        self.partition_tokens = partition_tokens
        self.sync_always = sync_always
        self.table_path = layout.stream_table(stream)
        self.backlog = backlog or Backlog()
        self.wal = WriteAheadLog(layout.wal_dir(stream), sync_always=sync_always, backlog=self.backlog)
        self._table = TableCommitter(self.table_path, "stream", sync_always)
        self._tombstones = TableCommitter(layout.tombstones_table, "tombstones", sync_always)
        self.buffer = MessageBuffer(cache_bytes)
        self._pending_removals: list[tuple[int, Removal]] = []
        self._unflushed_bytes = 0
        self._oldest_unflushed: float | None = None
        self._files = _FileMap()
        self._files_lock = threading.Lock()
        self._windows: list[tuple[int, int, _Window]] = []
        self._window_hint: tuple[int, int, _Window] | None = None
        self._row_groups = _RowGroups(cache_bytes)
        self.commits = 0

    @property
    def _lsn_app(self) -> str:
        return f"{self.stream_id}/lsn"

    @property
    def _seq_app(self) -> str:
        return f"{self.stream_id}/seq"

    def create(self) -> None:
        """A new stream: its table and the tombstones table exist; nothing of an earlier namesake remains
        (a delete interrupted by a crash can leave its table or log behind)."""
        shutil.rmtree(self.wal.directory, ignore_errors=True)
        shutil.rmtree(self.table_path, ignore_errors=True)
        ensure_table(self.table_path, STREAM_SCHEMA, [PARTITION_COLUMN], STREAM_TABLE_PROPERTIES, self.sync_always)
        ensure_table(self.layout.tombstones_table, TOMBSTONE_SCHEMA, None, TOMBSTONE_TABLE_PROPERTIES, self.sync_always)

    # -- the write path -----------------------------------------------------------------------

    def append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        groups = [g for g in groups if len(g)]
        entries: list[tuple[int, bytes | memoryview]] = [g.encode() for g in groups]
        entries.extend((KIND_REMOVE, _encode_removal(r)) for r in removals)
        if not entries:
            return
        last_lsn = self.wal.append(entries)
        for rows in groups:
            self.buffer.add(rows)
            self._unflushed_bytes += rows.nbytes
        first_lsn = last_lsn - len(removals) + 1
        self._pending_removals.extend((first_lsn + i, r) for i, r in enumerate(removals))
        if self._oldest_unflushed is None:
            self._oldest_unflushed = time.monotonic()

    def pending_bytes(self) -> int:
        return self._unflushed_bytes

    def log_bytes(self) -> int:
        """Bytes of the stream's log not yet removed: what a restart would read."""
        return self.wal.size

    def refusal(self) -> str | None:
        """Why the stream takes no new messages now (its or the gateway's backlog is full); None if it does."""
        return self.backlog.refusal(self.wal.size)

    def unflushed_age(self, now: float | None = None) -> float:
        """Seconds since the oldest append not yet committed to the tables (0 when there is none)."""
        if self._oldest_unflushed is None:
            return 0.0
        return max((time.monotonic() if now is None else now) - self._oldest_unflushed, 0.0)

    def has_pending(self) -> bool:
        return self._unflushed_bytes > 0 or bool(self._pending_removals)

    def seal(self, index: MessageIndex) -> FlushJob | None:
        """Cuts what is unflushed into a job; the log rolls to a new segment."""
        if not self.has_pending():
            return None
        groups = self.buffer.unflushed()
        messages = None
        last_msg_seq = self.buffer.flushed_upto
        if groups:
            table = _to_table(groups)
            last_msg_seq = groups[-1].last_seq
            live = index.live_mask(table.column("seq").to_numpy())
            messages = table.filter(pa.array(live)) if not live.all() else table
        job = FlushJob(
            messages=messages,
            last_msg_seq=last_msg_seq,
            removals=self._pending_removals,
            last_seq=index.last_seq,
            segments=self.wal.rotate(),
            buffered_upto=last_msg_seq,
            since=self._oldest_unflushed,
        )
        self._pending_removals = []
        self._unflushed_bytes = 0
        self._oldest_unflushed = None
        return job

    def commit(self, job: FlushJob, lease_timeout: float | None = None) -> None:
        """Writes a sealed job to the tables under their commit leases, exactly once (see commits.py).
        Runs outside the stream's lock.

        Raises TimeoutError when a lease stays taken (a Spark job is committing) past `lease_timeout`.
        """
        if job.messages is not None and not job.messages_committed:
            messages = job.messages
            with commit_lease(self.layout.lease_file(self.table_path), timeout=lease_timeout):
                self._table.append(
                    lambda done: messages.filter(pc.greater(messages.column("seq"), done)) if done else messages,
                    self.stream_id, job.last_msg_seq, partition_by=[PARTITION_COLUMN],
                    writer_properties=lambda rows: WriterProperties(
                        max_row_group_size=_row_group_rows(rows), compression="SNAPPY"
                    ),
                )
            job.messages_committed = True
            self.commits += 1
        if job.removals:
            self._commit_removals(job, lease_timeout)

    def _commit_removals(self, job: FlushJob, lease_timeout: float | None) -> None:
        extra = [Transaction(app_id=self._seq_app, version=max(job.last_seq, 0))]
        with commit_lease(self.layout.lease_file(self.layout.tombstones_table), timeout=lease_timeout):
            self._tombstones.append(
                lambda done: self._tombstone_rows([r for lsn, r in job.removals if lsn > done]),
                self._lsn_app, job.removals[-1][0], extra=extra,
            )

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

    def requeue(self, job: FlushJob) -> None:
        """A commit failed or waited: what it did not write stays pending; its segments are resealed next time.

        Messages already committed are marked flushed, so a retry never appends them twice.
        """
        self._pending_removals = job.removals + self._pending_removals
        if job.messages_committed:
            self.buffer.mark_flushed(job.buffered_upto)
            self._stale = True
        elif job.messages is not None:
            self._unflushed_bytes += max(job.messages.nbytes, 1)
        if job.since is not None:
            self._oldest_unflushed = min(job.since, self._oldest_unflushed or job.since)

    def finish(self, job: FlushJob) -> None:
        """After a commit: the buffered messages become a cache, the sealed segments go (a segment that
        cannot be deleted now is retried at the next flush; it is never committed again)."""
        self.buffer.mark_flushed(job.buffered_upto)
        self._stale = True
        self.wal.remove(job.segments)

    # -- reads --------------------------------------------------------------------------------

    def load(self, seq: int, index: MessageIndex) -> StoredMessage | None:
        if not index.is_live(seq):
            return None
        msg = self.buffer.get(seq)
        if msg is not None:
            return msg
        partition = partition_value(index.subject_of(seq), self.partition_tokens)
        for attempt in range(2):
            msg = self._read_from_table(seq, partition, refresh=attempt > 0)
            if msg is not None:
                return msg
        return None

    def load_many(self, seqs: list[int], index: MessageIndex) -> dict[int, StoredMessage]:
        """Live messages among `seqs` (ascending). Misses read the table a window ahead, for consumers."""
        found: dict[int, StoredMessage] = {}
        misses: list[int] = []
        live = index.live_mask(np.array(seqs, np.int64)).tolist()
        buffered, windowed = self.buffer.get, self._window_get
        for seq, ok in zip(seqs, live):
            if not ok:
                continue
            msg = buffered(seq) or windowed(seq)
            if msg is None:
                misses.append(seq)
            else:
                found[seq] = msg
        i = 0
        while i < len(misses):
            lo = misses[i]
            hi = self._window_end(lo, max(misses[-1], lo + READ_AHEAD), index)
            self._read_window(lo, hi, index)
            while i < len(misses) and misses[i] <= hi:
                msg = self._window_get(misses[i]) or self.load(misses[i], index)
                if msg is not None:
                    found[misses[i]] = msg
                i += 1
        return found

    @staticmethod
    def _window_end(lo: int, hi: int, index: MessageIndex) -> int:
        """`hi`, or less so that a window of large messages stays within READ_WINDOW_BYTES."""
        seqs = index.live_seqs(start=lo, stop=hi + 1)
        if not len(seqs):
            return hi
        cut = int(np.searchsorted(np.cumsum(index.sizes_of(seqs)), READ_WINDOW_BYTES, side="right"))
        return hi if cut >= len(seqs) else int(seqs[max(cut - 1, 0)])

    def _window_get(self, seq: int) -> StoredMessage | None:
        """From the row groups at hand; the one that answered last is asked first (runs of a subject)."""
        hint = self._window_hint
        if hint is not None and hint[0] <= seq <= hint[1]:
            msg = hint[2].get(seq)
            if msg is not None:
                return msg
        for entry in reversed(self._windows):
            if entry[0] <= seq <= entry[1] and entry is not hint:
                msg = entry[2].get(seq)
                if msg is not None:
                    self._window_hint = entry
                    return msg
        return None

    def _read_window(self, lo: int, hi: int, index: MessageIndex) -> None:
        """Makes the flushed messages with sequences in [lo, hi] readable: the row groups holding them
        (by the `seq` statistics, in the files of the partitions live there), whole and decoded once
        through the row-group cache, so consecutive pulls do not decode a group again."""
        seqs = index.live_seqs(start=lo, stop=hi + 1)
        partitions = {partition_value(s, self.partition_tokens) for s in index.subjects_among(seqs)}
        files = self._file_map(refresh=False)
        mask = (files.min_seq <= hi) & (files.max_seq >= lo) & np.isin(files.partitions, list(partitions))
        held = {id(w) for _, _, w in self._windows}
        for i in np.flatnonzero(mask):
            path = self.table_path / unquote(files.paths[i])
            try:
                meta, lows, highs = self._row_groups._footer(path)
                for group in np.flatnonzero((lows <= hi) & (highs >= lo)).tolist():
                    window = self._row_groups._window(path, meta, group)
                    if id(window) not in held:
                        held.add(id(window))
                        self._windows.append((int(lows[group]), int(highs[group]), window))
            except FileNotFoundError:
                self.mark_table_changed()
                return
        if len(self._windows) > READ_WINDOWS:
            del self._windows[: len(self._windows) - READ_WINDOWS]
            self._window_hint = None

    def _read_from_table(self, seq: int, partition: str, refresh: bool) -> StoredMessage | None:
        """One message by sequence: the file by its `seq` statistics, the row group by its own, both
        kept in memory (`_RowGroups`), so a repeated or nearby point read (a KV get) costs no I/O."""
        files = self._file_map(refresh)
        mask = (files.min_seq <= seq) & (files.max_seq >= seq) & (files.partitions == partition)
        for i in np.flatnonzero(mask):
            path = self.table_path / unquote(files.paths[i])
            try:
                msg = self._row_groups.find(path, seq)
            except FileNotFoundError:
                return None
            if msg is not None:
                return msg
        return None

    def _file_map(self, refresh: bool) -> _FileMap:
        with self._files_lock:
            if refresh or self._files.version < 0 or self._stale:
                dt = DeltaTable(str(self.table_path))
                actions = pa.table(dt.get_add_actions(flatten=True))
                self._files = _FileMap(
                    version=dt.version(),
                    paths=actions.column("path").to_pylist(),
                    partitions=np.array(actions.column(f"partition.{PARTITION_COLUMN}").to_pylist(), dtype=object),
                    min_seq=actions.column("min.seq").to_numpy(zero_copy_only=False).astype(np.int64),
                    max_seq=actions.column("max.seq").to_numpy(zero_copy_only=False).astype(np.int64),
                )
                self._stale = False
            return self._files

    _stale = True

    def mark_table_changed(self) -> None:
        with self._files_lock:
            self._stale = True
            self._windows = []
            self._window_hint = None
        self._row_groups.clear()

    # -- recovery -----------------------------------------------------------------------------

    def recover(self, index: MessageIndex, msg_id_since_ns: int) -> Recovered:
        """Rebuilds the index from the table, the tombstones and the log.

        The log's torn tail is cut and damage inside it read past (wal.py). The next sequence is after
        the highest one any of them holds, so no sequence is given twice. Segments whose every record
        is already in the tables (a crash between a commit and their removal) are removed at once.
        """
        recovered = Recovered()
        flushed_seq, last_seq = 0, 0
        try:
            dt = DeltaTable(str(self.table_path))
        except TableNotFoundError:
            dt = None
        if dt is not None:
            flushed_seq = dt.transaction_version(self.stream_id) or 0
            self._load_table_index(dt, index, msg_id_since_ns, recovered)
        tomb_lsn, last_seq = self._apply_tombstones(index)
        grouped, segments = self.wal.recover_segments()
        self.wal.next_lsn = max(self.wal.next_lsn, tomb_lsn + 1)
        in_tables: list[Path] = []
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
        if self.has_pending():
            self._oldest_unflushed = time.monotonic()
        if in_tables:
            self._remove_flushed(in_tables)
        return recovered

    def _sequences_maybe_lost(self) -> int:
        """How many sequences a damaged last record of the log may have held (no later record bounds
        them): skipped, so that none is given twice. A sequence takes at least 8 bytes in any record."""
        lost = sum(d.length // 8 for d in self.wal.damage if d.tail and d.written)
        if lost:
            log.error("stream %s: the damaged last log record may have held up to %d messages; their "
                      "sequences are skipped", self.stream, lost)
        return lost

    def _remove_flushed(self, segments: list[Path]) -> None:
        """Removes log segments a commit of an earlier run replaced (made durable first under sync)."""
        self._table.ensure_durable(self.stream_id)
        self._tombstones.ensure_durable(self._lsn_app)
        log.info("stream %s: removing %d log segment(s) already committed to the tables", self.stream, len(segments))
        self.wal.remove(segments)

    def _load_table_index(self, dt: DeltaTable, index: MessageIndex, since_ns: int, recovered: Recovered) -> None:
        table = dt.to_pyarrow_table(columns=["seq", "subject", "ts", "size", "msg_id"])
        if table.num_rows == 0:
            return
        table = _once_per_seq(table.sort_by("seq"), self.stream)
        seqs = table.column("seq").to_pylist()
        subjects = table.column("subject").to_pylist()
        ts = (table.column("ts").cast(pa.int64()).to_numpy() * 1000).tolist()
        sizes = table.column("size").to_pylist()
        for s, subj, t, size in zip(seqs, subjects, ts, sizes, strict=True):
            index.append(s, subj, size, t)
        recent = table.filter(pc.greater_equal(table.column("ts").cast(pa.int64()), since_ns // 1000))
        for msg_id, s, t in zip(
            recent.column("msg_id").to_pylist(), recent.column("seq").to_pylist(),
            (recent.column("ts").cast(pa.int64()).to_numpy() * 1000).tolist(), strict=True,
        ):
            if msg_id:
                recovered.msg_ids.append((msg_id, s, t))
        recovered.last_msg_id = table.column("msg_id")[-1].as_py()

    def _apply_tombstones(self, index: MessageIndex) -> tuple[int, int]:
        try:
            dt = DeltaTable(str(self.layout.tombstones_table))
        except TableNotFoundError:
            return 0, 0
        tomb_lsn = dt.transaction_version(self._lsn_app) or 0
        last_seq = dt.transaction_version(self._seq_app) or 0
        rows = dt.to_pyarrow_table(columns=["stream_id", "first_seq", "last_seq"])
        rows = rows.filter(pc.equal(rows.column("stream_id"), self.stream_id))
        ranges = list(zip(rows.column("first_seq").to_pylist(), rows.column("last_seq").to_pylist(), strict=True))
        if ranges:
            seqs = np.unique(_ranges_to_seqs(ranges))
            index.remove_many(seqs)
        return tomb_lsn, last_seq

    def _replay(
        self, record: Record, flushed_seq: int, tomb_lsn: int, index: MessageIndex, since_ns: int, recovered: Recovered
    ) -> tuple[int, bool]:
        """Applies a log record; returns the last sequence it names and whether the tables hold it already."""
        if record.kind in (KIND_ARROW, KIND_PACKED):
            rows = decode(record.kind, record.payload)
            if rows.last_seq <= flushed_seq:
                return rows.last_seq, True
            for i, (subj, t, size, msg_id) in enumerate(zip(rows.subjects, rows.ts, rows.sizes, rows.msg_ids, strict=True)):
                s = rows.first_seq + i
                if s > index.last_seq:
                    index.append(s, subj, size, t)
                if msg_id and t >= since_ns:
                    recovered.msg_ids.append((msg_id, s, t))
                recovered.last_msg_id = msg_id
            self.buffer.add(rows)
            self._unflushed_bytes += rows.nbytes
            return rows.last_seq, False
        if record.kind == KIND_REMOVE:
            removal = _decode_removal(record.payload)
            if record.lsn > tomb_lsn:
                index.remove_many(np.unique(_ranges_to_seqs(removal.ranges)))
                if removal.last_seq > index.last_seq:
                    index.skip_to(removal.last_seq + 1)
                self._pending_removals.append((record.lsn, removal))
            return removal.last_seq, record.lsn <= tomb_lsn
        raise RuntimeError(f"unknown write-ahead log record kind {record.kind}")

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        self.wal.forget()
        self.wal.close()

    def destroy(self) -> None:
        """Removes the stream's table and log. Its tombstone rows go with the next retention job."""
        self.wal.forget()
        self.wal.close()
        shutil.rmtree(self.table_path, ignore_errors=True)
        shutil.rmtree(self.wal.directory, ignore_errors=True)
        self.buffer.clear()
