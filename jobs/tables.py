"""What the maintenance jobs share: the account's streams, their tombstones, the commit lease, table
properties, and the vacuum of replaced files.

- Streams come from the engine's config objects in the warehouse's object store
  (`layout.stream_configs_key`; one stream's is `layout.stream_config_key(name)`, hashed for long
  names) with the stream's config, creation time and `stream_id`; a stream's table is a
  `TableLocation` (`layout.stream_table_location(name)`): delta-rs reaches it by `uri` and
  `storage_options`, Spark by `spark_uri` (`s3a://…` on S3), the store by `key`, so one code path
  serves a local and an `s3://` warehouse. A job re-reads a stream's entry under the table's lease
  before it acts (`read_stream`), so a stream re-created meanwhile is recognised.
- Tombstones (`_system/tombstones`) are inclusive sequence ranges of logically deleted messages, keyed
  by `stream_id`. A range is safe to make physical once the stream's table holds every sequence up to
  its end: `DeltaTable(path).transaction_version(stream_id)` is the last sequence the flusher committed.
- Every commit a job makes to a table happens under that table's commit lease, the same lease object
  (engine/store/lease.py: conditional writes in the object store, no `flock`) the gateway's flusher
  (and stream create and delete) take; the lease is held for one command, never a whole job, so the
  flusher catches up between commands (publishes are acknowledged from the log meanwhile).
- Replaced data files are deleted once the vacuum window has passed since the commit that replaced
  them (delta-rs's vacuum, which deletes through the same object store on S3).
- Tables stay within what delta-rs and Spark both write: no deletion vectors, no clustering, no
  column mapping; column statistics on sequence and time columns only.

Reads of the small `_system` tables and of table metadata go through `deltalake` (no Spark job for a
few kilobytes); every rewrite of a table goes through Spark.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow.compute as pc
from delta.tables import DeltaTable as SparkDeltaTable
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql import DataFrame, SparkSession

import engine.store.failpoints as failpoints
from engine.store.layout import (
    ACK_TABLE_PROPERTIES,
    STREAM_TABLE_PROPERTIES,
    TOMBSTONE_TABLE_PROPERTIES,
    Layout,
    TableLocation,
)
from engine.store.lease import commit_lease
from engine.store.object_log import read_log_objects
from engine.store.objectstore import ObjectNotFoundError, ObjectStoreError
from engine.store.wal import SUFFIX as WAL_SUFFIX, Record, read_segment
from jobs.spark import SESSION_SETTINGS

log = logging.getLogger("jetlake.jobs")

# Properties every job relies on, beyond those the engine sets when it creates a table.
# Deletion vectors stay off explicitly, so a Spark DELETE rewrites files instead of writing vectors,
# whatever a session's defaults say (setting it to false keeps the protocol at reader 1 / writer 2).
JOB_TABLE_PROPERTIES = {"delta.enableDeletionVectors": "false"}

# A replaced data file stays on disk this long after the commit that replaced it (Delta's `remove`
# time), for readers of older snapshots: a Spark query planned before the rewrite, a gateway whose
# file list predates it (it refreshes its list and reads again when a file is gone). A table's own
# `delta.deletedFileRetentionDuration`, when longer, wins.
DEFAULT_VACUUM_WINDOW_HOURS = 1
VACUUM_WINDOW_ENV = "JETLAKE_VACUUM_WINDOW_HOURS"
_INTERVAL = re.compile(r"^\s*interval\s+(\d+)\s+(\w+?)s?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {
    "microsecond": 1e-6, "millisecond": 1e-3, "second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 604800,
}

_HEX_ID = re.compile(r"^[0-9a-fA-F]{1,64}$")


@dataclass(frozen=True)
class StreamEntry:
    """One stream of the account, as its config file describes it."""

    name: str
    stream_id: str
    config: dict[str, Any]
    path: TableLocation


@dataclass(frozen=True)
class Tombstone:
    stream_id: str
    first_seq: int
    last_seq: int
    reason: str
    erase: bool


@dataclass
class LeaseTimes:
    """How long a job waited for and held commit leases: the flusher waits while a job holds one."""

    waited: float = 0.0
    held: float = 0.0
    max_held: float = 0.0
    count: int = 0
    windows: list[tuple[float, float]] = field(default_factory=list)  # (start, end) in time.time()


def prepare_session(spark: SparkSession) -> None:
    """Sets what every job relies on on the session it is given (see jobs/spark.py)."""
    for key, value in SESSION_SETTINGS.items():
        spark.conf.set(key, value)


def reached(step: str) -> None:
    """A named step of a job (`retention.delete`, `erase.deleted`, ...), where a kill would cut its work
    in two: a failpoint of engine/store/failpoints.py, so a test can kill or fail the job exactly there."""
    failpoints.after(step, failpoints.hit(step))


def read_stream(layout: Layout, name: str) -> StreamEntry | None:
    """One stream's entry by its name, through the layout's key for it (long names are hashed);
    None when it has no config (deleted, or a memory stream)."""
    try:
        return _entry(layout.objects.get(layout.stream_config_key(name)).data, name, layout)
    except ObjectNotFoundError:
        return None


def list_streams(layout: Layout) -> list[StreamEntry]:
    """The account's file streams (memory streams keep no config and no table), by name."""
    out: list[StreamEntry] = []
    folder = layout.stream_configs_key
    for meta in list(layout.objects.list(folder)):
        relative = meta.key[len(folder) + 1:]
        if "/" in relative or not relative.endswith(".json"):
            continue
        try:
            out.append(_entry(layout.objects.get(meta.key).data, relative.removesuffix(".json"), layout))
        except (ObjectStoreError, ValueError, KeyError, TypeError) as exc:  # deleted or half-written meanwhile
            log.warning("skipping stream config %s: %s", meta.key, exc)
    return sorted(out, key=lambda entry: entry.name)


