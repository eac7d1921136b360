"""Retention: makes tombstones physical, by rewriting the files that still hold tombstoned messages.

Deletes, purges, discard-old limits, `max_age` expiry, interest and work-queue removals all reach the
tombstones table as inclusive sequence ranges (the engine already hides them from every read). For
each stream, under the table's commit lease, this job re-reads the stream's config (by the layout's
file name for it) and checks that the stream is still the one it listed (same `stream_id`: a stream
deleted and re-created under the same name meanwhile is left alone), reads the stream's tombstones
and the last sequence flushed to its table (`transaction_version(stream_id)`; a range above it may
cover messages still in the gateway's log), and deletes the ready sequences with one Spark command —
a DELETE with a `seq BETWEEN a AND b OR …` predicate, or for many ranges a MERGE against a DataFrame
of ranges, keyed by sequence only, so no subject or payload value reaches the commit log. Only after
that commit are the applied tombstone rows removed, under the tombstones table's lease. Tombstone
rows of streams that no longer exist are dropped too. One failing stream is counted and named in
the figures (`failed_streams`); the others go on.

Then the storage is freed: every stream table and the tombstones table are vacuumed of the data
files replaced more than the vacuum window ago (`vacuum_window_hours`, default 1; a table's longer
`delta.deletedFileRetentionDuration` wins), so `max_age`, `max_bytes` and the rest free disk space.

Safe to kill at any point: a DELETE always commits before its tombstones go, so a rerun re-applies a
range whose rows are already gone (no rows match: Spark makes no commit) and then removes the
tombstones. Idempotent: a rerun after a complete run finds nothing to do.

Tombstones flagged `erase` (GDPR) are left to the erase job by default, which must also remove every
older copy; `include_erase=True` makes their rows physical here too, but keeps their tombstones.
"""

from __future__ import annotations

import time
from typing import Any

from delta.tables import DeltaTable as SparkDeltaTable
from pyspark.sql import SparkSession

from engine.store.layout import Layout, TableLocation
from jobs.tables import (
    LeaseTimes,
    StreamEntry,
    Tombstone,
    coalesce,
    ensure_table_properties,
    flushed_seq,
    last_commit,
    leased,
    list_streams,
    log,
    metric,
    open_table,
    prepare_session,
    ranges_frame,
    reached,
    read_stream,
    read_tombstones,
    remove_tombstones,
    seq_predicate,
    spark_table,
    table_version,
    vacuum_replaced,
    vacuum_window_hours,
)

DEFAULT_MERGE_THRESHOLD = 64  # more ranges than this: MERGE against a DataFrame instead of one long predicate
TOMBSTONE_BATCH = 512  # applied ranges whose tombstones are removed together, in one commit


def run(
    spark: SparkSession,
    layout: Layout,
    merge_threshold: int = DEFAULT_MERGE_THRESHOLD,
    include_erase: bool = False,
    lease_times: LeaseTimes | None = None,
    vacuum_window: int | None = None,
) -> dict[str, Any]:
    """Applies every applicable tombstone of the account's streams, then vacuums what is past the
    window (`vacuum_window` hours; default from JETLAKE_VACUUM_WINDOW_HOURS, else 1); returns the
    figures it logged."""
    started = time.monotonic()
    prepare_session(spark)
    window = vacuum_window_hours(vacuum_window)
    times = lease_times if lease_times is not None else LeaseTimes()
    figures: dict[str, Any] = {
        "streams": 0,
        "streams_rewritten": 0,
        "tombstone_ranges_applied": 0,
        "rows_deleted": 0,
        "files_rewritten": 0,
        "files_added": 0,
        "tombstones_removed": 0,
        "orphan_tombstones_removed": 0,
        "ranges_waiting_for_flush": 0,
        "erase_ranges_left": 0,
        "streams_changed": 0,
        "files_vacuumed": 0,
        "bytes_vacuumed": 0,
        "vacuum_window_hours": window,
        "errors": 0,
        "failed_streams": {},
    }
    # Tombstones first, then the configs: a stream id seen in the tombstones had a config when they
    # were written, so one missing from the configs read after belongs to a deleted stream. Each
    # stream's own tombstones are read again under its table's lease, where they are applied.
    tombstones = read_tombstones(layout)
    streams = list_streams(layout)
    figures["streams"] = len(streams)
    with_tombstones = {t.stream_id for t in tombstones}
    log.info("retention: %d streams, %d tombstone rows, vacuum window %dh", len(streams), len(tombstones), window)

    applied: list[tuple[str, int, int]] = []  # (stream_id, first, last): rows gone, tombstones still there
    for i, stream in enumerate(streams, 1):
        try:
            if stream.stream_id in with_tombstones:
                ranges = _apply(spark, layout, stream, include_erase, merge_threshold, times, figures)
                applied.extend((stream.stream_id, a, b) for a, b in ranges)
            else:
                log.info("retention [%d/%d] %s: nothing to apply", i, len(streams), stream.name)
            _vacuum(layout, stream.path, window, times, figures)
        except Exception as exc:
            figures["errors"] += 1
            figures["failed_streams"][stream.name] = f"{type(exc).__name__}: {exc}"[:500]
            log.exception("retention [%d/%d] %s failed; its tombstones stay for the next run", i, len(streams), stream.name)
        if len(applied) >= TOMBSTONE_BATCH:
            _remove_tombstones(spark, layout, applied, [], 0, include_erase, merge_threshold, times, figures)
            applied = []

    live_ids = {s.stream_id for s in streams}
    orphans = sorted({t.stream_id for t in tombstones} - live_ids)
    if applied or orphans:
        _remove_tombstones(
            spark, layout, applied, orphans, sum(1 for t in tombstones if t.stream_id in set(orphans)), include_erase, merge_threshold, times, figures)
    _vacuum(layout, layout.tombstones, window, times, figures)

    figures["lease_seconds_held"] = round(times.held, 3)
    figures["lease_seconds_max"] = round(times.max_held, 3)
    figures["seconds"] = round(time.monotonic() - started, 3)
    log.info(
        "retention done: %d ranges applied on %d of %d streams, %d rows deleted, %d files rewritten, "
        "%d tombstones removed (%d of deleted streams), %d ranges wait for a flush, %d erase ranges left, "
        "%d streams changed meanwhile, %d files (%d bytes) vacuumed, %d errors, "
        "lease held %.2fs (longest %.2fs), %.2fs",
        figures["tombstone_ranges_applied"], figures["streams_rewritten"], figures["streams"],
        figures["rows_deleted"], figures["files_rewritten"], figures["tombstones_removed"],
        figures["orphan_tombstones_removed"], figures["ranges_waiting_for_flush"], figures["erase_ranges_left"],
        figures["streams_changed"], figures["files_vacuumed"], figures["bytes_vacuumed"],
        figures["errors"], times.held, times.max_held, figures["seconds"],
    )
    return figures


