"""The erase job: GDPR erasure that leaves no byte of the erased messages under the warehouse.

For each stream with pending erasure requests (`_system/erasures/<id>.json`, written by the gateway;
format in engine/store/erasures.py, read here with a few lines of our own because jobs/ may import
only layout and lease from the engine):
1. Wait until the messages are in the table and out of the write-ahead log: the table's app
   transaction for the stream (`transaction_version(stream_id)`) must reach the highest erased
   sequence, and no log segment under `_wal/<stream>/` may still hold one of them (the gateway drops
   segments after each flush). Otherwise the request stays pending and the log says why.
2. Under the table's commit lease (the gateway's flusher waits; publishes keep landing in its log):
   - Spark's `DELETE ... WHERE seq BETWEEN ...` (sequence predicates only: Delta keeps a DELETE's
     predicate in its commit info, so no subject may appear in it) rewrites the files holding them,
   - `delta.deletedFileRetentionDuration` and `delta.logRetentionDuration` go to zero,
   - a full vacuum at zero retention (delta-rs) deletes every data file the table no longer names,
   - a checkpoint at the newest version (delta-rs): it holds the live files only, since the zero
     retention lets it drop the DELETE's `remove` tombstones, which name partition values,
   - every `_delta_log` entry older than that checkpoint goes (commits whose `add`/`remove` actions
     carry the erased files' paths and partition values, Spark's `.crc` files listing all files,
     older checkpoints, leftover temporary commit files),
   - emptied partition folders go (their names are subjects),
   - the two properties return to what they were.
3. Write the receipt into each request and mark it done.

The tombstones table holds stream names, stream ids and sequence ranges only, the ack table stream
sequences and consumer positions: neither names a subject or a payload, so neither needs this.
Erasure ends time travel to versions before it: that is the point. Every step is idempotent, so a
killed run is finished by the next one (the request stays pending until the last step is done).
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine.store.layout import STREAM_SCHEMA, Layout
from engine.store.lease import commit_lease

log = logging.getLogger(__name__)

PENDING = "pending"
DONE = "done"
ZERO = "interval 0 seconds"
RETENTION_KEYS = ("delta.deletedFileRetentionDuration", "delta.logRetentionDuration")
RANGES_PER_DELETE = 256
_LOG_ENTRY = re.compile(r"^\.?(\d{20})\.")

# The write-ahead log's record header and small-group row layout (engine/store/wal.py, rows.py).
_WAL_MAGIC = b"JLW1"
_WAL_HEADER = struct.Struct("<4sBQII")
_WAL_ARROW, _WAL_REMOVE, _WAL_PACKED = 1, 2, 3
_PACKED_FIXED = struct.Struct("<qqiIIII")
_PACKED_PARTITION = struct.Struct("<I")


def run(spark: SparkSession, layout: Layout, **options: Any) -> dict[str, int | float]:
    """Erases every pending request that can be erased now; returns the figures it logs."""
    started = time.monotonic()
    totals: dict[str, int | float] = {
        "requests_done": 0,
        "requests_pending": 0,
        "messages": 0,
        "streams": 0,
        "files_rewritten": 0,
        "rows_deleted": 0,
        "files_vacuumed": 0,
        "bytes_vacuumed": 0,
        "log_entries_removed": 0,
        "folders_removed": 0,
    }
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in _pending(layout):
        groups.setdefault((record["stream"], record["stream_id"]), []).append(record)
    log.info("erase: %d pending requests over %d streams", sum(len(g) for g in groups.values()), len(groups))
    for n, ((stream, stream_id), records) in enumerate(sorted(groups.items()), 1):
        log.info("erase: stream %d/%d %s: %d requests", n, len(groups), stream, len(records))
        done = _erase_stream(spark, layout, stream, stream_id, records, totals)
        totals["requests_done"] += len(done)
        totals["requests_pending"] += len(records) - len(done)
        totals["messages"] += sum(r["messages"] for r in done)
        totals["streams"] += 1 if done else 0
    totals["seconds"] = round(time.monotonic() - started, 3)
    log.info("erase: %s", " ".join(f"{k}={v}" for k, v in totals.items()))
    return totals


# -- requests ---------------------------------------------------------------------------------


def _requests_dir(layout: Layout) -> Path:
    return layout.root / "_system" / "erasures"


def _pending(layout: Layout) -> list[dict[str, Any]]:
    folder = _requests_dir(layout)
    records = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            log.warning("erase: unreadable request file %s skipped", path.name)
            continue
        if record.get("status") == PENDING:
            records.append(record)
    return sorted(records, key=lambda r: (r["requested"], r["id"]))


def _mark_done(layout: Layout, record: dict[str, Any], receipt: dict[str, Any]) -> None:
    record = {**record, "status": DONE, "completed": time.time_ns(), "receipt": receipt}
    path = _requests_dir(layout) / f"{record['id']}.json"
    tmp = path.with_suffix(".json.tmp")
    with open(tmp, "wb") as f:
        f.write(orjson.dumps(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- one stream -------------------------------------------------------------------------------


def _erase_stream(
    spark: SparkSession, layout: Layout, stream: str, stream_id: str, records: list[dict[str, Any]], totals: dict[str, Any]
) -> list[dict[str, Any]]:
    """Erases what it can of one stream's requests; returns the requests it marked done."""
    started = time.monotonic()
    table = layout.stream_table(stream)
    empty = [r for r in records if not r["ranges"]]
    records = [r for r in records if r["ranges"]]
    nothing = _receipt(stream, started, checkpoint_version=None)
    for record in empty:
        _mark_done(layout, record, nothing)
    if not records:
        return empty

    config_path = layout.stream_configs / f"{stream}.json"
    current_id = orjson.loads(config_path.read_bytes()).get("stream_id") if config_path.exists() else None
    if current_id != stream_id:
        # The stream was deleted (its table and log went with it) or was a memory stream (never on disk);
        # a namesake created since starts from an emptied folder. Unless the deletion was cut short:
        leftover_log = current_id is None and _wal_seqs(layout.wal_dir(stream)) != []
        if _table_holds_stream(table, stream_id) or leftover_log:
            log.warning("erase: %s: deleted stream's table or log still present; %d requests left pending", stream, len(records))
            return empty
        for record in records:
            _mark_done(layout, record, nothing)
        log.info("erase: %s: stream no longer exists, nothing stored to erase (%d requests)", stream, len(records))
        return empty + records
    if not (table / "_delta_log").is_dir():
        for record in records:
            _mark_done(layout, record, nothing)
        return empty + records

    flushed = DeltaTable(str(table)).transaction_version(stream_id) or 0
    wal = _wal_seqs(layout.wal_dir(stream))
    ready = []
    for record in records:
        highest = max(last for _, last in record["ranges"])
        if highest > flushed:
            log.info("erase: %s: request %s waits for a flush (seq %d > flushed %d)", stream, record["id"], highest, flushed)
        elif wal is None or any(_overlaps(record["ranges"], lo, hi) for lo, hi in wal):
            log.info("erase: %s: request %s waits for the gateway to drop log segments holding its messages", stream, record["id"])
        else:
            ready.append(record)
    if not ready:
        return empty
    ranges = _merge([tuple(r) for record in ready for r in record["ranges"]])
    with commit_lease(layout.lease_file(table)):
        figures = _erase_table(spark, table, ranges)
    receipt = _receipt(stream, started, **figures)
    for record in ready:
        _mark_done(layout, record, receipt)
    for key in ("files_rewritten", "rows_deleted", "files_vacuumed", "bytes_vacuumed", "log_entries_removed", "folders_removed"):
        totals[key] += figures[key]
    log.info(
        "erase: %s: %d requests, %d ranges done in %.2fs: %d files rewritten, %d rows deleted, %d files (%d bytes) vacuumed, "
        "%d log entries removed, %d folders removed, checkpoint at version %s",
        stream, len(ready), len(ranges), time.monotonic() - started, figures["files_rewritten"], figures["rows_deleted"],
        figures["files_vacuumed"], figures["bytes_vacuumed"], figures["log_entries_removed"], figures["folders_removed"],
        figures["checkpoint_version"],
    )
    return empty + ready


