"""Index snapshots: a stream's index (engine/index.py) persisted so a restart does not read the table.

The flusher writes one after a commit now and then; recovery loads it and reads only what the table,
the tombstones and the log gained since (the snapshot names the table's app-transaction version and
the log sequence number it reflects). A snapshot that is missing, from another stream incarnation, or
damaged is ignored: the index is then rebuilt from the table, which is always the truth.

    file    = magic "JLX2" | u64 payload length | 16-byte xxh3-128 of the payload | payload
    payload = u64 body length | body compressed as zstd frames (the header's, then one an array)
    body    = u32 header length | header JSON | array bytes, in header order
    header  = {"meta": {...}, "arrays": [[name, dtype, length, stored dtype, base], ...]}

An integer array is stored in the narrowest integer type its values fit, or as differences between
neighbours (`base` is then its first value; otherwise null) when those fit a narrower one: sorted
sequences, times and counts of one become bytes that zstd shrinks further. With a million subjects
that takes the snapshot from ~80 bytes a subject (JLX1: every array at full width, uncompressed) to
~20; JLX1 snapshots are still read.
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

MAGIC = b"JLX2"
MAGIC_V1 = b"JLX1"  # uncompressed, full-width arrays: read, no longer written
_HEAD = struct.Struct("<4sQ16s")
_LEN = struct.Struct("<I")
_RAW_LEN = struct.Struct("<Q")
_ZSTD_LEVEL = 3
_NARROW = [np.dtype(t) for t in ("i1", "u1", "i2", "u2", "i4", "u4", "i8")]


def encode(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> bytes:
    """The snapshot's bytes. Each array is packed and compressed on its own, as a zstd frame of the body
    (concatenated frames decompress as one), so the body is never whole in memory: with a million
    subjects, joining it and its copies took the flush's memory ~100 MB above the index's."""
    codec = pa.Codec("zstd", _ZSTD_LEVEL)
    specs: list[list[Any]] = []
    frames: list[bytes] = []
    body_len = 0
    for name, array in arrays.items():
        stored, base = _packed(np.ascontiguousarray(array))
        specs.append([name, array.dtype.str, int(array.size), stored.dtype.str, base])
        if stored.nbytes:
            frames.append(codec.compress(stored, asbytes=True))
            body_len += stored.nbytes
    header = orjson.dumps({"meta": meta, "arrays": specs})
    head = _LEN.pack(len(header)) + header
    payload = b"".join([_RAW_LEN.pack(body_len + len(head)), codec.compress(head, asbytes=True), *frames])
    return _HEAD.pack(MAGIC, len(payload), xxhash.xxh3_128_digest(payload)) + payload


def decode(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The snapshot's meta and arrays (JLX2 or JLX1); raises ValueError if it is not a whole, intact snapshot."""
    magic, body = _body(data)
    return _decode_body(memoryview(body), packed=magic == MAGIC)


def plain_bytes(data: bytes) -> bytes:
    """A snapshot's body as it is before compression: what a scan for data held in clear must read
    (the stored bytes are zstd's). Raises ValueError as `decode` does."""
    return bytes(_body(data)[1])


def _body(data: bytes) -> tuple[bytes, bytes | memoryview]:
    if len(data) < _HEAD.size:
        raise ValueError("index snapshot too short")
    magic, length, digest = _HEAD.unpack_from(data, 0)
    payload = memoryview(data)[_HEAD.size :]
    if magic not in (MAGIC, MAGIC_V1) or length != len(payload) or xxhash.xxh3_128_digest(payload) != digest:
        raise ValueError("index snapshot damaged (magic, length or checksum)")
    if magic == MAGIC_V1:
        return magic, payload
    if len(payload) < _RAW_LEN.size:
        raise ValueError("index snapshot damaged (no body length)")
    (body_len,) = _RAW_LEN.unpack_from(payload, 0)
    try:
        return magic, pa.Codec("zstd").decompress(payload[_RAW_LEN.size :], decompressed_size=body_len, asbytes=True)
    except (pa.ArrowException, OSError) as exc:
        raise ValueError(f"index snapshot damaged (zstd: {exc})") from None


def _decode_body(body: memoryview, packed: bool) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    (header_len,) = _LEN.unpack_from(body, 0)
    header = orjson.loads(body[_LEN.size : _LEN.size + header_len])
    at = _LEN.size + header_len
    arrays: dict[str, np.ndarray] = {}
    for spec in header["arrays"]:
        name, dtype, size = spec[:3]
        stored, base = (np.dtype(spec[3]), spec[4]) if packed else (np.dtype(dtype), None)
        count = size - 1 if base is not None else size  # differences: one fewer than values
        raw = np.frombuffer(body, stored, count, at)
        at += stored.itemsize * count
        arrays[name] = _unpacked(raw, np.dtype(dtype), base)
    if at != len(body):
        raise ValueError("index snapshot damaged (array lengths do not add up to the body)")
    return header["meta"], arrays


def _packed(array: np.ndarray) -> tuple[np.ndarray, int | None]:
    """The array as stored: the narrowest of its values or of its differences (`base` its first value)."""
    if array.dtype.kind != "i" or array.size < 2:
        return array, None
    plain = _narrowest(array)
    deltas = np.diff(array)  # int64 arithmetic wraps, and so does the cumulative sum that undoes it
    delta = _narrowest(deltas)
    if delta.itemsize < plain.itemsize:
        return deltas.astype(delta), int(array[0])
    return array.astype(plain), None


def _narrowest(values: np.ndarray) -> np.dtype:
    low, high = (int(values.min()), int(values.max())) if values.size else (0, 0)
    return next(t for t in _NARROW if np.iinfo(t).min <= low and high <= np.iinfo(t).max)


def _unpacked(raw: np.ndarray, dtype: np.dtype, base: int | None) -> np.ndarray:
    if base is None:
        return raw.astype(dtype)  # a copy: the arrays outlive the body
    out = np.empty(raw.size + 1, dtype)
    out[0] = base
    np.cumsum(raw, dtype=dtype, out=out[1:])
    out[1:] += dtype.type(base)
    return out


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
