"""Compaction: fewer, larger files per partition; a checkpoint; expired log entries removed.

The gateway's flusher commits a stream about once a second, each commit adding one small file per
subject partition it touched, and a table's read and commit costs grow with its live file count. For
each stream table and the `_system` tables (tombstones, acks) this job, under the table's commit lease:
1. bin-packs each partition's files smaller than `target_file_bytes` into files of about that size
   (files already that large are left alone), sorted by `seq` within each file written: a stream
   table's row groups (at most 1,024 rows) then hold increasing, disjoint ranges of sequences, so a
   read by sequence or time decodes one group, found by the groups' statistics. Delta's `OPTIMIZE`
   concatenates a bin's files largest first and cannot sort; this is its bin job on Delta's own
   transaction API (one `OPTIMIZE` commit, `dataChange` false, as `OPTIMIZE` writes it). Tables
   without a `seq` column (the `_system` ones) get Delta's `OPTIMIZE`. Either runs only when some
   partition holds two or more files smaller than the target, so a rerun commits nothing;
2. writes a checkpoint at the table's latest version when it has none there, and removes log entries
   older than the table's `delta.logRetentionDuration` (Delta's expired-log cleanup; `log_retention`
   sets that property, e.g. "interval 7 days").
3. vacuums the data files replaced more than the vacuum window ago (`vacuum_window` hours, default 1;
   a table's longer `delta.deletedFileRetentionDuration` wins): readers of older snapshots keep
   their files that long, and the storage OPTIMIZE and the gateway's ack-table deletes replaced is freed.
Given the account's keyring (`jetlake jobs run compact --config FILE`), it first re-encrypts the
values of encrypted streams sealed under older key epochs and destroys those keys (jobs/rekey.py).
A table that fails is counted and named in the figures (`failed_tables`); the others go on.
Idempotent and safe to kill: OPTIMIZE is one commit, a checkpoint is rewritten whole.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from engine.keys import Keyring
from engine.store.layout import PARTITION_COLUMN, Layout, TableLocation
from engine.store.objectstore import ObjectStoreError
from jobs.rekey import rekey
from jobs.tables import (
    LeaseTimes,
    ensure_table_properties,
    leased,
    list_streams,
    log,
    open_table,
    prepare_session,
    reached,
    spark_table,
    system_tables,
    vacuum_replaced,
    vacuum_window_hours,
)

DEFAULT_TARGET_FILE_BYTES = 128 * 1024 * 1024
SORT_COLUMN = "seq"  # a stream table's: the order reads by sequence and by time find row groups in


def run(
    spark: SparkSession,
    layout: Layout,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
    include_system: bool = True,
    log_retention: str | None = None,
    lease_times: LeaseTimes | None = None,
    vacuum_window: int | None = None,
    keyring: Keyring | None = None,
) -> dict[str, Any]:
    """Compacts every table of the account; returns the figures it logged."""
    started = time.monotonic()
    prepare_session(spark)
    window = vacuum_window_hours(vacuum_window)
    spark.conf.set("spark.databricks.delta.optimize.maxFileSize", str(int(target_file_bytes)))
    spark.conf.set("spark.databricks.delta.optimize.minFileSize", str(int(target_file_bytes)))
    times = lease_times if lease_times is not None else LeaseTimes()
    tables: list[tuple[str, TableLocation]] = [(s.name, s.path) for s in list_streams(layout)]
    if include_system:
        tables += [(f"_system/{p.name}", p) for p in system_tables(layout)]
    figures: dict[str, Any] = {
        "tables": len(tables),
        "tables_compacted": 0,
        "files_before": 0,
        "files_after": 0,
        "files_removed": 0,
        "files_added": 0,
        "partitions_optimized": 0,
        "checkpoints": 0,
        "log_entries_removed": 0,
        "files_vacuumed": 0,
        "bytes_vacuumed": 0,
        "vacuum_window_hours": window,
        "errors": 0,
        "failed_tables": {},
    }
    if keyring is not None:
        figures.update(rekey(spark, layout, keyring, times))
    extra = {"delta.logRetentionDuration": log_retention} if log_retention else None
    log.info("compact: %d tables, target file size %d bytes", len(tables), target_file_bytes)
    for i, (name, path) in enumerate(tables, 1):
        try:
            _compact_table(spark, layout, name, path, target_file_bytes, extra, times, figures, f"[{i}/{len(tables)}]")
            files, size = vacuum_replaced(layout, path, window, times)
            figures["files_vacuumed"] += files
            figures["bytes_vacuumed"] += size
        except Exception as exc:
            figures["errors"] += 1
            figures["failed_tables"][name] = f"{type(exc).__name__}: {exc}"[:500]
            log.exception("compact [%d/%d] %s failed", i, len(tables), name)
    figures["lease_seconds_held"] = round(times.held, 3)
    figures["lease_seconds_max"] = round(times.max_held, 3)
    figures["seconds"] = round(time.monotonic() - started, 3)
    log.info(
        "compact done: %d of %d tables compacted, files %d -> %d (%d rewritten into %d), %d checkpoints, "
        "%d log entries removed, %d files (%d bytes) vacuumed, %d errors, lease held %.2fs (longest %.2fs), %.2fs",
        figures["tables_compacted"], figures["tables"], figures["files_before"], figures["files_after"],
        figures["files_removed"], figures["files_added"], figures["checkpoints"], figures["log_entries_removed"],
        figures["files_vacuumed"], figures["bytes_vacuumed"], figures["errors"], times.held, times.max_held,
        figures["seconds"],
    )
    return figures


def _compact_table(
    spark: SparkSession,
    layout: Layout,
    name: str,
    path: TableLocation,
    target: int,
    extra: dict[str, str] | None,
    times: LeaseTimes,
    figures: dict[str, Any],
    progress: str,
) -> None:
    started = time.monotonic()
    dt = open_table(path)
    if dt is None:
        log.info("compact %s %s: no table", progress, name)
        return
    before = len(dt.file_uris())
    figures["files_before"] += before
    removed = added = partitions = 0
    small = _has_small_files(dt, target)
    if small or extra:
        ensure_table_properties(spark, layout, path, extra, times)
    if small:
        reached("compact.optimize")
        with leased(layout, path, times):
            if SORT_COLUMN in [f.name for f in dt.schema().fields]:
                removed, added, partitions = _optimize_sorted(spark, path, target)
            else:
                m = spark.sql(f"OPTIMIZE {spark_table(path)}").collect()[0].metrics
                removed, added, partitions = int(m.numFilesRemoved), int(m.numFilesAdded), int(m.partitionsOptimized)
        reached("compact.optimized")
        if removed:
            figures["tables_compacted"] += 1
    log_before = _log_entries(layout, path)
    checkpointed = False
    if _checkpoint_version(layout, path) < (open_table(path) or dt).version():
        with leased(layout, path, times):
            _checkpoint_and_clean(spark, path)
        checkpointed = True
        figures["checkpoints"] += 1
    cleaned = max(0, log_before - _log_entries(layout, path))
    after_dt = open_table(path)
    after = len(after_dt.file_uris()) if after_dt is not None else 0
    figures["files_after"] += after
    figures["files_removed"] += removed
    figures["files_added"] += added
    figures["partitions_optimized"] += partitions
    figures["log_entries_removed"] += cleaned
    log.info(
        "compact %s %s: files %d -> %d (%d rewritten into %d, %d partitions), checkpoint %s, "
        "%d log entries removed, %.2fs",
        progress, name, before, after, removed, added, partitions, "written" if checkpointed else "current",
        cleaned, time.monotonic() - started,
    )


def _optimize_sorted(spark: SparkSession, path: TableLocation, target: int) -> tuple[int, int, int]:
    """Delta's OPTIMIZE bin job with each written file sorted by `seq`; returns (files removed, files
    added, partitions optimized). One transaction, under the caller's lease: the files it reads are
    those of the snapshot it commits on."""
    jvm = spark._jvm  # noqa: SLF001 - Delta's Python API has no bin job to give a sort
    delta = jvm.org.apache.spark.sql.delta
    delta_log = delta.DeltaLog.forTable(spark._jsparkSession, path.spark_uri)  # noqa: SLF001
    txn = delta_log.startTransaction()
    files = {json.loads(f.json())["add"]["path"]: f for f in _java_list(jvm, txn.filterFiles())}
    bins = _bins(open_table(path), target, files.keys())
    adds: list[Any] = []
    removes: list[Any] = []
    now_ms = int(time.time() * 1000)
    for paths in bins:
        chosen = [files[p] for p in paths]
        frame = delta_log.createDataFrame(txn.snapshot(), _scala_seq(jvm, chosen), False, jvm.scala.Some("Optimize"))
        ordered = DataFrame(frame, spark).coalesce(1).sortWithinPartitions(SORT_COLUMN)
        written = txn.writeFiles(ordered._jdf, jvm.scala.Option.empty(), True, _scala_seq(jvm, []))  # noqa: SLF001
        for action in _java_list(jvm, written):
            add = json.loads(action.json())
            add["add"]["dataChange"] = False  # a rearrangement, as OPTIMIZE commits it
            adds.append(delta.actions.Action.fromJson(json.dumps(add)))
        removes += [f.removeWithTimestamp(now_ms, False) for f in chosen]
    if not bins:
        return 0, 0, 0
    operation = getattr(delta, "DeltaOperations$Optimize")(
        _scala_seq(jvm, []), _scala_seq(jvm, []), False, jvm.scala.Option.empty(), False)
    txn.commit(_scala_seq(jvm, adds + removes), operation)
    return len(removes), len(adds), len({_partition_of(p, files) for paths in bins for p in paths})


def _bins(dt, target: int, paths: Any) -> list[list[str]]:  # noqa: ANN001
    """Per partition, its files smaller than `target` in `seq` order, cut into bins of up to `target`
    bytes (Delta's bin-packing, in sequence order so that each file written holds a range of the
    partition's sequences); bins of one file are left as they are."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    names = actions.schema.names
    column = f"partition.{PARTITION_COLUMN}"
    rows = zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(),
               actions.column(column).to_pylist() if column in names else [None] * actions.num_rows,
               actions.column("min.seq").to_pylist() if "min.seq" in names else [0] * actions.num_rows, strict=True)
    known = set(paths)
    partitions: dict[Any, list[tuple[int, int, str]]] = {}
    for path, size, partition, low in rows:
        if path in known and size < target:
            partitions.setdefault(partition, []).append((low if low is not None else 0, size, path))
    bins: list[list[str]] = []
    for files in partitions.values():
        current: list[str] = []
        current_size = 0
        for _, size, path in sorted(files):
            if current and current_size + size > target:
                bins.append(current)
                current, current_size = [], 0
            current.append(path)
            current_size += size
        bins.append(current)
    return [b for b in bins if len(b) > 1]


