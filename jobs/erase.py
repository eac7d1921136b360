"""The erase job: GDPR erasure that leaves no byte of the erased messages under the warehouse.

Requests (`_system/erasures/<id>.json`, written by the gateway, read and replaced through the engine's
own format module, engine/store/erasures.py) hold sequence ranges only. For each stream with pending
requests, under the stream table's commit lease (the gateway's flusher waits; publishes keep landing
in its log), and after re-reading there what the decision rests on:
1. The stream is still the one asked about: its config (found by the layout's name for it; long names
   are hashed) carries the request's `stream_id`. A stream deleted since (its table and log went with
   it) or never on disk (memory) has nothing left: its requests are done with a receipt saying so,
   unless a deletion cut short left its table or log behind (then they wait). A namesake created
   since is another stream and is not touched.
2. The messages are in the table and out of the write-ahead log: the table's app transaction
   (`transaction_version(stream_id)`) reaches the highest erased sequence, and no log segment the job
   can see (the local `_wal/<stream>/`, and with `--wal object` the objects under `_log/<stream>/`;
   jobs/tables.py `StreamLogs`, the engine's readers) holds one of them; the gateway drops segments
   after each flush. Otherwise the request waits and the log says why.
3. Spark's `DELETE ... WHERE seq BETWEEN ...` (sequence predicates only: Delta keeps a DELETE's
   predicate in its commit info) rewrites the files holding them.
4. The table's `delta.deletedFileRetentionDuration` and `delta.logRetentionDuration` go to zero, in
   one commit that also records their values in `jetlake.erase.savedRetention` (unless a killed run
   recorded them already: the originals are never lost, defect 14).
5. A full vacuum at zero retention (delta-rs) deletes every data file the table no longer names,
   a checkpoint at the newest version holds the live files only, every `_delta_log` entry older
   than it goes (commits naming the erased files and their partition values, Spark's `.crc` files,
   older checkpoints, leftover temporary files), on a local warehouse emptied partition folders go
   (their names are subjects; an object store has no folders), and the properties return to the
   recorded values.
Every file operation goes through the warehouse's `ObjectStore` and delta-rs (a local folder or
S3): one code path for both, no `os.walk` or local path outside the local folders' cleanup.
Then, outside the table's lease: the tombstones lying inside the erased ranges (erase tombstones, and
purge/delete/limit ones whose rows are gone now) are removed from the tombstones table; a
verification pass reads the table after the rewrite and every data object that could hold an
erased sequence, checks that the log holds nothing older than the checkpoint and that no log segment
holds an erased sequence; only then is each request marked done, with a receipt of what was checked
(rows found, files scanned and read, table and checkpoint versions, log entries, segments).

The gateway drops its in-memory copies (buffer, decoded row groups, duplicate window) when the
request is made (engine/erasures.py); the tombstones table and the ack table hold sequences, never a
subject or a payload. A request whose ranges are empty (a filter that matched nothing stored now)
still gets steps 3-5: rows deleted earlier by retention may sit in replaced files and old log entries.
Erasure ends time travel to versions before it: that is the point. Every step is idempotent and a
killed run is finished by the next one; one failing stream is counted and named in the figures
(`streams_failed`, `failed_streams`), and the streams after it go on.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from engine.store.delta import KIND_REMOVE
from engine.store.erasures import mark_done, pending_requests
from engine.store.layout import Layout, TableLocation
from engine.store.objectstore import ObjectStore
from engine.store.rows import KIND_ARROW, KIND_PACKED, decode
from engine.store.sealed import SEALED_KINDS, seq_range
from engine.store.wal import Record
from jobs.tables import (
    LeaseTimes,
    StreamLogs,
    coalesce,
    delta_table,
    file_key,
    leased,
    open_table,
    prepare_session,
    reached,
    read_stream,
    remove_tombstones,
    seq_predicate,
    spark_table,
)

log = logging.getLogger(__name__)

ZERO = "interval 0 seconds"
RETENTION_KEYS = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")
SAVED_RETENTION = "jetlake.erase.savedRetention"
RANGES_PER_DELETE = 256
MERGE_THRESHOLD = 64
_LOG_ENTRY = re.compile(r"^\.?(\d{20})\.")


def run(spark: SparkSession, layout: Layout, lease_times: LeaseTimes | None = None) -> dict[str, Any]:
    """Erases every pending request that can be erased now; returns the figures it logs."""
    started = time.monotonic()
    prepare_session(spark)
    times = lease_times if lease_times is not None else LeaseTimes()
    totals: dict[str, Any] = {
        "requests_done": 0,
        "requests_pending": 0,
        "messages": 0,
        "streams": 0,
        "streams_failed": 0,
        "files_rewritten": 0,
        "rows_deleted": 0,
        "files_vacuumed": 0,
        "bytes_vacuumed": 0,
        "log_entries_removed": 0,
        "folders_removed": 0,
        "tombstones_removed": 0,
        "errors": 0,
        "failed_streams": {},
        "per_stream": {},
    }
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in pending_requests(layout):
        groups.setdefault((record["stream"], record["stream_id"]), []).append(record)
    log.info("erase: %d pending requests over %d streams", sum(len(g) for g in groups.values()), len(groups))
    for n, ((stream, stream_id), records) in enumerate(sorted(groups.items()), 1):
        log.info("erase [%d/%d] %s: %d requests", n, len(groups), stream, len(records))
        report: dict[str, Any] = {"requests": len(records), "done": 0}
        try:
            done = StreamErasure(spark, layout, stream, stream_id, times).run(records, totals)
            report.update(done=len(done), status="done" if len(done) == len(records) else "waiting")
        except Exception as exc:  # this stream's requests stay pending; the next streams go on
            totals["errors"] += 1
            totals["streams_failed"] += 1
            totals["failed_streams"][stream] = f"{type(exc).__name__}: {exc}"[:500]
            report.update(status="failed", error=totals["failed_streams"][stream])
            log.exception("erase [%d/%d] %s failed; its requests stay pending", n, len(groups), stream)
            done = []
        key = stream if stream not in totals["per_stream"] else f"{stream} ({stream_id})"
        totals["per_stream"][key] = report
        totals["requests_done"] += len(done)
        totals["requests_pending"] += len(records) - len(done)
        totals["messages"] += sum(r["messages"] for r in done)
        totals["streams"] += 1 if done else 0
    totals["lease_seconds_held"] = round(times.held, 3)
    totals["seconds"] = round(time.monotonic() - started, 3)
    log.info("erase: %s", " ".join(f"{k}={v}" for k, v in totals.items() if k != "per_stream"))
    return totals


class StreamErasure:
    """The erasure of one stream's pending requests (one `stream_id`)."""

    def __init__(self, spark: SparkSession, layout: Layout, stream: str, stream_id: str, times: LeaseTimes) -> None:
        self.spark = spark
        self.layout = layout
        self.stream = stream
        self.stream_id = stream_id
        self.times = times
        self.table: TableLocation = layout.stream_table_location(stream)
        self.store: ObjectStore = layout.objects
        self.logs = StreamLogs(layout, stream)
        self.started = time.monotonic()

    def run(self, records: list[dict[str, Any]], totals: dict[str, Any]) -> list[dict[str, Any]]:
        """Erases what it can; returns the requests it marked done."""
        with leased(self.layout, self.table, self.times):
            current = read_stream(self.layout, self.stream)
            if current is None or current.stream_id != self.stream_id:
                return self._gone(records, replaced=current is not None)
            ready = self._ready(records)
            if not ready:
                return []
            ranges = coalesce([(a, b) for r in ready for a, b in r["ranges"]])
            figures = self._erase_table(ranges)
        reached("erase.cleaned")
        figures["tombstones_removed"] = remove_tombstones(
            self.spark, self.layout, [(self.stream_id, a, b) for a, b in ranges], [], True, MERGE_THRESHOLD, self.times)
        reached("erase.tombstones_removed")
        with leased(self.layout, self.table, self.times):  # no flush is writing a file meanwhile
            verified = self._verify(ranges, figures["checkpoint_version"])
        if not verified["verified"]:
            raise RuntimeError(f"verification found erased data left: {verified}")
        receipt = self._receipt(figures, verified)
        for record in ready:
            mark_done(self.layout, record, receipt)
        for key in ("files_rewritten", "rows_deleted", "files_vacuumed", "bytes_vacuumed", "log_entries_removed",
                    "folders_removed", "tombstones_removed"):
            totals[key] += figures[key]
        log.info(
            "erase %s: %d requests, %d ranges done in %.2fs: %d files rewritten, %d rows deleted, %d files (%d bytes) "
            "vacuumed, %d log entries and %d folders removed, %d tombstones removed, checkpoint at version %s; "
            "verified: %d data files checked, %d read, %d rows found",
            self.stream, len(ready), len(ranges), time.monotonic() - self.started, figures["files_rewritten"],
            figures["rows_deleted"], figures["files_vacuumed"], figures["bytes_vacuumed"],
            figures["log_entries_removed"],
            figures["folders_removed"], figures["tombstones_removed"], figures["checkpoint_version"],
            verified["files_checked"], verified["files_read"], verified["rows_found"],
        )
        return ready

    # -- what may be erased now (under the lease) ---------------------------------------------

    def _gone(self, records: list[dict[str, Any]], replaced: bool) -> list[dict[str, Any]]:
        """The stream was deleted (its table and log went with it; a namesake's creation removes any
        leftover) or never had files. Done, unless a deletion cut short left the stream's data behind."""
        if not replaced:
            leftover_table = _table_holds(self.table, self.stream_id)
            segments = _log_ranges(self.logs)
            leftover_log = segments is None or any(
                _overlaps(r["ranges"], lo, hi) for r in records for lo, hi in segments)
            if leftover_table or leftover_log:
                log.warning("erase %s: the deleted stream's %s is still there; %d requests wait",
                            self.stream, "table" if leftover_table else "log", len(records))
                return []
        receipt = self._receipt({"stream_deleted": True}, {"verified": True, "stream_deleted": True})
        for record in records:
            mark_done(self.layout, record, receipt)
        log.info("erase %s: the stream was deleted%s; nothing of it is stored (%d requests done)",
                 self.stream, " and re-created" if replaced else "", len(records))
        return records

    def _ready(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        dt = open_table(self.table)
        flushed = (dt.transaction_version(self.stream_id) or 0) if dt is not None else 0
        segments = _log_ranges(self.logs)
        ready = []
        for record in records:
            highest = max((last for _, last in record["ranges"]), default=0)
            if highest > flushed:
                log.info("erase %s: request %s waits for a flush (seq %d > flushed %d)",
                         self.stream, record["id"], highest, flushed)
            elif segments is None or any(_overlaps(record["ranges"], lo, hi) for lo, hi in segments):
                log.info("erase %s: request %s waits for the gateway to drop log segments holding its messages",
                         self.stream, record["id"])
            else:
                ready.append(record)
        return ready

    # -- the rewrite and the cleanup (under the lease) ----------------------------------------

    def _erase_table(self, ranges: list[tuple[int, int]]) -> dict[str, Any]:
        """Steps 3-5; each one is a no-op when a killed run already did it."""
        figures: dict[str, Any] = {"files_rewritten": 0, "files_written": 0, "rows_deleted": 0}
        reached("erase.delete")
        self._delete(ranges, figures)
        reached("erase.deleted")
        self._zero_retention()
        reached("erase.retention_zeroed")
        time.sleep(0.002)  # the DELETE's tombstones must be strictly older than "now - 0" for the checkpoint
        files_before = _data_files(self.store, self.table)
        # Full mode: also files no commit ever named (a flush cut short by a crash leaves such files).
        delta_table(self.table).vacuum(
            retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
        gone = set(files_before) - set(_data_files(self.store, self.table))
        figures["files_vacuumed"] = sum(1 for key in gone if not _hidden(key))
        figures["bytes_vacuumed"] = sum(files_before[key] for key in gone)
        reached("erase.vacuumed")
        dt = delta_table(self.table)
        dt.create_checkpoint()
        figures["checkpoint_version"] = dt.version()
        figures["log_entries_removed"] = _remove_old_log_entries(self.store, self.table, dt.version())
        local = self.table.local_path
        figures["folders_removed"] = _remove_empty_folders(self.store, self.table, local) if local else 0
        reached("erase.log_cleaned")
        self._restore_retention()
        figures["table_version"] = delta_table(self.table).version()
        return figures

    def _delete(self, ranges: list[tuple[int, int]], figures: dict[str, Any]) -> None:
        ident = spark_table(self.table)
        for i in range(0, len(ranges), RANGES_PER_DELETE):
            chunk = ranges[i : i + RANGES_PER_DELETE]
            before = delta_table(self.table).version()
            self.spark.sql(f"DELETE FROM {ident} WHERE {seq_predicate(chunk)}").collect()
            dt = delta_table(self.table)
            if dt.version() > before:
                commit = dt.history(1)[0]
                metrics = commit.get("operationMetrics") or {}
                if commit.get("operation") == "DELETE":
                    figures["files_rewritten"] += int(metrics.get("numRemovedFiles", 0))
                    figures["files_written"] += int(metrics.get("numAddedFiles", 0))
                    figures["rows_deleted"] += int(metrics.get("numDeletedRows", 0))

    def _zero_retention(self) -> None:
        """Zero file and log retention, recording the values they replace in the same commit; a rerun
        after a kill finds them recorded and keeps them."""
        dt = delta_table(self.table)
        config = dt.metadata().configuration
        changes = {key: ZERO for key in RETENTION_KEYS if config.get(key) != ZERO}
        if SAVED_RETENTION not in config:
            changes[SAVED_RETENTION] = json.dumps({key: config.get(key) for key in RETENTION_KEYS})
        if changes:
            dt.alter.set_table_properties(changes, raise_if_not_exists=False)  # our own key is not a Delta one

    def _restore_retention(self) -> None:
        """Back to the recorded values (unset where there was none), then the record goes."""
        config = delta_table(self.table).metadata().configuration
        if SAVED_RETENTION not in config:
            return
        saved: dict[str, str | None] = json.loads(config[SAVED_RETENTION])
        values = {key: value for key, value in saved.items() if value is not None}
        if any(config.get(key) != value for key, value in values.items()):
            delta_table(self.table).alter.set_table_properties(values)
        reached("erase.retention_restored")
        unset = [key for key, value in saved.items() if value is None] + [SAVED_RETENTION]
        ident = spark_table(self.table)  # delta-rs cannot unset a property
        keys = ", ".join(repr(k) for k in unset)
        self.spark.sql(f"ALTER TABLE {ident} UNSET TBLPROPERTIES IF EXISTS ({keys})").collect()

    # -- after the rewrite ----------------------------------------------------------------------

    def _verify(self, ranges: list[tuple[int, int]], checkpoint: int) -> dict[str, Any]:
        """Reads the table after the rewrite: no live row, no data file in the store, no log entry older
        than the checkpoint this run wrote and no log segment may hold an erased sequence."""
        dt = delta_table(self.table)
        actions = pa.table(dt.get_add_actions(flatten=True))
        paths = actions.column("path").to_pylist()
        named = {file_key(self.table, p) for p in paths}
        on_disk = [key for key in _data_files(self.store, self.table) if not _hidden(key)]
        untracked = [key for key in on_disk if key not in named]
        stats = {
            file_key(self.table, p): (lo, hi)
            for p, lo, hi in zip(paths, actions.column("min.seq").to_pylist(),
                                 actions.column("max.seq").to_pylist(), strict=True)
        }
        los = np.array([a for a, _ in ranges], np.int64)
        his = np.array([b for _, b in ranges], np.int64)
        rows_found = files_read = 0
        for key in on_disk:
            low, high = stats.get(key, (None, None))
            if not len(ranges) or (low is not None and high is not None and not ((los <= high) & (his >= low)).any()):
                continue
            data = pa.BufferReader(self.store.get(key).data)
            seqs = pq.read_table(data, columns=["seq"]).column("seq").to_numpy()
            files_read += 1
            rows_found += int(_in_ranges(seqs, los, his).sum())
        entries = _log_entry_names(self.store, self.table)
        older = [name for name in entries if (m := _LOG_ENTRY.match(name)) and int(m.group(1)) < checkpoint]
        prefix = f"{checkpoint:020d}.checkpoint."
        written = any(name.startswith(prefix) and name.endswith(".parquet") for name in entries)
        segments = _log_ranges(self.logs)
        in_log = segments is None or any(a <= hi and lo <= b for a, b in ranges for lo, hi in segments)
        return {
            "verified": rows_found == 0 and not untracked and not older and not in_log and written,
            "rows_found": rows_found,
            "files_checked": len(on_disk),
            "files_read": files_read,
            "untracked_files": len(untracked),
            "table_version": dt.version(),
            "checkpoint_version": checkpoint,
            "log_entries": len(entries),
            "log_entries_before_checkpoint": len(older),
            "wal_segments_checked": self.logs.segments_read,
        }

    def _receipt(self, figures: dict[str, Any], verified: dict[str, Any]) -> dict[str, Any]:
        receipt: dict[str, Any] = {
            "stream": self.stream,
            "files_rewritten": 0,
            "files_written": 0,
            "rows_deleted": 0,
            "files_vacuumed": 0,
            "bytes_vacuumed": 0,
            "log_entries_removed": 0,
            "folders_removed": 0,
            "tombstones_removed": 0,
            "checkpoint_version": None,
        }
        receipt.update(figures)
        receipt["verification"] = verified
        receipt["seconds"] = round(time.monotonic() - self.started, 3)
        return receipt


# -- files ------------------------------------------------------------------------------------


def _in_ranges(seqs: np.ndarray, los: np.ndarray, his: np.ndarray) -> np.ndarray:
    """Which of `seqs` lie inside one of the sorted, disjoint ranges [los[i], his[i]]."""
    i = np.searchsorted(los, seqs, side="right") - 1
    return (i >= 0) & (seqs <= his[np.maximum(i, 0)])


def _hidden(key: str) -> bool:
    """A hidden file (`.crc` checksums beside local files): no rows of its own."""
    return key.rsplit("/", 1)[-1].startswith(".")


def _data_files(store: ObjectStore, table: TableLocation) -> dict[str, int]:
    """Every object of the table outside `_delta_log`, by key, with its size."""
    log_prefix = f"{table.key}/_delta_log/"
    return {meta.key: meta.size for meta in store.list(table.key)
            if not meta.key.startswith(log_prefix) and not meta.key.endswith("/")}


def _log_entry_names(store: ObjectStore, table: TableLocation) -> list[str]:
    """The names of the objects directly in the table's `_delta_log`."""
    folder = f"{table.key}/_delta_log/"
    return [meta.key[len(folder):] for meta in store.list(folder) if "/" not in meta.key[len(folder):]]


def _remove_old_log_entries(store: ObjectStore, table: TableLocation, checkpoint: int) -> int:
    """Deletes commits, checksums, checkpoints (and their hidden `.crc`) older than `checkpoint`, and
    any temporary commit file (no commit is in flight: the caller holds the lease)."""
    removed = 0
    for name in sorted(_log_entry_names(store, table)):
        match = _LOG_ENTRY.match(name)
        old = match is not None and int(match.group(1)) < checkpoint
        if old or name.endswith(".tmp"):
            store.delete(f"{table.key}/_delta_log/{name}")
            removed += 1
    return removed


def _remove_empty_folders(store: ObjectStore, table: TableLocation, local: Path) -> int:
    """On a local warehouse, removes partition folders left without data files (their names are subject
    values), with any orphaned hidden checksum files in them. An object store has no folders: a
    partition's name goes with its last object."""
    removed = 0
    files = _data_files(store, table)
    for key in [k for k in files if _hidden(k) and k.endswith(".crc")]:
        folder, _, name = key.rpartition("/")
        if f"{folder}/{name[1:-4]}" not in files:
            store.delete(key)
    for folder in sorted((p for p in local.rglob("*") if p.is_dir() and "_delta_log" not in p.relative_to(local).parts),
                         key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()
            removed += 1
        except OSError:
            pass
    return removed


def _table_holds(table: TableLocation, stream_id: str) -> bool:
    try:
        dt = open_table(table)
        return dt is not None and dt.transaction_version(stream_id) is not None
    except Exception:  # an unreadable leftover: keep the request pending, to be looked at
        return True


# -- the write-ahead log, through the engine's readers (jobs/tables.py StreamLogs) ------------


def _log_ranges(logs: StreamLogs) -> list[tuple[int, int]] | None:
    """The sequence range of each message record in the stream's log; None if a record is of a kind
    this job does not know, or an object is not a log object (it may hold messages: wait rather than guess)."""
    try:
        return _record_ranges(logs.records())
    except ValueError:
        return None


def _record_ranges(records: Iterable[Record]) -> list[tuple[int, int]] | None:
    found: list[tuple[int, int]] = []
    for record in records:
        if record.kind in (KIND_ARROW, KIND_PACKED):
            rows = decode(record.kind, record.payload)
            if len(rows):
                found.append((rows.first_seq, rows.last_seq))
        elif record.kind in SEALED_KINDS:  # an encrypted stream's record: its sequences are plain
            span = seq_range(record.kind, record.payload)
            if span is not None:
                found.append(span)
        elif record.kind != KIND_REMOVE:
            return None
    return found


def _overlaps(ranges: list[list[int]], lo: int, hi: int) -> bool:
    return any(a <= hi and lo <= b for a, b in ranges)