def _entry(data: bytes, fallback_name: str, layout: Layout) -> StreamEntry:
    record = json.loads(data)
    config = record["config"]
    if isinstance(config, str):
        config = json.loads(config)
    name = config.get("name") or fallback_name
    return StreamEntry(name, str(record["stream_id"]), config, layout.stream_table_location(name))


class StreamLogs:
    """A stream's write-ahead log wherever this process can see it: the local folder (`--wal local`, a
    gateway on this machine) and the objects under `_log/<stream>/` (`--wal object`, any machine),
    read with the engine's readers. A job on another machine than a `--wal local` gateway cannot see
    its log; it relies on the table's `transaction_version` and the gateway dropping flushed segments."""

    def __init__(self, layout: Layout, stream: str) -> None:
        self.folder = layout.wal_dir(stream)
        self.store = layout.objects
        self.prefix = layout.object_log_key(stream)
        self.segments_read = 0

    def records(self) -> list[Record]:
        """Every intact record. Raises ValueError for an object under the prefix that is not a log object."""
        groups = [records for _, records in read_log_objects(self.store, self.prefix)]
        for path in sorted(self.folder.glob(f"*{WAL_SUFFIX}")) if self.folder.is_dir() else []:
            try:
                groups.append(read_segment(path)[0])  # a torn tail is never acknowledged: left out
            except FileNotFoundError:
                continue  # flushed and dropped meanwhile
        self.segments_read = len(groups)
        return [record for group in groups for record in group]


def open_table(table: TableLocation) -> DeltaTable | None:
    try:
        return DeltaTable(table.uri, storage_options=table.storage_options)
    except TableNotFoundError:
        return None


def delta_table(table: TableLocation) -> DeltaTable:
    """The table's latest version; raises TableNotFoundError."""
    return DeltaTable(table.uri, storage_options=table.storage_options)


def flushed_seq(stream: StreamEntry) -> int:
    """The last sequence the gateway's flusher committed to the stream's table (0: none, or no table)."""
    dt = open_table(stream.path)
    return (dt.transaction_version(stream.stream_id) or 0) if dt is not None else 0


def read_tombstones(layout: Layout, stream_id: str | None = None) -> list[Tombstone]:
    """The tombstone rows of one stream (or all streams), from the tombstones table's latest version."""
    dt = open_table(layout.tombstones)
    if dt is None:
        return []
    table = dt.to_pyarrow_table(columns=["stream_id", "first_seq", "last_seq", "reason", "erase"])
    if stream_id is not None:
        table = table.filter(pc.equal(table.column("stream_id"), stream_id))
    return [
        Tombstone(r["stream_id"], r["first_seq"], r["last_seq"], r["reason"], bool(r["erase"]))
        for r in table.to_pylist()
    ]