def _partition_of(path: str, files: dict[str, Any]) -> str:
    return json.dumps(json.loads(files[path].json())["add"]["partitionValues"], sort_keys=True)


def _java_list(jvm: Any, seq: Any) -> list[Any]:
    return list(jvm.scala.jdk.javaapi.CollectionConverters.asJava(seq))


def _scala_seq(jvm: Any, items: list[Any]) -> Any:
    values = jvm.java.util.ArrayList()
    for item in items:
        values.add(item)
    return jvm.scala.jdk.javaapi.CollectionConverters.asScala(values).toList()


def _has_small_files(dt, target: int) -> bool:  # noqa: ANN001
    """True when some partition holds two or more files below the target size (something to bin-pack)."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    names = actions.schema.names
    sizes = actions.column("size_bytes").to_pylist()
    column = f"partition.{PARTITION_COLUMN}"
    partitions = actions.column(column).to_pylist() if column in names else [None] * len(sizes)
    small = Counter(p for p, size in zip(partitions, sizes, strict=True) if size < target)
    return any(n >= 2 for n in small.values())


def _log_entries(layout: Layout, table: TableLocation) -> int:
    """The table's commit files (`_delta_log/<version>.json`), counted through the object store."""
    folder = f"{table.key}/_delta_log"
    return sum(1 for meta in layout.objects.list(folder)
               if meta.key.endswith(".json") and "/" not in meta.key[len(folder) + 1:])


def _checkpoint_version(layout: Layout, table: TableLocation) -> int:
    try:
        return int(json.loads(layout.objects.get(f"{table.key}/_delta_log/_last_checkpoint").data)["version"])
    except (ObjectStoreError, ValueError, KeyError):
        return -1


def _checkpoint_and_clean(spark: SparkSession, path: TableLocation) -> None:
    """A checkpoint at the latest version, then Delta's cleanup of log entries past their retention."""
    jvm = spark._jvm  # noqa: SLF001 - Delta has no Python API for checkpoints
    none = jvm.scala.Option.apply(None)
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path.spark_uri)  # noqa: SLF001
    snapshot = delta_log.update(False, none, none)
    delta_log.checkpointAndCleanUpDeltaLog(snapshot, none)
