"""Sealed rows: an encrypted stream's messages as its write-ahead log and its table hold them.

A stream made while its account has a key (engine/keys/) stores `data` and `headers` (the header map
as JSON) sealed with its data keys, in engine/keys/cipher.py's layout that Spark's `aes_decrypt(...,
'GCM')` reads, and no `msg_id` (it is a header, so content); `seq`, `subject`, `ts`, `size` and the
partition stay plain, so the index, pruning, retention and erasure work on them as on a plain stream.
The ack table and the tombstones hold sequences, names and reasons only, so they stay as they are.

The read buffer holds plaintext. A group of messages is sealed once, when the log appends it, and the
flusher commits those same sealed values to the table: a large group as one Arrow batch (a
`KIND_SEALED` record, its IPC), a small one (a single publish) as lists in a packed record
(`KIND_SEALED_PACKED`, rows.py's small layout with sealed values), made a batch only at the flush, so
a single publish pays no Arrow batch. Reads open what they decode (reads by sequence: the message read,
sealed_window.py); a value that cannot be opened (its key destroyed, or bytes that fail authentication)
is reported for its message only (`Opened.errors`), and the others serve.
The index snapshot (index_file.py) is not encrypted; the duplicate window's message ids it carries
for a restart are header content, so an encrypted stream's go into it sealed (`seal_msg_ids`), one
value for the whole window: a restart opens that one value instead of every sealed header.

Protected subjects (`protected`, the stream's `jetlake.protected_subjects`): the `subject` column of
the log and the table holds each subject sealed too (field `subject`, with the key of its prefix, so
shredding a prefix erases its subjects as well; PROTECTED_STREAM_SCHEMA), the partition values are
keyed hashes (layout.py's Partitioner with the stream's subject key), and the snapshot's subject names
and their hash slots go into it as one sealed value (`seal_subject_arrays`). Memory holds plain subjects:
reads, filters and limits work as on any stream.
Counterpart: the encrypted message blocks of server/filestore.go (`encryptMsgBlock`, `checkAndLoadEncryption`).
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass, field

import numpy as np
import orjson
import pyarrow as pa

from engine import headers as hdr
from engine.errors import JetStreamError
from engine.keys import StreamKeys
from engine.store import index_file
from engine.store.layout import PROTECTED_STREAM_SCHEMA, SEALED_STREAM_SCHEMA, STREAM_SCHEMA
from engine.store.rows import RowGroup, Rows
from engine.store.sealed_window import SealedWindow

KIND_SEALED = 4  # log record kinds (beside rows.py's KIND_ARROW, KIND_PACKED; removal_records.py's KIND_REMOVE)
KIND_SEALED_PACKED = 5
SEALED_KINDS = (KIND_SEALED, KIND_SEALED_PACKED)
SMALL = 64  # rows.py's ARROW_FROM
KEY_REF_SIZE = 5  # engine/keys/cipher.py's HEADER_SIZE
_SMALL = struct.Struct("<qqiIIII")  # seq, ts_ns, size, len(subject), len(partition), len(headers)+1 or 0, len(data)
DATA, HEADERS, SUBJECT = "data", "headers", "subject"
ERASED_SUBJECT = ""  # what a protected subject whose key was destroyed reads as (its message is erased)
SUBJECT_NAMES = "subject_names"  # the associated data's field of the snapshot's sealed subject names
SEALED_SUBJECT_NAMES = "subject_names_sealed"  # the snapshot array that replaces the ones below
_SUBJECT_ARRAYS = ("subject_arena", "subject_slots", "subject_slot_ids")  # subject_table.py: names and their hashes
MSG_IDS = "msg_ids"  # the associated data's field of the snapshot's sealed duplicate window
SEALED_MSG_IDS = "msg_id_sealed"  # the snapshot array that replaces index_file's `msg_id_bytes`
_HEADERS_TYPE = STREAM_SCHEMA.field("headers").type
_TS_TYPE = STREAM_SCHEMA.field("ts").type


@dataclass
class Opened:
    """Rows opened back to plaintext (STREAM_SCHEMA's columns) and the errors of those that would not open."""

    table: pa.Table
    errors: dict[int, JetStreamError] = field(default_factory=dict)  # by seq


@dataclass(slots=True)
class SealedRows:
    """A small group's sealed values as lists: its log record, and its rows of the flush's batch."""

    first_seq: int
    subjects: list[str] | list[bytes]  # as stored: plain, or sealed (protected subjects)
    ts: list[int]  # ns
    sizes: list[int]
    partitions: list[str]
    headers: list[bytes | None]
    data: list[bytes | None]

    def __len__(self) -> int:
        return len(self.subjects)

    def encode(self) -> bytes:
        parts: list[bytes] = []
        for i, subject in enumerate(self.subjects):
            s = subject if isinstance(subject, bytes) else subject.encode()
            p, h, d = self.partitions[i].encode(), self.headers[i], self.data[i] or b""
            head = _SMALL.pack(self.first_seq + i, self.ts[i], self.sizes[i], len(s), len(p),
                               0 if h is None else len(h) + 1, len(d))
            parts += (head, s, p, h or b"", d)
        return b"".join(parts)

    @classmethod
    def decode(cls, payload: bytes, protected: bool = False) -> SealedRows:
        """A packed record back to lists; `protected` keeps the subjects as the sealed bytes they are."""
        rows = cls(0, [], [], [], [], [], [])
        view = memoryview(payload)
        offset = 0
        while offset < len(view):
            seq, ts, size, ls, lp, lh, ld = _SMALL.unpack_from(view, offset)
            offset += _SMALL.size
            if not rows.subjects:
                rows.first_seq = seq
            subject = bytes(view[offset : offset + ls])
            rows.subjects.append(subject if protected else subject.decode())  # type: ignore[arg-type]
            offset += ls
            rows.partitions.append(bytes(view[offset : offset + lp]).decode())
            offset += lp
            rows.headers.append(bytes(view[offset : offset + lh - 1]) if lh else None)
            offset += max(lh - 1, 0)
            rows.data.append(bytes(view[offset : offset + ld]))
            offset += ld
            rows.ts.append(ts)
            rows.sizes.append(size)
        return rows

    def extend(self, other: SealedRows) -> None:
        for name in ("subjects", "ts", "sizes", "partitions", "headers", "data"):
            getattr(self, name).extend(getattr(other, name))

    def seqs(self) -> list[int]:
        return list(range(self.first_seq, self.first_seq + len(self.subjects)))

    def to_batch(self, seqs: list[int], schema: pa.Schema = SEALED_STREAM_SCHEMA) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [
                pa.array(seqs, pa.int64()),
                pa.array(self.subjects, schema.field(SUBJECT).type),
                pa.array(np.array(self.ts, np.int64) // 1000, _TS_TYPE),
                pa.nulls(len(seqs), pa.string()),
                pa.array(self.headers, pa.binary()),
                pa.array(self.data, pa.binary()),
                pa.array(self.sizes, pa.int32()),
                pa.array(self.partitions, pa.string()),
            ],
            schema=schema,
        )


class Sealer:
    """Seals and opens one encrypted stream's rows; keeps each unflushed group's sealed batch for the flush."""

    def __init__(self, keys: StreamKeys, protected: bool = False) -> None:
        self.keys = keys
        self.protected = protected  # subjects sealed too, partition values keyed hashes
        self.schema = PROTECTED_STREAM_SCHEMA if protected else SEALED_STREAM_SCHEMA
        self._sealed: dict[int, pa.RecordBatch | SealedRows] = {}  # by first seq, until flushed

    # -- the write path -----------------------------------------------------------------------

    def encode(self, rows: RowGroup) -> tuple[int, bytes | memoryview]:
        """The group's log record; its sealed values are kept for the flush."""
        if isinstance(rows, Rows) and len(rows) < SMALL:
            small = self._seal_small(rows)
            self._sealed[rows.first_seq] = small
            return KIND_SEALED_PACKED, small.encode()
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
                self._subject_column(seqs, subjects),
                ts,
                pa.nulls(n, pa.string()),
                self._seal_headers(seqs, subjects, header_maps),
                self.keys.seal_batch(DATA, seqs, subjects, data),
                sizes,
                partitions,
            ],
            schema=self.schema,
        )

    def _subject_column(self, seqs: range, subjects: list[str]) -> pa.Array:
        if not self.protected:
            return pa.array(subjects, pa.string())
        return self.keys.seal_batch(SUBJECT, seqs, subjects, [s.encode() for s in subjects])

    def _seal_small(self, rows: Rows) -> SealedRows:
        headers = [orjson.dumps(h) if h else None for h in rows.headers]
        fields: dict[str, list[bytes] | list[bytes | None]] = {DATA: rows.data, HEADERS: headers}
        if self.protected:
            fields[SUBJECT] = [s.encode() for s in rows.subjects]
        sealed = self.keys.seal_rows(rows.first_seq, rows.subjects, fields)  # type: ignore[arg-type]
        subjects: list[str] | list[bytes] = sealed[SUBJECT] if self.protected else rows.subjects  # type: ignore[assignment]
        return SealedRows(rows.first_seq, subjects, rows.ts, rows.sizes, rows.partitions, sealed[HEADERS], sealed[DATA])

    def _seal_headers(self, seqs: range, subjects: list[str], maps: list[dict[str, list[str]] | None]) -> pa.Array:
        if maps.count(None) == len(maps):
            return pa.nulls(len(maps), pa.binary())
        return self.keys.seal_batch(HEADERS, seqs, subjects, [orjson.dumps(h) if h else None for h in maps])

    def table(self, groups: list[RowGroup]) -> pa.Table:
        """The flush's table: the sealed values of the unflushed groups, as the log holds them (runs of
        small groups become one batch)."""
        batches: list[pa.RecordBatch] = []
        run: SealedRows | None = None
        seqs: list[int] = []
        for group in groups:
            sealed = self._sealed[group.first_seq]
            if isinstance(sealed, SealedRows):
                if run is None:
                    run = SealedRows(0, [], [], [], [], [], [])
                run.extend(sealed)
                seqs += sealed.seqs()
                continue
            if run is not None:
                batches.append(run.to_batch(seqs, self.schema))
                run, seqs = None, []
            batches.append(sealed)
        if run is not None:
            batches.append(run.to_batch(seqs, self.schema))
        return pa.Table.from_batches(batches, schema=self.schema)

    def forget_upto(self, seq: int) -> None:
        """Drops the sealed batches of groups the table holds now."""
        for first in [f for f, b in self._sealed.items() if f + len(b) - 1 <= seq]:
            del self._sealed[first]

    # -- replay and reads ---------------------------------------------------------------------

    def decode(self, kind: int, payload: bytes) -> tuple[Rows, dict[int, JetStreamError]]:
        """A log record back to plaintext rows (the sealed values are kept for the flush), and the
        messages that would not open (their rows hold an empty payload)."""
        if kind == KIND_SEALED_PACKED:
            return self._decode_small(SealedRows.decode(payload, self.protected))
        batch = pa.ipc.read_record_batch(pa.py_buffer(payload), self.schema)
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

    def _decode_small(self, small: SealedRows) -> tuple[Rows, dict[int, JetStreamError]]:
        self._sealed[small.first_seq] = small
        seqs = small.seqs()
        errors: dict[int, JetStreamError] = {}
        subjects: list[str] = small.subjects  # type: ignore[assignment]
        if self.protected:
            subjects = self._open_subjects(seqs, small.subjects, errors)
        data = self.keys.open_batch(DATA, seqs, subjects, small.data)
        headers = self.keys.open_batch(HEADERS, seqs, subjects, small.headers)
        maps = [orjson.loads(v) if v else None for v in headers.values]
        errors.update({seqs[i]: e for i, e in (*data.errors.items(), *headers.errors.items())})
        rows = Rows(small.first_seq, subjects, small.ts, [hdr.first(m, hdr.MSG_ID) for m in maps], maps,
                    [d or b"" for d in data.values], small.sizes, small.partitions)
        return rows, errors

    # -- the index snapshot's duplicate window -----------------------------------------------

    def seal_msg_ids(self, arrays: dict[str, np.ndarray], last_msg_id: str | None, seq: int) -> dict[str, np.ndarray]:
        """index_file.pack_msg_ids's arrays with the ids (and the last id) as one sealed value, bound to
        the stream and the snapshot's flushed `seq`; offsets, sequences and times stay plain."""
        plain = orjson.dumps({"last": last_msg_id, "ids": arrays["msg_id_bytes"].tobytes().decode()})
        sealed = self.keys.seal_one(MSG_IDS, seq, "", plain)
        out = {name: a for name, a in arrays.items() if name != "msg_id_bytes"}
        out[SEALED_MSG_IDS] = np.frombuffer(sealed, np.uint8).copy()
        return out

    def seal_subject_arrays(self, arrays: dict[str, np.ndarray], seq: int) -> dict[str, np.ndarray]:
        """A protected stream's snapshot arrays with the subject names and their (unkeyed) hash slots as
        one sealed value, bound to the stream and the snapshot's flushed `seq`; counts stay plain."""
        if not self.protected:
            return arrays
        names = {name: arrays[name] for name in _SUBJECT_ARRAYS}
        sealed = self.keys.seal_one(SUBJECT_NAMES, seq, "", index_file.encode({}, names))
        out = {name: a for name, a in arrays.items() if name not in names}
        out[SEALED_SUBJECT_NAMES] = np.frombuffer(sealed, np.uint8).copy()
        return out

    def open_subject_arrays(self, arrays: dict[str, np.ndarray], seq: int) -> bool:
        """Puts the opened subject arrays back into `arrays`; False when a protected stream's snapshot has
        none or they do not open (their key retired or destroyed): the caller rebuilds from the table."""
        if not self.protected:
            return True
        sealed = arrays.pop(SEALED_SUBJECT_NAMES, None)
        if sealed is None:
            return False
        try:
            _, names = index_file.decode(self.keys.open_one(SUBJECT_NAMES, seq, "", sealed.tobytes()))
        except (JetStreamError, ValueError):
            return False
        arrays.update(names)
        return True

    def seal_config(self, name: str, config: dict[str, object]) -> str:
        """A config of the stream's (a consumer's: its filters name subjects) as one sealed value in
        base64, for a JSON record; see StreamKeys.seal_config."""
        return base64.b64encode(self.keys.seal_config(name, orjson.dumps(config))).decode()

    def open_config(self, name: str, text: str) -> dict[str, object]:
        opened: dict[str, object] = orjson.loads(self.keys.open_config(name, base64.b64decode(text)))
        return opened

    def open_msg_ids(self, arrays: dict[str, np.ndarray], seq: int) -> tuple[str | None] | None:
        """Puts the opened ids back as `msg_id_bytes` into `arrays` and returns (last id,); None when the
        snapshot has no sealed window or it does not open (its key retired by a rotation, or destroyed):
        the caller then reads the ids from the sealed table."""
        sealed = arrays.pop(SEALED_MSG_IDS, None)
        if sealed is None:
            return None
        try:
            window = orjson.loads(self.keys.open_one(MSG_IDS, seq, "", sealed.tobytes()))
        except JetStreamError:
            return None
        arrays["msg_id_bytes"] = np.frombuffer(window["ids"].encode(), np.uint8).copy()
        return (window["last"],)

    def _open_subjects(self, seqs: list[int], values: pa.Array | list[bytes],
                       errors: dict[int, JetStreamError]) -> list[str]:
        """Protected subjects to plain ones; one that does not open reads as ERASED_SUBJECT, its error in `errors`."""
        opened = self.keys.open_batch(SUBJECT, seqs, None, values)
        errors.update((seqs[i], e) for i, e in opened.errors.items())
        return [v.decode() if v is not None else ERASED_SUBJECT for v in opened.values]

    def open_subjects(self, table: pa.Table) -> pa.Table:
        """`table` with its `subject` column opened (a protected stream's; for the index, which keeps
        plain subjects, and for scans by subject). Subjects that do not open (their key destroyed: the
        message is erased) read as ERASED_SUBJECT."""
        if not self.protected or not pa.types.is_binary(table.schema.field(SUBJECT).type):
            return table
        seqs = table.column("seq").to_pylist()
        plain = self._open_subjects(seqs, table.column(SUBJECT).combine_chunks(), {})
        return table.set_column(table.column_names.index(SUBJECT), SUBJECT, pa.array(plain, pa.string()))

    def window(self, table: pa.Table) -> SealedWindow:
        """A decoded row group for reads by sequence: its values opened when a message is read."""
        return SealedWindow(self.keys, table)

    def open(self, table: pa.Table) -> Opened:
        """Opens the sealed `subject` (protected), `data` and `headers` columns present in `table` (and
        fills `msg_id` from the headers); the other columns pass through."""
        seqs = table.column("seq").to_pylist()
        errors: dict[int, JetStreamError] = {}
        if self.protected and pa.types.is_binary(table.schema.field(SUBJECT).type):
            subjects = self._open_subjects(seqs, table.column(SUBJECT).combine_chunks(), errors)
            table = table.set_column(table.column_names.index(SUBJECT), SUBJECT, pa.array(subjects, pa.string()))
        else:
            subjects = table.column(SUBJECT).to_pylist()
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