def coalesce(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged inclusive ranges: overlapping and adjacent ones become one."""
    out: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if out and first <= out[-1][1] + 1:
            if last > out[-1][1]:
                out[-1] = (out[-1][0], last)
        else:
            out.append((first, last))
    return out


def seq_predicate(ranges: list[tuple[int, int]], column: str = "seq") -> str:
    """`seq BETWEEN a AND b OR …`: a predicate on sequence numbers only (Delta logs it in commitInfo)."""
    parts = [f"{column} = {int(a)}" if a == b else f"{column} BETWEEN {int(a)} AND {int(b)}" for a, b in ranges]
    return " OR ".join(parts)


def check_hex_id(value: str) -> str:
    if not _HEX_ID.match(value):
        raise ValueError(f"not a hex stream id: {value!r}")
    return value


def ranges_frame(spark: SparkSession, rows: list[tuple[Any, ...]], names: list[str]) -> DataFrame:
    """A small DataFrame of ranges (or keys) to MERGE against: built in the driver, no Python worker."""
    ddl = ", ".join(f"{name} {'STRING' if name == 'stream_id' else 'BIGINT'}" for name in names)
    return spark.createDataFrame(rows, ddl)


@contextmanager
def leased(layout: Layout, table: TableLocation, times: LeaseTimes | None = None) -> Iterator[None]:
    """Holds the table's commit lease (the gateway's flusher waits meanwhile) for one command."""
    asked = time.monotonic()
    with commit_lease(layout.lease_file(table)):
        got = time.monotonic()
        wall = time.time()
        try:
            yield
        finally:
            held = time.monotonic() - got
            if times is not None:
                times.waited += got - asked
                times.held += held
                times.max_held = max(times.max_held, held)
                times.count += 1
                times.windows.append((wall, wall + held))


def table_properties_for(layout: Layout, path: TableLocation) -> dict[str, str]:
    """The properties a table of this warehouse should carry, by the kind of table at `path`."""
    if path.key == layout.tombstones.key:
        base = TOMBSTONE_TABLE_PROPERTIES
    elif path.key == layout.acks.key:
        base = ACK_TABLE_PROPERTIES
    else:
        base = STREAM_TABLE_PROPERTIES
    return {**base, **JOB_TABLE_PROPERTIES}


def ensure_table_properties(
    spark: SparkSession, layout: Layout, path: TableLocation, extra: dict[str, str] | None = None,
    times: LeaseTimes | None = None,
) -> int:
    """Sets the properties the jobs rely on where they differ; returns how many were set (0: no commit)."""
    dt = open_table(path)
    if dt is None:
        return 0
    wanted = {**table_properties_for(layout, path), **(extra or {})}
    current = dt.metadata().configuration
    missing = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not missing:
        return 0
    assignments = ", ".join(f"'{k}' = '{v}'" for k, v in sorted(missing.items()))
    with leased(layout, path, times):
        spark.sql(f"ALTER TABLE {spark_table(path)} SET TBLPROPERTIES ({assignments})").collect()
    log.info("table %s: set %s", path.name, assignments)
    return len(missing)


def spark_table(table: TableLocation) -> str:
    """The table in Spark SQL: ``delta.`<spark uri>` `` (`s3a://…` on S3)."""
    return "delta.`" + table.spark_uri.replace("`", "``") + "`"


def table_version(path: TableLocation) -> int:
    dt = open_table(path)
    return dt.version() if dt is not None else -1


def last_commit(path: TableLocation, since_version: int) -> dict[str, Any] | None:
    """commitInfo of the table's latest commit if it is newer than `since_version` (read under the lease)."""
    dt = delta_table(path)
    if dt.version() <= since_version:
        return None
    history = dt.history(1)
    return history[0] if history else None


def metric(commit: dict[str, Any] | None, *names: str) -> int:
    """The first of `names` present in a commit's operationMetrics, as an int (0 when absent)."""
    if not commit:
        return 0
    metrics = commit.get("operationMetrics") or {}
    for name in names:
        if name in metrics:
            try:
                return int(metrics[name])
            except (TypeError, ValueError):
                return 0
    return 0


def system_tables(layout: Layout) -> list[TableLocation]:
    return [layout.tombstones, layout.acks]


