"""The actions of a Delta table's log and the state they add up to (the Delta protocol, delta.md):
what delta_log.py replays and commits, and delta_checkpoint.py reads and writes.

Tables whose protocol asks for a feature read or written differently (deletion vectors, column
mapping, ...) are refused (DeltaProtocolError) rather than misread: JetLake's tables never enable one.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import quote, unquote

import numpy as np
import orjson


class DeltaProtocolError(Exception):
    """The table's protocol asks for a feature this module does not implement."""


@dataclass(slots=True)
class AddFile:
    """A data file of the table (an `add` action). `path` is relative to the table and unquoted."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    modification_time: int
    data_change: bool = True
    stats: str | None = None
    parsed: dict[str, Any] | None = field(default=None, repr=False, compare=False)  # `stats`, read once

    def action(self) -> dict[str, Any]:
        return {"add": {"path": log_path(self.path), "partitionValues": self.partition_values, "size": self.size,
                        "modificationTime": self.modification_time, "dataChange": self.data_change,
                        "stats": self.stats}}

    def remove_action(self, now_ms: int) -> dict[str, Any]:
        return {"remove": {"path": log_path(self.path), "deletionTimestamp": now_ms, "dataChange": True,
                           "extendedFileMetadata": True, "partitionValues": self.partition_values,
                           "size": self.size}}

    def bounds(self, column: str) -> tuple[int | None, int | None]:
        """The file's min and max statistics of an integer or timestamp column (timestamps in
        microseconds), None where the log has none."""
        if not self.stats:
            return None, None
        if self.parsed is None:
            self.parsed = orjson.loads(self.stats)
        stats = self.parsed
        return (stat_value((stats.get("minValues") or {}).get(column)),
                stat_value((stats.get("maxValues") or {}).get(column)))


@dataclass(slots=True)
class Txn:
    """An app transaction (`txn` action): the exactly-once marker of a writer (commits.py)."""

    app_id: str
    version: int

    def action(self, now_ms: int) -> dict[str, Any]:
        return {"txn": {"appId": self.app_id, "version": self.version, "lastUpdated": now_ms}}


@dataclass(slots=True)
class Removed:
    """A file a commit removed, kept until its tombstone expires (checkpoints carry it until then)."""

    action: dict[str, Any]
    deletion_timestamp: int


@dataclass(slots=True)
class LogState:
    """The table at one version. A new commit makes a new `files` dict: a reader holding one state
    never sees it change."""

    version: int = -1
    protocol: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)
    files: dict[str, AddFile] = field(default_factory=dict)
    removed: dict[str, Removed] = field(default_factory=dict)

    @property
    def partition_columns(self) -> list[str]:
        return list(self.metadata.get("partitionColumns") or [])

    @property
    def configuration(self) -> dict[str, str]:
        return dict(self.metadata.get("configuration") or {})

    def copy(self) -> LogState:
        """A state whose dicts are its own (the next version's, before its actions apply)."""
        return LogState(self.version, self.protocol, self.metadata, dict(self.txns), dict(self.files),
                        dict(self.removed))

    def transaction_version(self, app_id: str) -> int:
        return self.txns.get(app_id, 0)

    def stats_columns(self) -> list[str]:
        names = self.configuration.get("delta.dataSkippingStatsColumns", "")
        return [name.strip() for name in names.split(",") if name.strip()]

    def checkpoint_interval(self) -> int:
        return int(self.configuration.get("delta.checkpointInterval", "100"))


def applied(state: LogState, version: int, actions: list[dict[str, Any]]) -> LogState:
    new = state.copy()
    apply(new, version, actions)
    return new


def apply(state: LogState, version: int, actions: list[dict[str, Any]]) -> None:
    """One commit's actions applied to `state` (its dicts owned by the caller)."""
    for action in actions:
        if (add := action.get("add")) is not None:
            path = unquote(add["path"])
            state.files[path] = add_file(add)
            state.removed.pop(path, None)
        elif (remove := action.get("remove")) is not None:
            path = unquote(remove["path"])
            state.files.pop(path, None)
            state.removed[path] = Removed(remove, int(remove.get("deletionTimestamp") or 0))
        elif (txn := action.get("txn")) is not None:
            state.txns[txn["appId"]] = int(txn["version"])
        elif (metadata := action.get("metaData")) is not None:
            metadata["schemaString"] = sys.intern(metadata["schemaString"])  # thousands of streams share a few
            state.metadata = metadata
        elif (protocol := action.get("protocol")) is not None:
            check_protocol(protocol, write=False)
            state.protocol = protocol
    state.version = version


def add_file(add: dict[str, Any]) -> AddFile:
    """An `add` action of a commit or a checkpoint as an AddFile; one with a deletion vector is refused."""
    if add.get("deletionVector"):
        raise DeltaProtocolError(f"{add['path']} has a deletion vector")
    values = add.get("partitionValues") or {}
    if isinstance(values, list):  # a checkpoint's map column reads as key-value pairs
        values = dict(values)
    return AddFile(unquote(add["path"]), int(add["size"]), values, int(add.get("modificationTime") or 0),
                   bool(add.get("dataChange", True)), add.get("stats"))


_READ_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck"})
_WRITE_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck", "appendOnly"})


def check_protocol(protocol: dict[str, Any], write: bool) -> None:
    readers = set(protocol.get("readerFeatures") or [])
    writers = set(protocol.get("writerFeatures") or [])
    if int(protocol.get("minReaderVersion", 1)) > 3 or not readers <= _READ_FEATURES:
        raise DeltaProtocolError(f"reader protocol {protocol} is not supported")
    if write and (int(protocol.get("minWriterVersion", 2)) not in (1, 2, 7) or not writers <= _WRITE_FEATURES):
        raise DeltaProtocolError(f"writer protocol {protocol} is not supported")


def bounds(files: list[AddFile], column: str, missing_low: int, missing_high: int) -> tuple[np.ndarray, np.ndarray]:
    """Each file's min and max statistic of `column` as int64 arrays (a file without one gets the
    `missing_*` value: never pruned)."""
    lows = np.full(len(files), missing_low, np.int64)
    highs = np.full(len(files), missing_high, np.int64)
    for i, add in enumerate(files):
        low, high = add.bounds(column)
        if low is not None:
            lows[i] = low
        if high is not None:
            highs[i] = high
    return lows, highs


def stat_value(value: Any) -> int | None:
    """An integer statistic, or a timestamp's (`2026-11-27T15:16:31.123Z`, any ISO offset) in microseconds."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        moment = datetime.fromisoformat(value)
        return int(moment.timestamp()) * 1_000_000 + moment.microsecond
    return None


def log_path(relative: str) -> str:
    """A data file's path as the log holds it: percent-encoded (a `%` of a Hive folder becomes `%25`),
    as delta-rs and Spark write it."""
    return quote(relative, safe="/=")


def now_ms() -> int:
    return time.time_ns() // 1_000_000
