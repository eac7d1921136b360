"""Appending to a Delta table exactly once: the one commit path of the flusher (streams, tombstones, acks).

Each commit carries a Delta app transaction (`txn`: app id, version = the last sequence or LSN it
holds). Before writing, the table's transaction version is read: rows at or below it are already in
the table (a commit that landed although the call that made it raised) and are not written again.
After any exception the version is read again: a commit that landed is a commit, whatever the error
said. delta-rs raises after the commit when its post-commit checkpoint fails (a nearly full disk,
every `delta.checkpointInterval`-th version), so the checkpoint is taken here as a step of its own,
whose failure is logged and leaves the commit standing. Under `--sync always` a commit is made
durable (its Parquet files, their folders, the commit JSON, `_delta_log/` and the table folder are
fsynced) before it counts, so the log segments it replaces can be deleted; on S3 a commit is durable
when its conditional PUT returns (delta-rs's `aws_conditional_put=etag`). Counterpart: the
exactly-once `txn` protocol of Delta Lake (delta.md); nats-server has none (it owns its files).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import TableNotFoundError

from engine.store import failpoints
from engine.store.data_files import FileEncoding, write_data_files
from engine.store.layout import TableLocation
from engine.store.leases import LeaseLostError
from engine.store.objectstore import ObjectNotFoundError, ObjectStoreError

log = logging.getLogger(__name__)

NO_HOOKS = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
_FIND_BACK = 200  # commits searched backwards for the one holding a transaction version


def open_table(table: TableLocation) -> DeltaTable:
    """The table's latest version through delta-rs. Raises TableNotFoundError."""
    return DeltaTable(table.uri, storage_options=table.storage_options)


def ensure_table(
    table: TableLocation, schema: pa.Schema, partition_by: list[str] | None, properties: dict[str, str],
    sync: bool = False,
) -> None:
    """Creates the table if it is missing (its first commit fsynced under `sync` on local disk)."""
    path = table.local_path
    if path is not None and (path / "_delta_log").exists():
        return
    if path is None and DeltaTable.is_deltatable(table.uri, table.storage_options):
        return
    DeltaTable.create(table.uri, schema=schema, partition_by=partition_by, configuration=properties, mode="ignore",
                      storage_options=table.storage_options)
    if sync and path is not None:
        _fsync(path / "_delta_log" / _commit_name(0))
        for folder in (path / "_delta_log", path, path.parent):
            _fsync(folder)


