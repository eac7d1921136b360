"""Reads of one stream's Delta table: messages by sequence, windows for consumers, and index rows.

The table's files are known from the Delta log's `add` actions (path, partition, `seq` and `ts`
statistics); a file's footer is read once into compact row-group bounds (parquet_footer.py: `seq`
and `ts` statistics, 41 bytes a group) and its row groups chosen by them, so a read by sequence
decodes one row group (1,024 rows as the flusher writes them), found without a scan, through a footer
made of that group's entry alone, and only the columns a message is made of, and converts only the
row it returns. Decoded row groups and files' bounds share one byte-bounded cache, so memory does not
grow with the table (a KV get after a restart costs no I/O the second time). Reads are
single-threaded (two cores are shared; a thread pool's hand-offs cost more than a small group's
decode) and pre-buffer only on S3. The index (engine/index.py) reads its block details here: the
`seq`, `subject`, `size` and `ts` columns of the rows in a range of sequences, without payloads; a
search by time reads `seq` and `ts` only, one row group at a time from the first whose `ts`
statistics reach the time. An encrypted stream's reads open what they return
(`opener`, engine/store/sealed.py): its decoded row groups keep the sealed values and open a row when
it is read (sealed_window.py), and a message whose values do not open answers its own error; protected
subjects are opened for the index too (`subject_opener`).
A file that a maintenance job replaced and vacuumed meanwhile is met as missing: the file list is read
again and the read retried once. The flusher reads a file's bounds as it commits it (`learn_files`),
and the index snapshot carries the bounds held (`file_bounds`), so reads after a restart choose row
groups without reading footers.
Counterpart: the block loads of server/filestore.go (`loadMsgs`, `cacheLookup`).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader

from engine.errors import JetStreamError
from engine.store.base import StoredMessage
from engine.store.delta_actions import bounds
from engine.store.delta_log import log_of
from engine.store.layout import PARTITION_COLUMN, STREAM_SCHEMA, TableLocation
from engine.store.parquet_footer import FileBounds, bounds_from_arrays, bounds_to_arrays

log = logging.getLogger(__name__)

READ_AHEAD = 8192
READ_WINDOWS = 8  # decoded row groups reads keep at hand (the groups of several partitions overlap in sequences)
READ_WINDOW_BYTES = 16 * 1024 * 1024
_PY_ROW_BYTES = 200  # a row of a listed window as Python objects, beyond its Arrow bytes (100 B payloads)
_LOCAL = pafs.LocalFileSystem()
_STATS_TS_GRAIN_US = 1000
# What a message is made of (`size` is the index's, read by `index_rows`); msg ids and headers are
# decoded only in the row groups whose statistics say some row has them: most streams carry neither,
# and a point read's cost is a fixed cost per decoded column chunk (~0.03-0.1 ms each).
_WINDOW_COLUMNS = ["seq", "subject", "ts", "msg_id", "headers", "data"]
_OPTIONAL_COLUMNS = ("msg_id", "headers")
_INDEX_COLUMNS = ["seq", "subject", "size", "ts"]


class Opened(Protocol):
    table: pa.Table
    errors: dict[int, JetStreamError]


class Window:
    """The messages of one row group, kept as Arrow columns: a point read converts the one row it
    returns (a row group of 8,192 messages as Python objects cost milliseconds to build and several
    times the group's bytes); a consumer's window converts the group once (`list`), since it reads
    on through it. Rows are found by binary search over the sorted `seq` column. An encrypted stream's
    windows (sealed_window.py) convert their rows the same way and open the row they return.
    A column absent from the decoded table is null in every row (an optional column the group's
    statistics say is empty), except `subject`: a point read whose caller knows the subject (the
    index's last sequence of a literal subject, a KV get) decodes the group without it, and such a
    window answers only reads that give the subject (`has_subject`)."""

    def __init__(self, table: pa.Table) -> None:
        seqs = _int64s(table.column("seq"))
        self._order: np.ndarray | None = None
        if len(seqs) > 1 and not (seqs[1:] > seqs[:-1]).all():  # an older file's group: rows out of order
            self._order = np.argsort(seqs, kind="stable")
            seqs = seqs[self._order]
        self.seqs = seqs
        self.table = table  # the decoded columns (an encrypted stream's: its values still sealed)
        self.has_subject = "subject" in table.column_names
        self._ts = _int64s(table.column("ts"))  # microseconds
        self._lists: tuple[Any, ...] | None = None
        self._arrays: tuple[Any, ...] | None = None  # the columns `_message` reads, each one chunk
        self.rows = table.num_rows
        self.nbytes = table.nbytes + 8 * self.rows

    @property
    def listed(self) -> bool:
        return self._lists is not None

    def list(self) -> int:
        """Converts every row once (consumers read on through the group); returns the bytes added."""
        if self._lists is not None:
            return 0
        self._lists = self._columns()
        added = _PY_ROW_BYTES * self.rows
        self.nbytes += added
        return added

    def get(self, seq: int, subject: str | None = None) -> StoredMessage | None:
        """The message `seq` of this group, or None; `subject`, the caller's knowledge of it, is needed
        when the window was decoded without subjects."""
        seqs = self.seqs
        i = int(seqs.searchsorted(seq))  # the method: no numpy dispatch wrapper per read
        if i >= len(seqs) or int(seqs[i]) != seq:
            return None
        row = i if self._order is None else int(self._order[i])
        return self._message(row, seq) if self.has_subject else self._message(row, seq, subject)

    def get_many(self, seqs: list[int]) -> dict[int, StoredMessage]:
        """`get` of ascending sequences (a consumer's pull): one search for them all, the messages made
        in one pass; those not in this group are left out."""
        wanted = np.asarray(seqs, np.int64)
        at = self.seqs.searchsorted(wanted)
        hit = at < len(self.seqs)
        hit[hit] = self.seqs[at[hit]] == wanted[hit]
        rows = at[hit] if self._order is None else self._order[at[hit]]
        found = wanted[hit].tolist()
        return dict(zip(found, self._messages(rows, found)))

    def _messages(self, rows: np.ndarray, seqs: list[int]) -> list[StoredMessage]:
        """The messages at `rows` (sequences `seqs`): from the listed columns without a call a row."""
        if self._lists is None or not self.has_subject:
            return [self._message(row, seq) for row, seq in zip(rows.tolist(), seqs)]
        subjects, msg_ids, headers_, data_ = self._lists
        ts = (self._ts[rows] * 1000).tolist()
        return [StoredMessage(subjects[r], seq, t, data_[r] or b"", dict(headers_[r]) if headers_[r] else None,
                              msg_ids[r]) for r, seq, t in zip(rows.tolist(), seqs, ts)]

    def _point_columns(self) -> tuple[Any, ...]:
        """`_message`'s columns as arrays, made once per group (a chunked column's `[row]` searches its
        chunks on every read); a column absent or null in every row is None: its rows need no conversion."""
        if self._arrays is None:
            self._arrays = tuple(_one_array(self.table, name) for name in ("subject", "msg_id", "headers", "data"))
        return self._arrays

    def _columns(self) -> tuple[Any, ...]:
        """The columns `_message` reads, as Python sequences (`list`)."""
        names = self.table.column_names
        return tuple(self.table.column(name).to_pylist() if name in names else [None] * self.rows
                     for name in ("subject", "msg_id", "headers", "data"))

    def _message(self, row: int, seq: int, subject: str | None = None) -> StoredMessage:
        if self._lists is not None:
            subjects, msg_ids, headers_, data_ = self._lists
            stored, msg_id, headers, data = subjects[row], msg_ids[row], headers_[row], data_[row]
        else:
            stored, msg_id, headers, data = (None if column is None else column[row].as_py()
                                             for column in self._point_columns())
        ts = int(self._ts[row]) * 1000
        return StoredMessage(stored if self.has_subject else subject, seq, ts, data or b"",
                             dict(headers) if headers else None, msg_id)


def _one_array(table: pa.Table, name: str) -> pa.Array | None:
    """A column as one array (its only chunk when it has one: no copy), None when absent or null in every row."""
    if name not in table.column_names:
        return None
    column = table.column(name)
    if column.null_count == len(column):
        return None
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


# A point read's row group: its sequence bounds and its key in the row-group cache (path, group).
PointHint = tuple[int, int, tuple[str, int]]


class Opener(Protocol):
    """An encrypted stream's (sealed.py's Sealer): sealed columns to plaintext, or a window that opens
    the rows it returns."""

    def open(self, table: pa.Table) -> Opened: ...

    def window(self, table: pa.Table) -> Window: ...


class _RowGroups:
    """Decoded row groups of the table's files, least recently used first out, the files' row-group
    bounds (parquet_footer.py) and parsed footers, within one byte budget: the bounds take at most
    half of it (~57 bytes a group of 1,024 rows, and ~3.4 KB a file for its schema and footer template:
    100 M messages in the 1,373 files of 16 MiB flushes take ~10 MB, within the 16 MiB of the default
    32 MiB; past the share, bounds are evicted and read again from their footers, ~2 ms a point read),
    the windows what the rest leave. Whole footers are kept parsed (~7 KB a group) only while those of
    every file whose bounds are held fit together in a quarter (the default's: ~1,100 groups, ~1.1 M
    messages): then a read
    parses nothing (~0.25 ms of a ~0.5 ms point read). A larger table's random reads would evict each
    footer before its reuse, so there a read parses a footer made of its groups' entries alone.
    A file whose size is not the one its footer was read from has been replaced under its name: it
    is met as missing (FileNotFoundError), and the reader reads the file list and bounds again.

    A point read decodes the one row group whose `seq` statistics hold the sequence; later reads in
    that group are binary searches.
    """

    def __init__(self, budget: int, filesystem: Any = None, opener: Opener | None = None) -> None:
        self.budget = budget
        self.bounds_budget = budget // 2
        self.footers_budget = budget // 4
        self.filesystem = filesystem or _LOCAL  # pyarrow's; on S3 a read's chunks are fetched in one request
        self._pre_buffer = filesystem is not None
        self.opener = opener
        self._entries: OrderedDict[tuple[str, int], tuple[Window, int]] = OrderedDict()
        self._bytes = 0
        self._files: OrderedDict[str, FileBounds] = OrderedDict()
        self._files_bytes = 0
        self._files_parsed = 0  # what the held files' whole footers would take parsed
        self._footers: OrderedDict[str, tuple[pq.FileMetaData, int]] = OrderedDict()  # and its bytes
        self._footers_bytes = 0
        self._lock = threading.Lock()

    def find(self, path: str, seq: int, subject: str | None = None) -> tuple[StoredMessage, PointHint] | None:
        """The message `seq` of the file at `path`, from the row groups whose statistics may hold it, with
        the row group that held it, its sequence bounds and its cache key. `subject`, when the caller
        knows the message's, spares decoding the group's subjects."""
        bounds = self.bounds(path)
        for group in np.flatnonzero((bounds.lows <= seq) & (bounds.highs >= seq)).tolist():
            window = self.window(path, bounds, group, subjects=subject is None)
            msg = window.get(seq, subject)
            if msg is not None:
                return msg, (int(bounds.lows[group]), int(bounds.highs[group]), (path, group))
        return None

    def cached(self, key: tuple[str, int]) -> Window | None:
        """The decoded row group `key` if the cache holds it now (nothing is read)."""
        with self._lock:
            cached = self._entries.get(key)
            if cached is None:
                return None
            self._entries.move_to_end(key)
            return cached[0]

    def window(self, path: str, bounds: FileBounds, group: int, listed: bool = False, subjects: bool = True) -> Window:
        """Row group `group` of a file, decoded once while the cache holds it. `subjects=False` (a point
        read whose caller knows the subject) lets a group decoded without its subjects answer; a read
        that needs them decodes the group again, whole, in its place."""
        key = (path, group)
        subjects = subjects or listed or self.opener is not None
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None and (cached[0].has_subject or not subjects):
                self._entries.move_to_end(key)
                window = cached[0]
                if listed and not window.listed:
                    self._put(key, window, cached[1] + window.list())
                return window
        table = self._decode(path, bounds, group, subjects)
        window = self.opener.window(table) if self.opener is not None else Window(table)
        if listed:
            window.list()
        with self._lock:
            self._put(key, window, window.nbytes)
        return window

    def _decode(self, path: str, bounds: FileBounds, group: int, subjects: bool = True) -> pa.Table:
        """The columns a message is made of, of one row group (`subject` only if `subjects`); an optional
        column the group's statistics say is null in every row is not decoded: a plain window reads it
        as absent, an encrypted stream's gets it made of nulls."""
        schema = bounds.schema
        skipped = [name for name in bounds.optional if bounds.empty(group, name)]
        columns = [name for name in _WINDOW_COLUMNS
                   if name in schema.names and name not in skipped and (subjects or name != "subject")]
        table = self.read(path, bounds, [group], columns)
        if self.opener is None:
            return table
        for name in skipped:
            field_ = schema.field(name)
            table = table.append_column(field_, pa.nulls(table.num_rows, field_.type))
        return table

    def read(self, path: str, bounds: FileBounds, groups: list[int], columns: list[str]) -> pa.Table:
        """`columns` of the row groups `groups` of a file, in that order, through a footer of theirs alone."""
        with self.filesystem.open_input_file(path) as file:
            if file.size() != bounds.size or not (bounds.checked or bounds.describes(file)):
                self._drop_file(path)
                raise FileNotFoundError(f"{path} was replaced since its footer was read")
            bounds.checked = True
            meta = self._footer(path, bounds, file)
            if meta is None:
                meta, groups = bounds.metadata(file, groups), list(range(len(groups)))
            # pyarrow's reader itself: pq.ParquetFile's wrapper maps the schema's nested paths on each
            # open (~0.04 ms of a point read); the bounds know each column's leaves
            reader = ParquetReader()
            reader.open(file, metadata=meta, pre_buffer=self._pre_buffer, arrow_extensions_enabled=True)
            leaves = [i for name in columns for i in bounds.leaves.get(name, ())]
            return reader.read_row_groups(groups, column_indices=leaves, use_threads=False)

    def _footer(self, path: str, bounds: FileBounds, file: pa.NativeFile) -> pq.FileMetaData | None:
        """The file's whole footer, parsed, when the held files' footers fit their share; else None."""
        with self._lock:
            cached = self._footers.get(path)
            if cached is not None:
                self._footers.move_to_end(path)
                return cached[0]
            if self._files_parsed > self.footers_budget or path not in self._files:
                return None
        meta = bounds.whole_metadata(file)
        with self._lock:
            if path in self._files and path not in self._footers:
                self._footers[path] = (meta, bounds.parsed_nbytes)
                self._footers_bytes += bounds.parsed_nbytes
                while self._footers_bytes > self.footers_budget and self._footers:
                    self._footers_bytes -= self._footers.popitem(last=False)[1][1]
                self._evict()
        return meta

    def _drop_file(self, path: str) -> None:
        """Forgets a file's bounds, parsed footer and decoded groups (it was replaced under its name)."""
        with self._lock:
            self._forget_footer(path)
            bounds = self._files.pop(path, None)
            if bounds is not None:
                self._files_bytes -= bounds.nbytes
                self._files_parsed -= bounds.parsed_nbytes
            for key in [key for key in self._entries if key[0] == path]:
                self._bytes -= self._entries.pop(key)[1]

    def _forget_footer(self, path: str) -> None:
        cached = self._footers.pop(path, None)
        if cached is not None:
            self._footers_bytes -= cached[1]

    def bounds(self, path: str) -> FileBounds:
        with self._lock:
            cached = self._files.get(path)
            if cached is not None:
                self._files.move_to_end(path)
                return cached
        found = FileBounds.read(path, self.filesystem, _OPTIONAL_COLUMNS)
        with self._lock:
            if path in self._files:
                self._forget_footer(path)
                old = self._files.pop(path)
                self._files_bytes -= old.nbytes
                self._files_parsed -= old.parsed_nbytes
            self._files[path] = found
            self._files_bytes += found.nbytes
            self._files_parsed += found.parsed_nbytes
            while self._files_bytes > self.bounds_budget and len(self._files) > 1:
                gone = next(iter(self._files))
                self._forget_footer(gone)
                old = self._files.pop(gone)
                self._files_bytes -= old.nbytes
                self._files_parsed -= old.parsed_nbytes
            self._evict()
        return found

    def held_files(self) -> dict[str, FileBounds]:
        """The files whose bounds are held now, least recently used first."""
        with self._lock:
            return dict(self._files)

    def adopt(self, path: str, bounds: FileBounds) -> None:
        """Holds bounds made elsewhere (an index snapshot's), within the bounds' share of the budget."""
        with self._lock:
            if path in self._files or self._files_bytes + bounds.nbytes > self.bounds_budget:
                return
            self._files[path] = bounds
            self._files_bytes += bounds.nbytes
            self._files_parsed += bounds.parsed_nbytes
            self._evict()

    def _put(self, key: tuple[str, int], value: Window, size: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        self._entries[key] = (value, size)
        self._bytes += size
        self._evict()

    def _evict(self) -> None:
        while self.nbytes > self.budget and len(self._entries) > 1:
            _, (_, gone) = self._entries.popitem(last=False)
            self._bytes -= gone

    @property
    def nbytes(self) -> int:
        """The bytes held: decoded row groups, files' bounds and parsed footers."""
        return self._bytes + self._files_bytes + self._footers_bytes

    def windows(self) -> list[Window]:
        """The decoded row groups held now."""
        with self._lock:
            return [value for value, _ in self._entries.values()]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0
            self._files.clear()
            self._files_bytes = self._files_parsed = 0
            self._footers.clear()
            self._footers_bytes = 0


def _int64s(column: pa.ChunkedArray) -> np.ndarray:
    """An int64 or timestamp column as numpy int64, zero-copy when it is one chunk without nulls
    (a cast through pyarrow.compute costs more than a small group's decode)."""
    if column.num_chunks == 1 and not column.null_count:
        return column.chunk(0).view(pa.int64()).to_numpy()
    return column.cast(pa.int64()).to_numpy(zero_copy_only=False)


@dataclass
class _FileMap:
    version: int = -1
    paths: list[str] = field(default_factory=list)  # relative to the table, unquoted
    partitions: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    min_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    max_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    max_ts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # microseconds


class TableReads:
    """The read side of one stream's table. Thread-safe: reads run under the stream's lock, the
    flusher marks the table changed from its own thread."""

    def __init__(self, table: TableLocation, partition_of: Callable[[str], str], cache_bytes: int,
                 opener: Opener | None = None, subject_opener: Callable[[pa.Table], pa.Table] | None = None) -> None:
        self.table = table
        self.partition_of = partition_of
        self._files = _FileMap()
        self._files_lock = threading.Lock()
        self._stale = True
        self._log_stale = True  # the log's state in this process may lag the table (a job, another process)
        self._windows: list[tuple[int, int, Window]] = []
        self._window_hint: tuple[int, int, Window] | None = None
        self._point_hint: PointHint | None = None  # the row group of the last point read (its cache key)
        self._generation = 0  # forgets so far: a read that began before one does not leave a hint after it
        self._opener = opener
        self._subject_opener = subject_opener  # protected subjects: the index rows' subjects opened
        self._row_groups = _RowGroups(cache_bytes, table.filesystem, opener)

    def changed(self) -> None:
        """This store committed to the table: the file list is taken again from the log's state, which
        that commit brought up to date in this process."""
        with self._files_lock:
            self._stale = True

    def forget(self) -> None:
        """Drops every decoded message (erasure: nothing erased stays in memory); the log is read again."""
        with self._files_lock:
            self._stale = self._log_stale = True
            self._windows = []
            self._window_hint = None
            self._point_hint = None
            self._generation += 1
        self._row_groups.clear()

    # -- files' bounds -----------------------------------------------------------------------

    def learn_files(self, relative: list[str]) -> None:
        """Reads the bounds of files just written (the flusher's, still in the page cache), so that
        neither a read nor the next start (`file_bounds`) reads their footers for them."""
        for name in relative:
            try:
                self._row_groups.bounds(self.table.file(name))
            except (OSError, ValueError) as exc:  # a read builds them then
                log.debug("bounds of %s not read at its commit: %s", name, exc)

    def file_bounds(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The held files' bounds for an index snapshot (parquet_footer.bounds_to_arrays), by relative path."""
        prefix = self.table.file("")
        held = {path.removeprefix(prefix): b for path, b in self._row_groups.held_files().items()
                if path.startswith(prefix)}
        return bounds_to_arrays(held)

    def adopt_file_bounds(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
        """Holds an index snapshot's files' bounds; a file replaced since under its name is met at its first
        read (`_RowGroups.read`: its size, then its footer's place and first fields). Returns how many
        files' bounds were taken."""
        try:
            found = bounds_from_arrays(meta, arrays)
        except (KeyError, ValueError, TypeError, pa.ArrowInvalid) as exc:
            log.warning("%s: the index snapshot's file bounds do not load (%s): footers are read instead",
                        self.table, exc)
            return 0
        for name, bounds in found.items():
            self._row_groups.adopt(self.table.file(name), bounds)
        return len(found)

    # -- messages -----------------------------------------------------------------------------

    def message(self, seq: int, subject_of: Callable[[], str], subject: str | None = None) -> StoredMessage | None:
        """One message by sequence: the files whose `seq` statistics hold it, then one row group. The
        subject's partition narrows the files only when they span several partitions, so `subject_of`
        (which may read the index's detail of the block) is asked only then. `subject`, when the caller
        knows the message's (a literal subject's last sequence, a block detail in memory), spares
        decoding the group's subjects. The row group that answered the last point read is asked first
        if the cache still holds it: a KV bucket's reads of keys written one after another land in the
        same group, and are answered without the file list and the footers."""
        hint = self._point_hint
        if hint is not None and hint[0] <= seq <= hint[1]:
            window = self._row_groups.cached(hint[2])
            if window is not None and (subject is not None or window.has_subject):
                msg = window.get(seq, subject)
                if msg is not None:
                    return msg
        generation = self._generation
        for attempt in range(2):
            files = self._file_map(refresh=attempt > 0)
            candidates = np.flatnonzero((files.min_seq <= seq) & (files.max_seq >= seq))
            if len(candidates) > 1 and len(set(files.partitions[candidates].tolist())) > 1:
                partition = self.partition_of(subject if subject is not None else subject_of())
                candidates = candidates[files.partitions[candidates] == partition]
            try:
                for i in candidates.tolist():
                    found = self._row_groups.find(self.table.file(files.paths[i]), seq, subject)
                    if found is not None:
                        with self._files_lock:
                            if generation == self._generation:
                                self._point_hint = found[1]
                        return found[0]
                return None
            except FileNotFoundError:
                self.forget()
        return None

    def windowed_many(self, seqs: list[int]) -> tuple[dict[int, StoredMessage], list[int]]:
        """Ascending sequences from the row groups at hand: each is asked once for those in its range not
        found yet, the one that answered last first (groups of several partitions overlap in sequences);
        returns those found and those none held, in order."""
        found: dict[int, StoredMessage] = {}
        rest = seqs
        hint = self._window_hint
        for entry in ([hint] if hint is not None else []) + [e for e in reversed(self._windows) if e is not hint]:
            lo, hi, window = entry
            start, stop = bisect.bisect_left(rest, lo), bisect.bisect_right(rest, hi)
            if start == stop:
                continue
            got = window.get_many(rest[start:stop])
            if got:
                found.update(got)
                self._window_hint = entry
                rest = rest[:start] + [seq for seq in rest[start:stop] if seq not in got] + rest[stop:]
            if not rest:
                break
        return found, rest

    def read_window(self, lo: int, hi: int, partitions: set[str]) -> None:
        """Makes the flushed messages with sequences in [lo, hi] of the given partitions readable by
        `windowed_many`: the row groups holding them, whole and decoded once through the row-group cache,
        so consecutive pulls do not decode a group again."""
        files = self._file_map(refresh=False)
        mask = (files.min_seq <= hi) & (files.max_seq >= lo) & np.isin(files.partitions, list(partitions))
        held = {id(w) for _, _, w in self._windows}
        for i in np.flatnonzero(mask):
            path = self.table.file(files.paths[i])
            try:
                bounds = self._row_groups.bounds(path)
                for group in np.flatnonzero((bounds.lows <= hi) & (bounds.highs >= lo)).tolist():
                    window = self._row_groups.window(path, bounds, group, listed=True)
                    if id(window) not in held:
                        held.add(id(window))
                        self._windows.append((int(bounds.lows[group]), int(bounds.highs[group]), window))
            except FileNotFoundError:
                self.forget()
                return
        if len(self._windows) > READ_WINDOWS:
            del self._windows[: len(self._windows) - READ_WINDOWS]
            self._window_hint = None

    # -- index rows ---------------------------------------------------------------------------

    def index_rows(self, lo: int, hi: int) -> tuple[np.ndarray, pa.Array, np.ndarray, np.ndarray]:
        """(seqs, subjects, sizes, ts in ns) of the rows with lo ≤ seq ≤ hi, ascending, each once."""
        table = self._rows(lo, hi, _INDEX_COLUMNS)
        if not table.num_rows:
            return np.zeros(0, np.int64), pa.array([], pa.string()), np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self._subject_opener is not None:
            table = self._subject_opener(table)
        return (
            table.column("seq").to_numpy().astype(np.int64),
            table.column("subject").combine_chunks(),
            table.column("size").to_numpy().astype(np.int64),
            table.column("ts").cast(pa.int64()).to_numpy().astype(np.int64) * 1000,
        )

    def first_at_or_after(self, lo: int, hi: int, since_ns: int, alive: Callable[[np.ndarray], np.ndarray]) -> int:
        """The lowest sequence lo ≤ seq ≤ hi stamped at or after `since_ns` that `alive` keeps (0: none).
        Reads the `seq` and `ts` columns of one row group at a time, in sequence order, skipping the
        groups whose `ts` statistics end before `since_ns`: a get by time decodes a group or two, not
        the 16 of an index block."""
        for attempt in range(2):
            try:
                return self._first_at_or_after(lo, hi, since_ns, alive, refresh=attempt > 0)
            except FileNotFoundError:
                self.forget()
        return self._first_at_or_after(lo, hi, since_ns, alive, refresh=True)

    def _first_at_or_after(self, lo: int, hi: int, since_ns: int, alive: Callable[[np.ndarray], np.ndarray],
                           refresh: bool) -> int:
        files = self._file_map(refresh)
        groups: list[tuple[int, str, FileBounds, int]] = []
        since_us = since_ns // 1000  # statistics compared in microseconds (a missing one is 2**62)
        reach = files.max_ts + _STATS_TS_GRAIN_US  # the Delta log's `ts` statistics are cut to milliseconds
        for i in np.flatnonzero((files.min_seq <= hi) & (files.max_seq >= lo) & (reach >= since_us)):
            path = self.table.file(files.paths[i])
            bounds = self._row_groups.bounds(path)
            chosen = (bounds.lows <= hi) & (bounds.highs >= lo) & (bounds.last_ts >= since_us)
            groups += [(int(bounds.lows[g]), path, bounds, g) for g in np.flatnonzero(chosen).tolist()]
        groups.sort(key=lambda entry: entry[0])
        best = 0
        for low, path, bounds, group in groups:
            if best and low > best:  # the groups left start after the hit (partitions' groups interleave)
                break
            table = self._row_groups.read(path, bounds, [group], ["seq", "ts"])
            seqs, ts = _int64s(table.column("seq")), _int64s(table.column("ts")) * 1000
            seqs = seqs[(seqs >= lo) & (seqs <= hi) & (ts >= since_ns)]
            seqs = seqs[alive(seqs)] if len(seqs) else seqs
            if len(seqs):
                found = int(seqs.min())
                best = found if not best else min(best, found)
        return best

    def _rows(self, lo: int, hi: int, columns: list[str]) -> pa.Table:
        for attempt in range(2):
            try:
                return self._read_rows(lo, hi, columns, refresh=attempt > 0)
            except FileNotFoundError:
                self.forget()
        return self._read_rows(lo, hi, columns, refresh=True)

    def _read_rows(self, lo: int, hi: int, columns: list[str], refresh: bool) -> pa.Table:
        """`columns` of the rows with lo ≤ seq ≤ hi, sorted by `seq`, each sequence once."""
        files = self._file_map(refresh)
        parts: list[pa.Table] = []
        for i in np.flatnonzero((files.min_seq <= hi) & (files.max_seq >= lo)):
            path = self.table.file(files.paths[i])
            bounds = self._row_groups.bounds(path)
            groups = np.flatnonzero((bounds.lows <= hi) & (bounds.highs >= lo)).tolist()
            if groups:
                parts.append(self._row_groups.read(path, bounds, groups, columns))
        if not parts:
            return pa.table({name: pa.array([], STREAM_SCHEMA.field(name).type) for name in columns})
        table = pa.concat_tables(parts, promote_options="permissive")
        seqs = table.column("seq").to_numpy()
        inside = (seqs >= lo) & (seqs <= hi)  # in numpy: pyarrow converts Python ints through a failed import each call
        if not inside.all():
            table = table.filter(pa.array(inside))
            seqs = seqs[inside]
        if len(seqs) > 1 and (np.diff(seqs) < 0).any():  # delta-rs does not keep the input order in a file
            table = table.sort_by("seq")
        return _once_per_seq(table)

    def recent_msg_ids(self, since_ns: int) -> tuple[list[tuple[str, int, int]], str | None]:
        """The (msg_id, seq, ts) of messages published at or after `since_ns` (the duplicate window),
        in sequence order, and the msg id of the last message: read from the files whose `ts`
        statistics reach the window, not from the whole table."""
        files = self._file_map(refresh=False)
        if not files.paths:
            return [], None
        since_us = since_ns // 1000
        last_file = int(np.argmax(files.max_seq))
        chosen = sorted(set(np.flatnonzero(files.max_ts + _STATS_TS_GRAIN_US >= since_us).tolist()) | {last_file})
        columns = ["seq", "ts", "msg_id"] if self._opener is None else ["seq", "ts", "subject", "headers"]
        parts = [pq.read_table(self.table.file(files.paths[i]), columns=columns,
                               filesystem=self.table.filesystem) for i in chosen]
        table = _once_per_seq(pa.concat_tables(parts, promote_options="permissive").sort_by("seq"))
        if self._opener is not None:  # the msg ids are in the sealed headers
            table = self._opener.open(table).table
        if not table.num_rows:
            return [], None
        last_msg_id = table.column("msg_id")[-1].as_py()
        recent = table.filter(pc.greater_equal(table.column("ts").cast(pa.int64()), since_us))
        recent = recent.filter(pc.is_valid(recent.column("msg_id")))
        ts = (recent.column("ts").cast(pa.int64()).to_numpy() * 1000).tolist()
        ids = list(zip(recent.column("msg_id").to_pylist(), recent.column("seq").to_pylist(), ts, strict=True))
        return [entry for entry in ids if entry[0]], last_msg_id

    def partitions(self) -> set[str]:
        """The partition values the table holds (the partitioner's names after a restart)."""
        return set(self._file_map(refresh=False).partitions.tolist())

    def seq_bounds(self) -> tuple[int, int]:
        """The lowest and highest `seq` statistics of the table's files ((0, 0) without files)."""
        files = self._file_map(refresh=False)
        if not len(files.min_seq):
            return 0, 0
        return int(files.min_seq.min()), int(files.max_seq.max())

    def _file_map(self, refresh: bool) -> _FileMap:
        with self._files_lock:
            if refresh or self._files.version < 0 or self._stale:
                state = log_of(self.table).state(refresh=refresh or self._log_stale)
                files = list(state.files.values())
                min_seq, max_seq = bounds(files, "seq", -1, 2**62)
                self._files = _FileMap(
                    version=state.version,
                    paths=[add.path for add in files],
                    partitions=np.array([add.partition_values.get(PARTITION_COLUMN) for add in files], dtype=object),
                    min_seq=min_seq,
                    max_seq=max_seq,
                    max_ts=bounds(files, "ts", 2**62, 2**62)[1],
                )
                self._stale = self._log_stale = False
            return self._files


def _once_per_seq(table: pa.Table) -> pa.Table:
    """A table sorted by `seq` with each sequence once: an earlier version could append a commit twice
    (when delta-rs raised after the commit landed); such a warehouse opens, each row read once."""
    seqs = table.column("seq").to_numpy()
    if len(seqs) < 2:
        return table
    first = np.ones(len(seqs), np.bool_)
    np.not_equal(seqs[1:], seqs[:-1], out=first[1:])
    if first.all():
        return table
    log.warning("%s holds %d rows twice (a commit appended again); each is read once", "a stream table",
                int((~first).sum()))
    return table.filter(pa.array(first))