def _vacuum(layout: Layout, path: TableLocation, window: int, times: LeaseTimes, figures: dict[str, Any]) -> None:
    files, size = vacuum_replaced(layout, path, window, times)
    figures["files_vacuumed"] += files
    figures["bytes_vacuumed"] += size


def _stream_ranges(
    stream: StreamEntry, tombstones: list[Tombstone], include_erase: bool, figures: dict[str, Any]
) -> list[tuple[int, int]]:
    """The coalesced ranges of this stream that are safe to make physical now."""
    if not tombstones:
        return []
    flushed = flushed_seq(stream)
    ready: list[tuple[int, int]] = []
    for t in tombstones:
        if t.erase and not include_erase:
            figures["erase_ranges_left"] += 1
        elif t.last_seq > flushed:
            figures["ranges_waiting_for_flush"] += 1
        else:
            ready.append((t.first_seq, t.last_seq))
    return coalesce(ready)


def _apply(
    spark: SparkSession,
    layout: Layout,
    stream: StreamEntry,
    include_erase: bool,
    merge_threshold: int,
    times: LeaseTimes,
    figures: dict[str, Any],
) -> list[tuple[int, int]]:
    """Deletes the stream's ready tombstoned rows; returns the ranges applied (read under the lease)."""
    started = time.monotonic()
    path = stream.path
    if open_table(path) is None:
        log.info("retention %s: no table (deleted meanwhile?)", stream.name)
        return []
    ensure_table_properties(spark, layout, path, times=times)
    with leased(layout, path, times):
        current = read_stream(layout, stream.name)
        if current is None or current.stream_id != stream.stream_id:
            figures["streams_changed"] += 1
            log.info("retention %s: deleted or re-created since it was listed; left for the next run", stream.name)
            return []
        ranges = _stream_ranges(current, read_tombstones(layout, current.stream_id), include_erase, figures)
        if not ranges:
            log.info("retention %s: nothing ready to apply", stream.name)
            return []
        reached("retention.delete")
        version = table_version(path)
        if len(ranges) <= merge_threshold:
            spark.sql(f"DELETE FROM {spark_table(path)} WHERE {seq_predicate(ranges)}").collect()
            how = "DELETE"
        else:
            lo, hi = ranges[0][0], ranges[-1][1]
            source = ranges_frame(spark, ranges, ["first_seq", "last_seq"])
            (
                SparkDeltaTable.forPath(spark, path.spark_uri).alias("t")
                .merge(source.alias("r"), f"t.seq >= {lo} AND t.seq <= {hi} AND t.seq BETWEEN r.first_seq AND r.last_seq")
                .whenMatchedDelete()
                .execute()
            )
            how = "MERGE"
        commit = last_commit(path, version)
    reached("retention.deleted")
    rows = metric(commit, "numDeletedRows", "numTargetRowsDeleted")
    removed = metric(commit, "numRemovedFiles", "numTargetFilesRemoved")
    added = metric(commit, "numAddedFiles", "numTargetFilesAdded")
    figures["tombstone_ranges_applied"] += len(ranges)
    figures["rows_deleted"] += rows
    figures["files_rewritten"] += removed
    figures["files_added"] += added
    if commit is not None:
        figures["streams_rewritten"] += 1
    log.info(
        "retention %s: %d tombstone ranges applied (%s), %d rows deleted, %d files rewritten into %d, %.2fs",
        stream.name, len(ranges), how, rows, removed, added, time.monotonic() - started,
    )
    return ranges


def _remove_tombstones(
    spark: SparkSession,
    layout: Layout,
    applied: list[tuple[str, int, int]],
    orphans: list[str],
    orphan_rows: int,
    include_erase: bool,
    merge_threshold: int,
    times: LeaseTimes,
    figures: dict[str, Any],
) -> None:
    """Deletes the tombstone rows inside applied ranges and every row of the deleted streams."""
    started = time.monotonic()
    removed = remove_tombstones(spark, layout, applied, orphans, include_erase, merge_threshold, times)
    removed_orphans = min(removed, orphan_rows)
    figures["tombstones_removed"] += removed
    figures["orphan_tombstones_removed"] += removed_orphans
    log.info(
        "retention tombstones: %d rows removed for %d applied ranges, %d rows of %d deleted streams, %.2fs",
        removed - removed_orphans, len(applied), removed_orphans, len(orphans), time.monotonic() - started,
    )
