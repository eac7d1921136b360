"""Appending to a Delta table exactly once: the one commit path of the flusher (streams, tombstones, acks).

Each commit carries a Delta app transaction (`txn`: app id, version = the last sequence or LSN it
holds). Before writing, the table's transaction version is read: rows at or below it are already in
the table (a commit that landed although the call that made it raised) and are not written again.
After any exception the version is read again: a commit that landed is a commit, whatever the error
said. The checkpoint every `delta.checkpointInterval` versions is a step of its own, whose failure is
logged and leaves the commit standing. Under `--sync always` a commit is made durable (its Parquet
files, their folders, the commit JSON, `_delta_log/` and the table folder are fsynced) before it
counts, so the log segments it replaces can be deleted; on S3 a commit is durable when its
conditional PUT returns. The log itself is delta_log.py's. Counterpart: the exactly-once `txn`
protocol of Delta Lake (delta.md); nats-server has none (it owns its files).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.store import failpoints
from engine.store.data_files import FileEncoding, write_data_files
from engine.store.delta_actions import AddFile, LogState, Txn, now_ms
from engine.store.delta_log import DeltaLog, TableNotFoundError, commit_name, log_key, log_of
from engine.store.layout import TableLocation
from engine.store.leases import LeaseLostError
from engine.store.objectstore import ObjectNotFoundError

log = logging.getLogger(__name__)

_FIND_BACK = 200  # commits searched backwards for the one holding a transaction version
RowFilter = Callable[[pa.Table], pa.Array]  # the rows of a file to delete (a boolean mask)


def ensure_table(
    table: TableLocation, schema: pa.Schema, partition_by: list[str] | None, properties: dict[str, str],
    sync: bool = False,
) -> None:
    """Creates the table if it is missing (its first commit fsynced under `sync` on local disk)."""
    path = table.local_path
    if path is not None and (path / "_delta_log").exists():
        return
    if path is None and latest_version(table) is not None:
        return
    log_of(table).create(schema, partition_by, properties)
    if sync and path is not None:
        _fsync(path / "_delta_log" / commit_name(0))
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
        self.added: list[str] = []  # the data files of the last commit `append` made (relative, unquoted)

    @property
    def log(self) -> DeltaLog:
        return log_of(self.table)

    def append(
        self,
        rows_after: Callable[[int], pa.Table],
        app_id: str,
        version: int,
        extra: list[Txn] | None = None,
        encoding: FileEncoding = FileEncoding(),
        fence: tuple[str, int] | None = None,
    ) -> int:
        """Commits `rows_after(v)` (the rows above transaction version v, the table's now) with the
        transaction (`app_id`, `version`) unless the table holds it already; returns the table version
        holding it. Raises when it is not committed (or, under sync, not durable). The rows' files are
        written here (data_files.py, encoded as `encoding` says), then committed (delta_log.py).

        `fence` (app id, token): the writer's lease token, recorded as a transaction of its own; a
        table holding a larger token was committed by a newer owner, and the commit is refused
        (LeaseLostError). The caller holds the table's commit lease, so the check and the commit are
        one step for every JetLake writer."""
        self.added = []
        state = self.log.state()
        if fence is not None:
            newer = state.transaction_version(fence[0])
            if newer > fence[1]:
                raise LeaseLostError(f"{self.path} was committed under token {newer}, this writer has {fence[1]}")
            extra = [*(extra or []), Txn(fence[0], fence[1])]
        done = state.transaction_version(app_id)
        if done >= version:
            log.info("%s: transaction %s/%d is already in %s; not written again", self.step, app_id, version, self.path)
            return self._made_durable(app_id, done, state.version)
        if done:
            self._made_durable(app_id, done, state.version)
        rows = rows_after(done)
        try:
            action = failpoints.hit(f"{self.step}.commit") if failpoints.ARMED else None
            committed = self._write(state, rows, encoding, [Txn(app_id, version), *(extra or [])])
            failpoints.after(f"{self.step}.commit", action)
        except Exception as exc:
            committed = self._landed(app_id, version, exc)
        self._checkpoint(committed)
        if self.sync:
            self._sync(app_id, version, committed)
        return committed

    def _write(self, state: LogState, rows: pa.Table, encoding: FileEncoding, transactions: list[Txn]) -> int:
        """Writes the rows' files, then commits them with the transactions in one Delta commit; returns
        its version. A file write that fails removes what it wrote; once the commit was tried, the files
        stay (it may have landed: `_landed` decides, and an orphan is vacuum's)."""
        adds = write_data_files(self.table, rows, state.partition_columns, encoding, state.stats_columns())
        self.added = [add.path for add in adds]
        now = now_ms()
        return self.log.commit(state, [*(t.action(now) for t in transactions), *(a.action() for a in adds)],
                               "WRITE", {"mode": "Append"})

    def _landed(self, app_id: str, version: int, exc: Exception) -> int:
        """After a write raised: the table's version if the commit landed anyway; else the error goes on."""
        try:
            state = self.log.state()
            landed = state.transaction_version(app_id) >= version
        except Exception:  # noqa: BLE001 - the table cannot even be read: the write's own error says more
            landed = False
        if not landed:
            raise exc
        log.warning("%s: commit of %s/%d to %s raised (%s) after it landed: counted as committed",
                    self.step, app_id, version, self.path, exc)
        return state.version

    def _checkpoint(self, version: int) -> None:
        """A checkpoint every `delta.checkpointInterval` versions, as delta-rs would; a failure is logged only."""
        try:
            interval = self.log.state(refresh=False).checkpoint_interval()
            if interval <= 0 or (version + 1) % interval:
                return
            action = failpoints.hit(f"{self.step}.checkpoint") if failpoints.ARMED else None
            self.log.checkpoint()
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
            state = self.log.state()
        except TableNotFoundError:
            return
        txn = state.transaction_version(app_id)
        if txn:
            self._made_durable(app_id, txn, state.version)

    def delete(self, doomed: RowFilter, may_hold: Callable[[AddFile], bool]) -> int:
        """Deletes rows (the ack table's folded events) of an unpartitioned table: each file that
        `may_hold` some (by its statistics) is read, and one where `doomed` marks rows is replaced by a
        file of the others, all in one commit. The `<step>.fold` failpoint. Returns the rows deleted."""
        action = failpoints.hit(f"{self.step}.fold") if failpoints.ARMED else None
        state = self.log.state()
        if state.partition_columns:
            raise ValueError(f"{self.path}: rows are deleted here from unpartitioned tables only")
        actions: list[dict[str, object]] = []
        deleted = 0
        now = now_ms()
        for add in list(state.files.values()):
            if not may_hold(add):
                continue
            rows = pq.read_table(self.table.file(add.path), filesystem=self.table.filesystem)
            mask = pc.fill_null(doomed(rows), False)
            gone = pc.sum(mask).as_py() or 0
            if not gone:
                continue
            deleted += gone
            actions.append(add.remove_action(now))
            kept = rows.filter(pc.invert(mask))
            actions += [a.action() for a in write_data_files(self.table, kept, [], FileEncoding(), state.stats_columns())]
        version = self.log.commit(state, actions, "DELETE", {}) if actions else None
        failpoints.after(f"{self.step}.fold", action)
        if version is not None:
            self._checkpoint(version)
        return deleted


def find_transaction(path: Path, app_id: str, txn: int, latest: int) -> int | None:
    """The table version whose commit carries transaction (`app_id`, `txn`), searched back from `latest`."""
    for version in range(latest, max(latest - _FIND_BACK, -1), -1):
        try:
            lines = (path / "_delta_log" / commit_name(version)).read_bytes().splitlines()
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
    commit = path / "_delta_log" / commit_name(version)
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


def is_latest_version(table: TableLocation, version: int) -> bool:
    """Whether `version` is the table's latest: its commit object is there and the next one is not
    (commits are numbered without gaps). Two HEADs (two stats on a local warehouse), where
    `latest_version` lists the whole log folder."""
    store, key = table.objects, log_key(table)
    try:
        store.head(f"{key}/{commit_name(version)}")
    except ObjectNotFoundError:
        return False
    try:
        store.head(f"{key}/{commit_name(version + 1)}")
    except ObjectNotFoundError:
        return True
    return False


def latest_version(table: TableLocation) -> int | None:
    """The table's latest version from the names of its commit objects (one listing, no log replay),
    None without any: what tells a restart whether anything committed since an index snapshot was
    written."""
    names = [meta.key.rpartition("/")[2] for meta in table.objects.list(log_key(table))]
    versions = [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()]
    return max(versions) if versions else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
