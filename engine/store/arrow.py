"""Messages to and from Arrow record batches, the unit of the log, the buffer and the table."""

from __future__ import annotations

import pyarrow as pa

from engine.store.base import StoredMessage
from engine.store.layout import STREAM_SCHEMA

def _use_jemalloc() -> None:
    """Arrow's default mimalloc pool pays for fresh pages on every batch once the buffer cache holds
    memory (measured: 4 ms to serialise 1 MB against 0.25 ms with jemalloc)."""
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):
        pass


_use_jemalloc()
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


def to_ipc(batch: pa.RecordBatch) -> pa.Buffer:
    """One Arrow IPC record-batch message, without the schema: the log's records are all STREAM_SCHEMA."""
    return batch.serialize()


def from_ipc(payload: bytes | pa.Buffer) -> pa.RecordBatch:
    return pa.ipc.read_record_batch(pa.py_buffer(payload), STREAM_SCHEMA)


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