def _receipt(stream: str, started: float, **figures: Any) -> dict[str, Any]:
    base = {
        "stream": stream,
        "files_rewritten": 0,
        "files_written": 0,
        "rows_deleted": 0,
        "files_vacuumed": 0,
        "bytes_vacuumed": 0,
        "log_entries_removed": 0,
        "folders_removed": 0,
        "checkpoint_version": None,
    }
    base.update(figures)
    base["seconds"] = round(time.monotonic() - started, 3)
    return base


def _erase_table(spark: SparkSession, table: Path, ranges: list[tuple[int, int]]) -> dict[str, Any]:
    """Step 2 under the caller's lease; every part is a no-op when already done.

    Spark rewrites the files (the part that grows with the data); delta-rs does the bookkeeping that
    Spark makes slow on a small machine (a zero-retention VACUUM in Spark runs several jobs over the
    file listing: minutes here under load, against milliseconds)."""
    ident = "delta.`" + str(table).replace("`", "``") + "`"
    figures: dict[str, Any] = {"files_rewritten": 0, "files_written": 0, "rows_deleted": 0}
    for i in range(0, len(ranges), RANGES_PER_DELETE):
        chunk = ranges[i : i + RANGES_PER_DELETE]
        predicate = " OR ".join(f"seq = {a}" if a == b else f"(seq BETWEEN {a} AND {b})" for a, b in chunk)
        before = DeltaTable(str(table)).version()
        spark.sql(f"DELETE FROM {ident} WHERE {predicate}")
        dt = DeltaTable(str(table))
        if dt.version() > before:
            commit = dt.history(1)[0]
            metrics = commit.get("operationMetrics") or {}
            if commit.get("operation") == "DELETE":
                figures["files_rewritten"] += int(metrics.get("numRemovedFiles", 0))
                figures["files_written"] += int(metrics.get("numAddedFiles", 0))
                figures["rows_deleted"] += int(metrics.get("numDeletedRows", 0))

    dt = DeltaTable(str(table))
    original = dt.metadata().configuration
    if any(original.get(key) != ZERO for key in RETENTION_KEYS):
        dt.alter.set_table_properties({key: ZERO for key in RETENTION_KEYS})
    time.sleep(0.002)  # the DELETE's tombstones must be strictly older than "now - 0" for the checkpoint
    files_before = _data_files(table)
    dt = DeltaTable(str(table))
    # Full mode: also files no commit ever named (a flush cut short by a crash leaves such files).
    dt.vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True)
    files_after = _data_files(table)
    gone = set(files_before) - set(files_after)
    figures["files_vacuumed"] = sum(1 for p in gone if not p.name.startswith("."))
    figures["bytes_vacuumed"] = sum(files_before[p] for p in gone)

    dt = DeltaTable(str(table))
    dt.create_checkpoint()
    checkpoint = dt.version()
    figures["checkpoint_version"] = checkpoint
    figures["log_entries_removed"] = _remove_old_log_entries(table / "_delta_log", checkpoint)
    figures["folders_removed"] = _remove_empty_folders(table)

    restore = {k: original[k] for k in RETENTION_KEYS if k in original and original[k] != ZERO}
    unset = [k for k in RETENTION_KEYS if k not in restore]
    if restore:
        DeltaTable(str(table)).alter.set_table_properties(restore)
    if unset:  # delta-rs cannot unset a property
        spark.sql(f"ALTER TABLE {ident} UNSET TBLPROPERTIES IF EXISTS ({', '.join(repr(k) for k in unset)})")
    figures["table_version"] = DeltaTable(str(table)).version()
    return figures


