"""The account's tombstones table read once for every stream's recovery.

Each stream's removals (purges, deletes, limits) are rows of one shared Delta table, with two app
transactions per stream: `<stream_id>/lsn` (the last log record committed there) and `<stream_id>/seq`
(the stream's last sequence then). A restart used to open that table and scan it once per stream,
which made a restart of ten thousand streams read it ten thousand times; `TombstoneView` reads the
columns recovery needs once (the app transactions from its `_delta_log` objects, through the
warehouse's object store, local or S3), groups them by stream, and hands each stream its part. It is
built when the engine opens and dropped once every stream is recovered (nothing writes the table
meanwhile: the flusher has not started). Counterpart: none in nats-server, whose deletions live in
each stream's own message blocks.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.store.delta_actions import LogState
from engine.store.delta_log import TableNotFoundError, log_of
from engine.store.layout import TOMBSTONE_SCHEMA, TableLocation
from engine.store.table_scan import read_all


@dataclass(frozen=True)
class StreamTombstones:
    """One stream's part of the tombstones table: its app-transaction versions and removed ranges."""

    lsn: int  # the last log record whose removals are in the table
    last_seq: int  # the stream's last sequence when it was committed
    first_seqs: np.ndarray
    last_seqs: np.ndarray

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self.first_seqs.tolist(), self.last_seqs.tolist(), strict=True))


_NONE = StreamTombstones(0, 0, np.zeros(0, np.int64), np.zeros(0, np.int64))


class TombstoneView:
    """The tombstones table as it is now, read at the first question and grouped by stream id."""

    def __init__(self, table: TableLocation) -> None:
        self.table = table
        self._state: LogState | None = None
        self._loaded = False
        self._lock = threading.Lock()
        self._starts: dict[str, tuple[int, int]] = {}  # stream_id -> [start, end) rows of the sorted columns
        self._first = np.zeros(0, np.int64)
        self._last = np.zeros(0, np.int64)

    def for_stream(self, stream_id: str) -> StreamTombstones:
        """The stream's versions and ranges (none when the table does not exist yet)."""
        with self._lock:  # streams recover in parallel; the first one to ask reads the table
            if not self._loaded:
                self._load()
        if self._state is None:
            return _NONE
        lsn = self._state.transaction_version(f"{stream_id}/lsn")
        last_seq = self._state.transaction_version(f"{stream_id}/seq")
        start, end = self._starts.get(stream_id, (0, 0))
        return StreamTombstones(lsn, last_seq, self._first[start:end], self._last[start:end])

    def _load(self) -> None:
        self._loaded = True
        try:
            self._state = log_of(self.table).state()
        except TableNotFoundError:
            return
        wanted = pa.schema([TOMBSTONE_SCHEMA.field(name) for name in ("stream_id", "first_seq", "last_seq")])
        rows = read_all(self.table, self._state, wanted)
        if not rows.num_rows:
            return
        order = pc.sort_indices(rows, sort_keys=[("stream_id", "ascending")])
        rows = rows.take(order)
        ids = rows.column("stream_id").combine_chunks()
        self._first = rows.column("first_seq").to_numpy().astype(np.int64)
        self._last = rows.column("last_seq").to_numpy().astype(np.int64)
        encoded = ids.dictionary_encode() if not pa.types.is_dictionary(ids.type) else ids
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        names = encoded.dictionary.to_pylist()
        bounds = np.flatnonzero(np.diff(codes)) + 1
        starts = np.concatenate([[0], bounds]).tolist()
        ends = np.concatenate([bounds, [len(codes)]]).tolist()
        for start, end in zip(starts, ends, strict=True):
            self._starts[names[codes[start]]] = (start, end)