class TableCommitter:
    """Appends to one table; `step` names its failpoints (`<step>.commit`, `.checkpoint`, `.sync`)."""

    def __init__(self, table: TableLocation, step: str, sync: bool = False) -> None:
        self.table = table
        self.path = table.uri
        self.step = step
        self.sync = sync and table.local_path is not None  # a PUT that returned is durable
        self._durable: dict[str, int] = {}  # app id -> transaction version known to be on disk

    def append(
        self,
        rows_after: Callable[[int], pa.Table],
        app_id: str,
        version: int,
        extra: list[Transaction] | None = None,
        encoding: FileEncoding = FileEncoding(),
        fence: tuple[str, int] | None = None,
    ) -> int:
        """Commits `rows_after(v)` (the rows above transaction version v, the table's now) with the
        transaction (`app_id`, `version`) unless the table holds it already; returns the table version
        holding it. Raises when it is not committed (or, under sync, not durable). The rows' files are
        written here (data_files.py, encoded as `encoding` says) and delta-rs commits them.

        `fence` (app id, token): the writer's lease token, recorded as a transaction of its own; a
        table holding a larger token was committed by a newer owner, and the commit is refused
        (LeaseLostError). The caller holds the table's commit lease, so the check and the commit are
        one step for every JetLake writer."""
        dt = open_table(self.table)
        if fence is not None:
            newer = dt.transaction_version(fence[0]) or 0
            if newer > fence[1]:
                raise LeaseLostError(f"{self.path} was committed under token {newer}, this writer has {fence[1]}")
            extra = [*(extra or []), Transaction(app_id=fence[0], version=fence[1])]
        done = dt.transaction_version(app_id) or 0
        if done >= version:
            log.info("%s: transaction %s/%d is already in %s; not written again", self.step, app_id, version, self.path)
            return self._made_durable(app_id, done, dt.version())
        if done:
            self._made_durable(app_id, done, dt.version())
        rows = rows_after(done)
        try:
            action = failpoints.hit(f"{self.step}.commit") if failpoints.ARMED else None
            self._write(dt, rows, encoding, [Transaction(app_id=app_id, version=version), *(extra or [])])
            failpoints.after(f"{self.step}.commit", action)
        except Exception as exc:
            dt = self._landed(app_id, version, exc)
        committed = dt.version()
        self._checkpoint(dt, committed)
        if self.sync:
            self._sync(app_id, version, committed)
        return committed

    def _write(self, dt: DeltaTable, rows: pa.Table, encoding: FileEncoding, transactions: list[Transaction]) -> None:
        """Writes the rows' files, then commits them with the transactions in one Delta commit. A file
        write that fails removes what it wrote; once the commit was tried, the files stay (it may have
        landed: `_landed` decides, and an orphan is vacuum's)."""
        metadata = dt.metadata()
        partition_by = list(metadata.partition_columns)
        stats = metadata.configuration.get("delta.dataSkippingStatsColumns", "")
        adds = write_data_files(self.table, rows, partition_by, encoding,
                                [name.strip() for name in stats.split(",") if name.strip()])
        dt.create_write_transaction(adds, "append", dt.schema(), partition_by,
                                    commit_properties=CommitProperties(app_transactions=transactions),
                                    post_commithook_properties=NO_HOOKS)
        dt.update_incremental()  # the commit leaves `dt` where it was; under the lease the latest is this one

    def _landed(self, app_id: str, version: int, exc: Exception) -> DeltaTable:
        """After a write raised: the table if the commit landed anyway; else the error goes on."""
        try:
            dt = open_table(self.table)
            landed = (dt.transaction_version(app_id) or 0) >= version
        except Exception:  # noqa: BLE001 - the table cannot even be read: the write's own error says more
            landed = False
        if not landed:
            raise exc
        log.warning("%s: commit of %s/%d to %s raised (%s) after it landed: counted as committed",
                    self.step, app_id, version, self.path, exc)
        return dt

    def _checkpoint(self, dt: DeltaTable, version: int) -> None:
        """A checkpoint every `delta.checkpointInterval` versions, as delta-rs would; a failure is logged only."""
        try:
            interval = int(dt.metadata().configuration.get("delta.checkpointInterval", "100"))
            if interval <= 0 or (version + 1) % interval:
                return
            action = failpoints.hit(f"{self.step}.checkpoint") if failpoints.ARMED else None
            dt.create_checkpoint()
            dt.cleanup_metadata()
            failpoints.after(f"{self.step}.checkpoint", action)
        except Exception as exc:  # noqa: BLE001 - the commit stands; readers replay more JSON until the next checkpoint
            log.warning("%s: checkpoint of %s at version %d failed (the commit stands): %s",
                        self.step, self.path, version, exc)

    @property
    def _local(self) -> Path:
        assert self.table.local_path is not None, "only local tables are fsynced"
        return self.table.local_path

    def _sync(self, app_id: str, txn: int, version: int) -> None:
        action = failpoints.hit(f"{self.step}.sync") if failpoints.ARMED else None
        sync_commit(self._local, version)
        failpoints.after(f"{self.step}.sync", action)
        self._durable[app_id] = txn

    def _made_durable(self, app_id: str, txn: int, latest: int) -> int:
        """The version holding transaction `txn`, fsynced under sync unless this process did already."""
        if not self.sync or self._durable.get(app_id, -1) >= txn:
            return latest
        holding = find_transaction(self._local, app_id, txn, latest)
        self._sync(app_id, txn, latest if holding is None else holding)
        return latest if holding is None else holding

    def ensure_durable(self, app_id: str) -> None:
        """Under sync: the commit holding the table's transaction for `app_id` is on disk (recovery calls
        this before deleting log segments that a commit of an earlier process replaced)."""
        if not self.sync:
            return
        try:
            dt = open_table(self.table)
        except TableNotFoundError:
            return
        txn = dt.transaction_version(app_id)
        if txn:
            self._made_durable(app_id, txn, dt.version())

    def delete(self, predicate: str) -> None:
        """Deletes rows (the ack table's folded events); the `<step>.fold` failpoint."""
        action = failpoints.hit(f"{self.step}.fold") if failpoints.ARMED else None
        dt = open_table(self.table)
        dt.delete(predicate, post_commithook_properties=NO_HOOKS)
        failpoints.after(f"{self.step}.fold", action)
        self._checkpoint(dt, dt.version())


