"""Checkpoints of a Delta table's log and the clean-up of expired log entries (the Delta protocol,
delta.md), as delta-rs's `create_checkpoint` and `cleanup_metadata` make them.

A checkpoint is one Parquet file of every live action at a version (protocol, metadata, app
transactions, files, and removals whose tombstones have not expired), named in `_last_checkpoint`;
its columns are delta-rs's, which Spark reads. Spark's own checkpoints (single or multi-part) are
read too. Log entries older than `delta.logRetentionDuration` below a checkpoint as old go, as
Spark and delta-rs remove them: until then the log keeps every version for time travel.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from engine.store.delta_actions import LogState, Removed, add_file, check_protocol, log_path, now_ms
from engine.store.objectstore import ObjectNotFoundError, ObjectStore

DEFAULT_LOG_RETENTION = "interval 30 days"
DEFAULT_TOMBSTONE_RETENTION = "interval 1 week"

_STRING_MAP = pa.map_(pa.string(), pa.string())
_FEATURES = pa.list_(pa.field("element", pa.string(), nullable=False))
_DELETION_VECTOR = pa.struct([
    pa.field("storageType", pa.string(), nullable=False), pa.field("pathOrInlineDv", pa.string(), nullable=False),
    pa.field("offset", pa.int32()), pa.field("sizeInBytes", pa.int32(), nullable=False),
    pa.field("cardinality", pa.int64(), nullable=False)])
SCHEMA = pa.schema([
    pa.field("add", pa.struct([
        pa.field("path", pa.string(), nullable=False), pa.field("partitionValues", _STRING_MAP, nullable=False),
        pa.field("size", pa.int64(), nullable=False), pa.field("modificationTime", pa.int64(), nullable=False),
        pa.field("dataChange", pa.bool_(), nullable=False), pa.field("stats", pa.string()),
        pa.field("tags", _STRING_MAP), pa.field("deletionVector", _DELETION_VECTOR),
        pa.field("baseRowId", pa.int64()), pa.field("defaultRowCommitVersion", pa.int64()),
        pa.field("clusteringProvider", pa.string())])),
    pa.field("remove", pa.struct([
        pa.field("path", pa.string(), nullable=False), pa.field("deletionTimestamp", pa.int64()),
        pa.field("dataChange", pa.bool_(), nullable=False), pa.field("extendedFileMetadata", pa.bool_()),
        pa.field("partitionValues", _STRING_MAP), pa.field("size", pa.int64()), pa.field("stats", pa.string()),
        pa.field("tags", _STRING_MAP), pa.field("deletionVector", _DELETION_VECTOR),
        pa.field("baseRowId", pa.int64()), pa.field("defaultRowCommitVersion", pa.int64())])),
    pa.field("metaData", pa.struct([
        pa.field("id", pa.string(), nullable=False), pa.field("name", pa.string()),
        pa.field("description", pa.string()),
        pa.field("format", pa.struct([pa.field("provider", pa.string(), nullable=False),
                                      pa.field("options", _STRING_MAP, nullable=False)]), nullable=False),
        pa.field("schemaString", pa.string(), nullable=False),
        pa.field("partitionColumns", _FEATURES, nullable=False), pa.field("createdTime", pa.int64()),
        pa.field("configuration", _STRING_MAP, nullable=False)])),
    pa.field("protocol", pa.struct([
        pa.field("minReaderVersion", pa.int32(), nullable=False),
        pa.field("minWriterVersion", pa.int32(), nullable=False),
        pa.field("readerFeatures", _FEATURES), pa.field("writerFeatures", _FEATURES)])),
    pa.field("txn", pa.struct([
        pa.field("appId", pa.string(), nullable=False), pa.field("version", pa.int64(), nullable=False),
        pa.field("lastUpdated", pa.int64())])),
])
_ACTIONS = ("add", "remove", "metaData", "protocol", "txn")
_LOG_NAME = re.compile(r"^(\d{20})\.(json|crc|checkpoint\.parquet|checkpoint\.\d{10}\.\d{10}\.parquet)$")
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(\w+?)s?\s*$", re.IGNORECASE)
_UNIT_MS = {"millisecond": 1, "second": 1000, "minute": 60_000, "hour": 3_600_000, "day": 86_400_000,
            "week": 604_800_000}


def last_checkpoint(objects: ObjectStore, log_key: str) -> dict[str, Any] | None:
    """The `_last_checkpoint` pointer (its version, and `parts` of a multi-part one), None without one."""
    try:
        return dict(orjson.loads(objects.get(f"{log_key}/_last_checkpoint").data))
    except ObjectNotFoundError:
        return None


def read(objects: ObjectStore, log_key: str, pointer: dict[str, Any]) -> LogState:
    """The state a checkpoint holds."""
    version = int(pointer["version"])
    parts = int(pointer.get("parts") or 0)
    names = ([f"{version:020d}.checkpoint.parquet"] if not parts else
             [f"{version:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)])
    state = LogState(version=version)
    for name in names:
        file = pq.ParquetFile(pa.BufferReader(objects.get(f"{log_key}/{name}").data))
        present = [c for c in _ACTIONS if c in file.schema_arrow.names]
        table = file.read(columns=present)
        for column in present:
            for action in table.column(column).drop_null().to_pylist():
                _take(state, column, action)
    return state


def _take(state: LogState, column: str, action: dict[str, Any]) -> None:
    if column == "add":
        add = add_file(action)
        state.files[add.path] = add
    elif column == "remove":
        state.removed[unquote(action["path"])] = Removed(_as_json(action), int(action.get("deletionTimestamp") or 0))
    elif column == "txn":
        state.txns[action["appId"]] = int(action["version"])
    elif column == "metaData":
        state.metadata = _as_json(action)
        state.metadata["schemaString"] = sys.intern(state.metadata["schemaString"])
    else:
        check_protocol(action, write=False)
        state.protocol = {k: v for k, v in action.items() if v is not None}


def _as_json(action: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint row as the log's JSON has it: maps as objects, no null fields."""
    out: dict[str, Any] = {}
    for key, value in action.items():
        if value is None:
            continue
        if isinstance(value, list) and value and isinstance(value[0], tuple):
            value = dict(value)
        elif isinstance(value, list) and key in ("partitionValues", "configuration", "options", "tags"):
            value = {}
        elif isinstance(value, dict):
            value = _as_json(value)
        out[key] = value
    return out