def _data_files(table: Path) -> dict[Path, int]:
    out: dict[Path, int] = {}
    for root, dirs, files in os.walk(table):
        if Path(root) == table:
            dirs[:] = [d for d in dirs if d != "_delta_log"]
        for name in files:
            path = Path(root) / name
            try:
                out[path] = path.stat().st_size
            except FileNotFoundError:
                pass
    return out


def _remove_old_log_entries(delta_log: Path, checkpoint: int) -> int:
    """Deletes commits, checksums, checkpoints (and their hidden `.crc`) older than `checkpoint`, and
    any temporary commit file (no commit is in flight: the caller holds the lease)."""
    removed = 0
    for path in sorted(delta_log.iterdir()):
        if not path.is_file():
            continue
        match = _LOG_ENTRY.match(path.name)
        old = match is not None and int(match.group(1)) < checkpoint
        if old or path.name.endswith(".tmp"):
            path.unlink(missing_ok=True)
            removed += 1
    if removed:
        _fsync_dir(delta_log)
    return removed


def _remove_empty_folders(table: Path) -> int:
    """Removes partition folders left without data files (their names are subject values), with any
    orphaned hidden checksum files in them."""
    removed = 0
    for root, _dirs, files in os.walk(table, topdown=False):
        here = Path(root)
        if here == table or "_delta_log" in here.relative_to(table).parts:
            continue
        for name in files:
            if name.startswith(".") and name.endswith(".crc") and not (here / name[1:-4]).exists():
                (here / name).unlink(missing_ok=True)
        try:
            here.rmdir()
            removed += 1
        except OSError:
            pass
    if removed:
        _fsync_dir(table)
    return removed