def remove_tombstones(
    spark: SparkSession,
    layout: Layout,
    applied: list[tuple[str, int, int]],
    orphans: list[str],
    include_erase: bool,
    merge_threshold: int,
    times: LeaseTimes,
) -> int:
    """Deletes the tombstone rows lying inside applied ranges `(stream_id, first, last)` (rows flagged
    `erase` only with `include_erase`), and every row of the `orphans` stream ids; returns how many.

    A row inside an applied range only names sequences whose rows the caller's committed rewrite
    removed, so it may go even if it arrived after the ranges were read; a row outside them stays.
    """
    path = layout.tombstones
    if open_table(path) is None or not (applied or orphans):
        return 0
    ensure_table_properties(spark, layout, path, times=times)
    with leased(layout, path, times):  # one commit for the applied ranges and the deleted streams
        version = table_version(path)
        if len(applied) + len(orphans) <= merge_threshold:
            parts = [
                f"(stream_id = '{check_hex_id(sid)}' AND first_seq >= {int(a)} AND last_seq <= {int(b)}"
                + ("" if include_erase else " AND NOT erase") + ")"
                for sid, a, b in applied
            ]
            if orphans:
                parts.append(f"stream_id IN ({', '.join(repr(check_hex_id(sid)) for sid in orphans)})")
            spark.sql(f"DELETE FROM {spark_table(path)} WHERE {' OR '.join(parts)}").collect()
        else:
            keys = [(check_hex_id(s), a, b, 0) for s, a, b in applied]
            keys += [(check_hex_id(s), 0, 2**62, 1) for s in orphans]
            source = ranges_frame(spark, keys, ["stream_id", "first_seq", "last_seq", "whole_stream"])
            condition = (
                "t.stream_id = r.stream_id AND t.first_seq >= r.first_seq AND t.last_seq <= r.last_seq"
                + ("" if include_erase else " AND (r.whole_stream = 1 OR NOT t.erase)")
            )
            target = SparkDeltaTable.forPath(spark, path.spark_uri).alias("t")
            target.merge(source.alias("r"), condition).whenMatchedDelete().execute()
        return metric(last_commit(path, version), "numDeletedRows", "numTargetRowsDeleted")


def file_key(table: TableLocation, name: str) -> str:
    """The object key of a file delta-rs names (relative to the table and URL-quoted, or a full URI)."""
    if "://" in name or name.startswith("/"):
        name = name.split("://", 1)[-1]
        marker = table.key + "/"
        name = name[name.index(marker) + len(marker):] if marker in name else name.rsplit("/", 1)[-1]
    return f"{table.key}/{unquote(name)}"


def vacuum_window_hours(option: int | None = None, environ: dict[str, str] | None = None) -> int:
    """The vacuum window: the option, else `JETLAKE_VACUUM_WINDOW_HOURS`, else DEFAULT_VACUUM_WINDOW_HOURS."""
    if option is not None:
        if option < 0:
            raise ValueError(f"the vacuum window must be >= 0 hours, not {option}")
        return int(option)
    text = (os.environ if environ is None else environ).get(VACUUM_WINDOW_ENV, "").strip()
    if not text:
        return DEFAULT_VACUUM_WINDOW_HOURS
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{VACUUM_WINDOW_ENV}={text!r} is not a whole number of hours") from None
    if value < 0:
        raise ValueError(f"{VACUUM_WINDOW_ENV} must be >= 0, not {value}")
    return value


def interval_hours(value: str | None) -> int:
    """Delta's `interval <n> <unit>` property value in whole hours, rounded up (0 if absent or unreadable)."""
    match = _INTERVAL.match(value or "")
    if not match or match.group(2).lower() not in _UNIT_SECONDS:
        return 0
    return math.ceil(int(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()] / 3600)


def vacuum_replaced(
    layout: Layout, path: TableLocation, window_hours: int, times: LeaseTimes | None = None
) -> tuple[int, int]:
    """Deletes the data files the table stopped naming more than the window ago (by the time of the
    commit that removed them, not the file's age), and files no commit names that are older than the
    window (a Spark rewrite leaves the empty file of a file whose rows all went), under the table's
    lease (no commit is writing files meanwhile): delta-rs's full vacuum, which commits its start and
    end. Returns (files, bytes) deleted; takes no lease and commits nothing when nothing is due."""
    dt = open_table(path)
    if dt is None:
        return 0, 0
    hours = max(window_hours, interval_hours(dt.metadata().configuration.get("delta.deletedFileRetentionDuration")))
    if not dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=True):
        return 0, 0  # nothing due: no lease taken, the flusher is not held up
    with leased(layout, path, times):
        dt = delta_table(path)
        due = dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=True)
        size = 0
        for name in due:
            try:
                size += layout.objects.head(file_key(path, name)).size
            except ObjectNotFoundError:
                pass
        if due:
            dt.vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=False, full=True)
    log.info("vacuum %s: %d replaced files (%d bytes) older than %dh deleted", path.name, len(due), size, hours)
    return len(due), size
