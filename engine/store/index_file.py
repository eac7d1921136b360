"""Index snapshots: a stream's index (engine/index.py) persisted so a restart does not read the table.

The flusher writes one after a commit now and then; recovery loads it and reads only what the table,
the tombstones and the log gained since (the snapshot names the table's app-transaction version and
the log sequence number it reflects). A snapshot that is missing, from another stream incarnation, or
damaged is ignored: the index is then rebuilt from the table, which is always the truth.

    file   = magic "JLX1" | u64 body length | 16-byte xxh3-128 of the body | body
    body   = u32 header length | header JSON | array bytes, in header order
    header = {"meta": {...}, "arrays": [[name, dtype, length], ...]}
"""

from __future__ import annotations

import logging
import struct
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import xxhash

from engine.store.objectstore import ObjectNotFoundError, ObjectStore, ObjectStoreError


log = logging.getLogger(__name__)

MAGIC = b"JLX1"
_HEAD = struct.Struct("<4sQ16s")
_LEN = struct.Struct("<I")


def encode(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    specs = [[name, array.dtype.str, int(array.size)] for name, array in arrays.items()]
    header = orjson.dumps({"meta": meta, "arrays": specs})
    body = b"".join([_LEN.pack(len(header)), header, *(np.ascontiguousarray(a).tobytes() for a in arrays.values())])
    return _HEAD.pack(MAGIC, len(body), xxhash.xxh3_128_digest(body)) + body


def decode(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The snapshot's meta and arrays; raises ValueError if it is not a whole, intact snapshot."""
    if len(data) < _HEAD.size:
        raise ValueError("index snapshot too short")
    magic, length, digest = _HEAD.unpack_from(data, 0)
    body = memoryview(data)[_HEAD.size :]
    if magic != MAGIC or length != len(body) or xxhash.xxh3_128_digest(body) != digest:
        raise ValueError("index snapshot damaged (magic, length or checksum)")
    (header_len,) = _LEN.unpack_from(body, 0)
    header = orjson.loads(body[_LEN.size : _LEN.size + header_len])
    at = _LEN.size + header_len
    arrays: dict[str, np.ndarray] = {}
    for name, dtype, size in header["arrays"]:
        dt = np.dtype(dtype)
        arrays[name] = np.frombuffer(body, dt, size, at).copy()
        at += dt.itemsize * size
    return header["meta"], arrays


_MSG_ID_ARRAYS = ("msg_id_offsets", "msg_id_bytes", "msg_id_seqs", "msg_id_ts")
MsgIds = list[tuple[str, int, int]]  # (msg_id, seq, ts in ns) of the duplicate window, in sequence order


def pack_msg_ids(msg_ids: MsgIds) -> dict[str, np.ndarray]:
    """The duplicate window's ids as arrays of a snapshot (a restart then reads no table for them)."""
    column = pa.array([m[0] for m in msg_ids], pa.large_string())
    offsets = np.frombuffer(column.buffers()[1], np.int64, len(column) + 1) if len(column) else np.zeros(1, np.int64)
    data = np.frombuffer(column.buffers()[2], np.uint8) if len(column) and column.buffers()[2] else np.zeros(0, np.uint8)
    return {
        "msg_id_offsets": offsets.copy(), "msg_id_bytes": data[: int(offsets[-1])].copy(),
        "msg_id_seqs": np.array([m[1] for m in msg_ids], np.int64), "msg_id_ts": np.array([m[2] for m in msg_ids], np.int64),
    }


def unpack_msg_ids(arrays: dict[str, np.ndarray], since_ns: int) -> MsgIds | None:
    """The ids published at or after `since_ns`, taken out of `arrays`; None if the snapshot has none
    (an older snapshot: the caller reads them from the table)."""
    if any(name not in arrays for name in _MSG_ID_ARRAYS):
        return None
    offsets, data, seqs, ts = (arrays.pop(name) for name in _MSG_ID_ARRAYS)
    keep = np.flatnonzero(ts >= since_ns).tolist()
    raw = data.tobytes()
    bounds = offsets.tolist()
    seq_list, ts_list = seqs.tolist(), ts.tolist()
    return [(raw[bounds[i] : bounds[i + 1]].decode(), seq_list[i], ts_list[i]) for i in keep]


def write(store: ObjectStore, key: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Replaces the snapshot object whole (a whole-object put: readers see the old or the new one);
    returns its size."""
    data = encode(meta, arrays)
    store.put(key, data)
    return len(data)


def read(store: ObjectStore, key: str) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The snapshot under `key`, or None (missing or damaged: the caller rebuilds, and says so)."""
    try:
        return decode(store.get(key).data)
    except ObjectNotFoundError:
        return None
    except (OSError, ObjectStoreError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
        log.warning("index snapshot %s unusable (%s): rebuilding the index from the table", key, exc)
        return None