def find_transaction(path: Path, app_id: str, txn: int, latest: int) -> int | None:
    """The table version whose commit carries transaction (`app_id`, `txn`), searched back from `latest`."""
    for version in range(latest, max(latest - _FIND_BACK, -1), -1):
        try:
            lines = (path / "_delta_log" / _commit_name(version)).read_bytes().splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            if b'"txn"' in line:
                action = orjson.loads(line).get("txn") or {}
                if action.get("appId") == app_id and action.get("version") == txn:
                    return version
    return None


def sync_commit(path: Path, version: int) -> None:
    """fsyncs what commit `version` of the table at `path` made: its added files, their folders up to
    the table's, the commit JSON and `_delta_log/`."""
    commit = path / "_delta_log" / _commit_name(version)
    folders: set[Path] = {path, path / "_delta_log"}
    for line in commit.read_bytes().splitlines():
        if b'"add"' not in line:
            continue
        add = orjson.loads(line).get("add")
        if not add:
            continue
        file = path / unquote(add["path"])
        _fsync(file)
        folder = file.parent
        while folder != path and path in folder.parents:
            folders.add(folder)
            folder = folder.parent
    _fsync(commit)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        _fsync(folder)


def transactions(table: TableLocation) -> dict[str, int] | None:
    """Every app transaction's version in `table` (app id -> version), read through the warehouse's
    object store from its last checkpoint and the commits after it in one pass: one answer for
    thousands of app ids, where `DeltaTable.transaction_version` costs a call each. None when the log
    is not in a shape read here (a multi-part checkpoint, a commit missing): the caller then asks
    delta-rs per app id."""
    store, log_key = table.objects, _log_key(table)
    found: dict[str, int] = {}
    start = 0
    try:
        pointer = orjson.loads(store.get(f"{log_key}/_last_checkpoint").data)
    except ObjectNotFoundError:
        pointer = None
    except (ObjectStoreError, orjson.JSONDecodeError):
        return None
    if pointer is not None:
        if pointer.get("parts"):
            return None
        start = int(pointer["version"])
        try:
            checkpoint = store.get(f"{log_key}/{start:020d}.checkpoint.parquet").data
            txn = pq.read_table(pa.BufferReader(checkpoint), columns=["txn"]).column("txn").drop_null().to_pylist()
        except (ObjectStoreError, KeyError, pa.ArrowInvalid):
            return None
        for action in txn:
            found[action["appId"]] = action["version"]
        start += 1
    latest = latest_version(table)
    for version in range(start, (latest if latest is not None else -1) + 1):
        try:
            lines = store.get(f"{log_key}/{_commit_name(version)}").data.splitlines()
        except ObjectNotFoundError:
            return None
        for line in lines:
            if b'"txn"' in line:
                action = orjson.loads(line).get("txn")
                if action:
                    found[action["appId"]] = action["version"]
    return found


def added_files(table: TableLocation, version: int) -> list[str]:
    """The data files commit `version` added (paths relative to the table, unquoted); [] when its
    commit cannot be read."""
    try:
        lines = table.objects.get(f"{_log_key(table)}/{_commit_name(version)}").data.splitlines()
    except ObjectStoreError:
        return []
    adds = (orjson.loads(line).get("add") for line in lines if b'"add"' in line)
    return [unquote(add["path"]) for add in adds if add]


def is_latest_version(table: TableLocation, version: int) -> bool:
    """Whether `version` is the table's latest: its commit object is there and the next one is not
    (commits are numbered without gaps). Two HEADs (two stats on a local warehouse), where
    `latest_version` lists the whole log folder."""
    store, log_key = table.objects, _log_key(table)
    try:
        store.head(f"{log_key}/{_commit_name(version)}")
    except ObjectNotFoundError:
        return False
    try:
        store.head(f"{log_key}/{_commit_name(version + 1)}")
    except ObjectNotFoundError:
        return True
    return False


def latest_version(table: TableLocation) -> int | None:
    """The table's latest version from the names of its commit objects (one listing, no log replay),
    None without any: what tells a restart whether anything committed since an index snapshot was
    written."""
    names = [meta.key.rpartition("/")[2] for meta in table.objects.list(_log_key(table))]
    versions = [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()]
    return max(versions) if versions else None


def _log_key(table: TableLocation) -> str:
    return f"{table.key}/_delta_log"


def _commit_name(version: int) -> str:
    return f"{version:020d}.json"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
