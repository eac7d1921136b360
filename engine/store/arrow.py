"""Messages to and from Arrow record batches, the unit of the log, the buffer and the table."""

from __future__ import annotations

import pyarrow as pa

from engine.store.base import StoredMessage
from engine.store.layout import STREAM_SCHEMA

_HEADERS_TYPE = STREAM_SCHEMA.field("headers").type
_TS_TYPE = STREAM_SCHEMA.field("ts").type


def build_batch(
    seqs: list[int],
    subjects: list[str],
    ts_ns: list[int],
    msg_ids: list[str | None],
    headers: list[dict[str, list[str]] | None],
    data: list[bytes],
    sizes: list[int],
    partitions: list[str],
) -> pa.RecordBatch:
    header_items = [list(h.items()) if h else None for h in headers]
    return pa.RecordBatch.from_arrays(
        [
            pa.array(seqs, pa.int64()),
            pa.array(subjects, pa.string()),
            pa.array([t // 1000 for t in ts_ns], pa.int64()).cast(_TS_TYPE),
            pa.array(msg_ids, pa.string()),
            pa.array(header_items, _HEADERS_TYPE),
            pa.array(data, pa.binary()),
            pa.array(sizes, pa.int32()),
            pa.array(partitions, pa.string()),
        ],
        schema=STREAM_SCHEMA,
    )


def to_ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def from_ipc(payload: bytes) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(payload)
    batches = list(reader)
    return batches[0] if len(batches) == 1 else pa.Table.from_batches(batches).combine_chunks().to_batches()[0]


def message_at(batch: pa.RecordBatch | pa.Table, row: int) -> StoredMessage:
    rec = batch.slice(row, 1).to_pylist()[0]
    headers = rec["headers"]
    return StoredMessage(
        subject=rec["subject"],
        seq=rec["seq"],
        ts=_ts_ns(batch, row),
        data=rec["data"] or b"",
        headers=dict(headers) if headers else None,
        msg_id=rec["msg_id"],
    )


def _ts_ns(batch: pa.RecordBatch | pa.Table, row: int) -> int:
    value = batch.column("ts").cast(pa.int64())[row].as_py()
    return int(value) * 1000