def _table_holds_stream(table: Path, stream_id: str) -> bool:
    if not (table / "_delta_log").is_dir():
        return False
    try:
        return DeltaTable(str(table)).transaction_version(stream_id) is not None
    except Exception:  # an unreadable leftover: keep the request pending, to be looked at
        return True


# -- the write-ahead log ----------------------------------------------------------------------


def _wal_seqs(folder: Path) -> list[tuple[int, int]] | None:
    """The sequence range of each message record in a stream's log segments; None if one can't be read."""
    if not folder.is_dir():
        return []
    found: list[tuple[int, int]] = []
    for path in sorted(folder.iterdir()):
        if not path.name.endswith(".wal"):
            continue
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue  # flushed and dropped meanwhile
        offset = 0
        while offset + _WAL_HEADER.size <= len(data):
            magic, kind, _, length, _ = _WAL_HEADER.unpack_from(data, offset)
            end = offset + _WAL_HEADER.size + length
            if magic != _WAL_MAGIC or end > len(data):
                break  # a torn tail: never acknowledged
            payload = memoryview(data)[offset + _WAL_HEADER.size : end]
            if kind == _WAL_ARROW:
                batch = pa.ipc.read_record_batch(pa.py_buffer(payload), STREAM_SCHEMA)
                seqs = batch.column("seq")
                if len(seqs):
                    found.append((seqs[0].as_py(), seqs[len(seqs) - 1].as_py()))
            elif kind == _WAL_PACKED:
                first = last = None
                pos = 0
                try:
                    while pos < len(payload):
                        seq, _, _, ls, lm, lh, ld = _PACKED_FIXED.unpack_from(payload, pos)
                        pos += _PACKED_FIXED.size + ls + max(lm - 1, 0) + lh
                        (lp,) = _PACKED_PARTITION.unpack_from(payload, pos)
                        pos += _PACKED_PARTITION.size + lp + ld
                        first = seq if first is None else first
                        last = seq
                except struct.error:
                    return None
                if first is not None and last is not None:
                    found.append((first, last))
            elif kind != _WAL_REMOVE:
                return None
            offset = end
    return found


def _overlaps(ranges: list[list[int]], lo: int, hi: int) -> bool:
    return any(a <= hi and lo <= b for a, b in ranges)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