def key_refs(kind: int, payload: bytes) -> set[bytes]:
    """The key references of the sealed values in one log record (which keys its messages still need)."""
    if kind == KIND_SEALED_PACKED:
        small = SealedRows.decode(payload, protected=True)  # the subjects stay bytes, sealed or not
        values = [v for v in (*small.data, *small.headers) if v]
    elif kind == KIND_SEALED:
        batch = pa.ipc.read_record_batch(pa.py_buffer(payload), PROTECTED_STREAM_SCHEMA)
        values = [v for column in (DATA, HEADERS) for v in batch.column(column).to_pylist() if v]
    else:
        return set()
    return {bytes(v[:KEY_REF_SIZE]) for v in values}


def seq_range(kind: int, payload: bytes) -> tuple[int, int] | None:
    """The first and last sequence of a sealed log record (None for another kind), without opening a
    value: what the erase job needs to know of a log it cannot decrypt."""
    if kind == KIND_SEALED_PACKED:
        seqs = SealedRows.decode(payload, protected=True).seqs()
    elif kind == KIND_SEALED:
        seqs = pa.ipc.read_record_batch(pa.py_buffer(payload), PROTECTED_STREAM_SCHEMA).column("seq").to_pylist()
    else:
        return None
    return (seqs[0], seqs[-1]) if seqs else None
