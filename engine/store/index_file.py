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
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xxhash


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


def write(path: Path, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> int:
    """Replaces the snapshot at `path` whole (a rename; not fsynced: a snapshot lost or torn by a power
    failure fails its checksum and the index is rebuilt); returns its size."""
    data = encode(meta, arrays)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return len(data)


def read(path: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The snapshot at `path`, or None (missing or damaged: the caller rebuilds, and says so)."""
    try:
        return decode(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, orjson.JSONDecodeError) as exc:
        log.warning("index snapshot %s unusable (%s): rebuilding the index from the table", path, exc)
        return None
