"""Sealed rows: an encrypted stream's messages as its write-ahead log and its table hold them.

A stream made while its account has a key (engine/keys/) stores `data` and `headers` (the header map
as JSON) sealed with its data keys, in engine/keys/cipher.py's layout that Spark's `aes_decrypt(...,
'GCM')` reads, and no `msg_id` (it is a header, so content); `seq`, `subject`, `ts`, `size` and the
partition stay plain, so the index, pruning, retention and erasure work on them as on a plain stream.
The ack table and the tombstones hold sequences, names and reasons only, so they stay as they are.

The read buffer holds plaintext. A group of messages is sealed once, when the log appends it (one
`KIND_SEALED` record: the sealed batch's Arrow IPC), and the flusher commits that same sealed batch to
the table. Reads open what they decode; a value that cannot be opened (its key destroyed, or bytes
that fail authentication) is reported for its message only (`Opened.errors`), and the others serve.
Counterpart: the encrypted message blocks of server/filestore.go (`encryptMsgBlock`, `checkAndLoadEncryption`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa

from engine import headers as hdr
from engine.errors import JetStreamError
from engine.keys import StreamKeys
from engine.store.layout import SEALED_STREAM_SCHEMA, STREAM_SCHEMA
from engine.store.rows import RowGroup, Rows

KIND_SEALED = 4  # a write-ahead log record kind (beside rows.py's KIND_ARROW, KIND_PACKED; delta.py's KIND_REMOVE)
DATA, HEADERS = "data", "headers"
_HEADERS_TYPE = STREAM_SCHEMA.field("headers").type
_TS_TYPE = STREAM_SCHEMA.field("ts").type


@dataclass
class Opened:
    """Rows opened back to plaintext (STREAM_SCHEMA's columns) and the errors of those that would not open."""

    table: pa.Table
    errors: dict[int, JetStreamError] = field(default_factory=dict)  # by seq


class Sealer:
    """Seals and opens one encrypted stream's rows; keeps each unflushed group's sealed batch for the flush."""

    def __init__(self, keys: StreamKeys) -> None:
        self.keys = keys
        self._sealed: dict[int, pa.RecordBatch] = {}  # by first seq, until flushed

    # -- the write path -----------------------------------------------------------------------

    def encode(self, rows: RowGroup) -> tuple[int, memoryview]:
        """The group's log record; its sealed batch is kept for the flush."""
        batch = self.seal(rows)
        self._sealed[rows.first_seq] = batch
        return KIND_SEALED, memoryview(batch.serialize())

    def seal(self, rows: RowGroup) -> pa.RecordBatch:
        n = len(rows)
        seqs = range(rows.first_seq, rows.first_seq + n)
        subjects = rows.subjects
        if isinstance(rows, Rows):
            data: pa.Array | list[bytes] = rows.data
            header_maps = rows.headers
            ts = pa.array(np.array(rows.ts, np.int64) // 1000, _TS_TYPE)
            partitions = pa.array(rows.partitions, pa.string())
            sizes = pa.array(rows.sizes, pa.int32())
        else:
            plain = rows.to_arrow()
            data = plain.column(DATA)
            column = plain.column(HEADERS)
            header_maps = [dict(h) if h else None for h in column.to_pylist()] if column.null_count < n else [None] * n
            ts, partitions, sizes = plain.column("ts"), plain.column("subject_partition"), plain.column("size")
        return pa.RecordBatch.from_arrays(
            [
                pa.array(np.arange(rows.first_seq, rows.first_seq + n, dtype=np.int64)),
                pa.array(subjects, pa.string()),
                ts,
                pa.nulls(n, pa.string()),
                self._seal_headers(seqs, subjects, header_maps),
                self.keys.seal_batch(DATA, seqs, subjects, data),
                sizes,
                partitions,
            ],
            schema=SEALED_STREAM_SCHEMA,
        )

    def _seal_headers(self, seqs: range, subjects: list[str], maps: list[dict[str, list[str]] | None]) -> pa.Array:
        if maps.count(None) == len(maps):
            return pa.nulls(len(maps), pa.binary())
        return self.keys.seal_batch(HEADERS, seqs, subjects, [orjson.dumps(h) if h else None for h in maps])

    def table(self, groups: list[RowGroup]) -> pa.Table:
        """The flush's table: the sealed batches of the unflushed groups, as the log holds them."""
        return pa.Table.from_batches([self._sealed[g.first_seq] for g in groups], schema=SEALED_STREAM_SCHEMA)

    def forget_upto(self, seq: int) -> None:
        """Drops the sealed batches of groups the table holds now."""
        for first in [f for f, b in self._sealed.items() if f + b.num_rows - 1 <= seq]:
            del self._sealed[first]

    # -- replay and reads ---------------------------------------------------------------------

    def decode(self, payload: bytes) -> tuple[Rows, dict[int, JetStreamError]]:
        """A log record back to plaintext rows (the sealed batch is kept for the flush), and the
        messages that would not open (their rows hold an empty payload)."""
        batch = pa.ipc.read_record_batch(pa.py_buffer(payload), SEALED_STREAM_SCHEMA)
        first = int(batch.column(0)[0].as_py()) if batch.num_rows else 0
        self._sealed[first] = batch
        opened = self.open(pa.Table.from_batches([batch]))
        t = opened.table
        rows = Rows(
            first, t.column("subject").to_pylist(), (t.column("ts").cast(pa.int64()).to_numpy() * 1000).tolist(),
            t.column("msg_id").to_pylist(), [dict(h) if h else None for h in t.column(HEADERS).to_pylist()],
            [d or b"" for d in t.column(DATA).to_pylist()], t.column("size").to_pylist(),
            t.column("subject_partition").to_pylist(),
        )
        return rows, opened.errors

    def open(self, table: pa.Table) -> Opened:
        """Opens the sealed `data` and `headers` columns present in `table` (and fills `msg_id` from the
        headers); the other columns pass through."""
        seqs = table.column("seq").to_pylist()
        subjects = table.column("subject").to_pylist()
        errors: dict[int, JetStreamError] = {}
        if DATA in table.column_names:
            batch = self.keys.open_batch(DATA, seqs, subjects, table.column(DATA).combine_chunks())
            errors.update((seqs[i], e) for i, e in batch.errors.items())
            table = table.set_column(table.column_names.index(DATA), DATA, pa.array(batch.values, pa.binary()))
        if HEADERS in table.column_names:
            batch = self.keys.open_batch(HEADERS, seqs, subjects, table.column(HEADERS).combine_chunks())
            errors.update((seqs[i], e) for i, e in batch.errors.items())
            maps = [orjson.loads(v) if v else None for v in batch.values]
            table = table.set_column(table.column_names.index(HEADERS), HEADERS,
                                     pa.array([list(m.items()) if m else None for m in maps], _HEADERS_TYPE))
            msg_ids = pa.array([hdr.first(m, hdr.MSG_ID) for m in maps], pa.string())
            if "msg_id" in table.column_names:
                table = table.set_column(table.column_names.index("msg_id"), "msg_id", msg_ids)
            else:
                table = table.append_column("msg_id", msg_ids)
        return Opened(table, errors)