def write(objects: ObjectStore, log_key: str, state: LogState) -> set[str]:
    """Writes the checkpoint of `state` and points `_last_checkpoint` at it; returns the paths of the
    removed files it carries (their tombstones have not expired)."""
    now = now_ms()
    expired_before = now - interval_ms(state.configuration.get("delta.deletedFileRetentionDuration"),
                                       DEFAULT_TOMBSTONE_RETENTION)
    rows: list[dict[str, Any]] = [{"protocol": state.protocol}, {"metaData": _with_maps(state.metadata)}]
    rows += [{"txn": {"appId": app, "version": version, "lastUpdated": now}} for app, version in state.txns.items()]
    rows += [{"add": _with_maps(add.action()["add"])} for add in state.files.values()]
    kept = {path for path, gone in state.removed.items() if gone.deletion_timestamp >= expired_before}
    rows += [{"remove": _with_maps({**state.removed[path].action, "path": log_path(path)})} for path in kept]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), sink, compression="snappy")
    data = sink.getvalue()
    objects.put(f"{log_key}/{state.version:020d}.checkpoint.parquet", memoryview(data).cast("B"))
    pointer = {"version": state.version, "size": len(rows), "sizeInBytes": data.size,
               "numOfAddFiles": len(state.files)}
    objects.put(f"{log_key}/_last_checkpoint", orjson.dumps(pointer))
    return kept


def _with_maps(action: dict[str, Any]) -> dict[str, Any]:
    """An action's objects as the checkpoint's map columns take them (key-value pairs)."""
    out = dict(action)
    for key in ("partitionValues", "configuration", "tags"):
        if isinstance(out.get(key), dict):
            out[key] = list(out[key].items())
    if isinstance(out.get("format"), dict):
        out["format"] = {**out["format"], "options": list((out["format"].get("options") or {}).items())}
    return out


def clean_up(objects: ObjectStore, log_key: str, state: LogState) -> int:
    """Deletes log entries older than `delta.logRetentionDuration` below the newest checkpoint that
    old (the log then still starts at a checkpoint). Returns how many went."""
    retention = interval_ms(state.configuration.get("delta.logRetentionDuration"), DEFAULT_LOG_RETENTION)
    cutoff_ns = time.time_ns() - retention * 1_000_000
    entries = []
    for meta in objects.list(f"{log_key}/"):
        match = _LOG_NAME.match(meta.key.rpartition("/")[2])
        if match:
            entries.append((int(match.group(1)), match.group(2), meta))
    old_checkpoints = [v for v, kind, meta in entries
                       if kind.startswith("checkpoint") and meta.last_modified_ns <= cutoff_ns and v <= state.version]
    if not old_checkpoints:
        return 0
    floor = max(old_checkpoints)
    gone = 0
    for version, _, meta in entries:
        if version < floor and meta.last_modified_ns <= cutoff_ns:
            objects.delete(meta.key)
            gone += 1
    return gone


def interval_ms(text: str | None, default: str) -> int:
    """A Delta interval property (`interval 30 days`) in milliseconds; the default where it does not parse."""
    for candidate in (text, default):
        match = _INTERVAL.match(candidate or "")
        if match and match.group(2).lower() in _UNIT_MS:
            return int(match.group(1)) * _UNIT_MS[match.group(2).lower()]
    raise ValueError(f"not an interval: {default}")
