"""The engine's own Delta log (engine/store/delta_log.py, delta_checkpoint.py) against delta-rs, the
independent reader and writer: what one commits or checkpoints the other reads the same, each follows
the other's commits, and what neither should do is refused."""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, Transaction, write_deltalake
from deltalake.table import TableFeatures

from engine.store import delta_log
from engine.store.commits import TableCommitter, ensure_table
from engine.store.delta_actions import DeltaProtocolError, Txn
from engine.store.delta_checkpoint import interval_ms
from engine.store.delta_log import CommitConflictError, DeltaLog, TableNotFoundError
from engine.store.layout import ACK_TABLE_PROPERTIES, PARTITION_COLUMN, STREAM_SCHEMA, Layout, TableLocation
from tests.delta_tables import open_table

_TS = STREAM_SCHEMA.field("ts").type


def _rows(first: int, n: int, partitions: tuple[str, ...] = ("orders", "$KV")) -> pa.Table:
    seqs = np.arange(first, first + n)
    return pa.table({
        "seq": pa.array(seqs, pa.int64()),
        "subject": [f"{partitions[i % len(partitions)]}.k{i}" for i in seqs],
        "ts": pa.array(1_795_000_000_000_000 + seqs * 1_000_001, pa.int64()).cast(_TS),
        "msg_id": pa.nulls(n, pa.string()),
        "headers": pa.nulls(n, STREAM_SCHEMA.field("headers").type),
        "data": [b"x" * 20] * n,
        "size": pa.array(np.full(n, 60), pa.int32()),
        PARTITION_COLUMN: [partitions[i % len(partitions)] for i in seqs],
    }, schema=STREAM_SCHEMA)


def _table(tmp_path: Path, interval: int = 100, retention: str | None = None) -> TableLocation:
    table = Layout(tmp_path / "wh").stream_table_location("S")
    properties = {"delta.dataSkippingStatsColumns": "seq,ts", "delta.checkpointInterval": str(interval)}
    if retention is not None:
        properties["delta.logRetentionDuration"] = retention
    ensure_table(table, STREAM_SCHEMA, [PARTITION_COLUMN], properties)
    return table


def _append(table: TableLocation, first: int, n: int) -> int:
    rows = _rows(first, n)
    return TableCommitter(table, "stream").append(lambda _: rows, "S", first + n - 1)


def _theirs(table: TableLocation) -> tuple[int, set[str], list[int]]:
    dt = open_table(table)
    seqs = sorted(dt.to_pyarrow_table(columns=["seq"]).column("seq").to_pylist())
    files = set(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())
    return dt.version(), files, seqs


def test_delta_rs_reads_what_the_engine_commits_and_checkpoints(tmp_path: Path) -> None:
    table = _table(tmp_path, interval=3)
    for i in range(7):
        _append(table, 1 + 100 * i, 100)
    log = delta_log.log_of(table)
    state = log.state()
    assert (tmp_path / "wh" / "default" / "streams" / "S" / "_delta_log" / "00000000000000000005.checkpoint.parquet").exists()
    version, files, seqs = _theirs(table)
    assert version == state.version == 7
    assert seqs == list(range(1, 701))
    assert {unquote(f) for f in files} == set(state.files)
    dt = open_table(table)
    assert dt.transaction_version("S") == state.transaction_version("S") == 700
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    theirs = {a["path"]: (a["size_bytes"], a[f"partition.{PARTITION_COLUMN}"], a["max.seq"]) for a in actions}
    ours = {p: (a.size, a.partition_values[PARTITION_COLUMN], a.bounds("seq")[1]) for p, a in state.files.items()}
    assert sorted(theirs.values()) == sorted(ours.values())
    assert DeltaLog(table).state().files.keys() == state.files.keys(), "a replay from the checkpoint agrees"


def test_the_engine_follows_what_delta_rs_commits_and_checkpoints(tmp_path: Path) -> None:
    table = _table(tmp_path)
    _append(table, 1, 50)
    log = delta_log.log_of(table)
    assert log.state().version == 1
    dt = open_table(table)
    write_deltalake(dt, _rows(51, 50), mode="append", partition_by=[PARTITION_COLUMN],
                    commit_properties=CommitProperties(app_transactions=[Transaction("S", 100)]))
    dt.optimize.compact()
    dt.create_checkpoint()
    state = log.state()
    assert state.version == dt.version()
    assert state.transaction_version("S") == 100
    assert set(state.files) == {unquote(p) for p in _theirs(table)[1]}
    fresh = DeltaLog(table).state()  # replayed from delta-rs's checkpoint
    assert (fresh.version, set(fresh.files), fresh.txns) == (state.version, set(state.files), state.txns)
    assert fresh.metadata["schemaString"] == state.metadata["schemaString"]


def test_old_log_entries_go_after_their_retention_and_readers_still_start_at_a_checkpoint(tmp_path: Path) -> None:
    table = _table(tmp_path, interval=2, retention="interval 1 seconds")
    _append(table, 1, 10)  # version 1: a checkpoint
    log_dir = tmp_path / "wh" / "default" / "streams" / "S" / "_delta_log"
    past = time.time() - 5
    for name in os.listdir(log_dir):
        os.utime(log_dir / name, (past, past))
    for i in range(1, 5):
        _append(table, 1 + 10 * i, 10)  # versions 2-5: a checkpoint at 3 and 5
    names = sorted(os.listdir(log_dir))
    assert "00000000000000000000.json" not in names and "00000000000000000001.checkpoint.parquet" in names
    assert _theirs(table)[2] == list(range(1, 51))
    assert DeltaLog(table).state().version == 5


def test_a_delete_rewrites_only_the_files_that_hold_doomed_rows(tmp_path: Path) -> None:
    table = Layout(tmp_path / "wh").stream_table_location("A")
    schema = pa.schema([("event_seq", pa.int64()), ("consumer_id", pa.string()), ("ts", _TS)])
    ensure_table(table, schema, None, ACK_TABLE_PROPERTIES)
    committer = TableCommitter(table, "acks")
    for first in (1, 101, 201):
        rows = pa.table({"event_seq": pa.array(range(first, first + 100), pa.int64()),
                         "consumer_id": ["a", "b"] * 50,
                         "ts": pa.array(np.full(100, 1_795_000_000_000_000), pa.int64()).cast(_TS)}, schema=schema)
        committer.append(lambda _, rows=rows: rows, "acks", first + 99)
    before = set(delta_log.log_of(table).state().files)

    deleted = committer.delete(
        lambda rows: pc.and_(pc.equal(rows.column("consumer_id"), "a"), pc.less(rows.column("event_seq"), 150)),
        lambda add: (add.bounds("event_seq")[0] or 0) < 150)

    assert deleted == 75
    after = set(delta_log.log_of(table).state().files)
    assert len(before - after) == 2 and len(after - before) == 2, "the third file is left as it was"
    left = open_table(table).to_pyarrow_table().sort_by("event_seq")
    pairs = list(zip(left.column("event_seq").to_pylist(), left.column("consumer_id").to_pylist(), strict=True))
    assert len(pairs) == 225 and not [p for p in pairs if p[1] == "a" and p[0] < 150]


def test_a_taken_version_a_missing_table_and_an_unknown_protocol_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        DeltaLog(Layout(tmp_path / "none").stream_table_location("S")).state()
    table = _table(tmp_path)
    log = DeltaLog(table)
    stale = log.state()
    write_deltalake(open_table(table), _rows(1, 5), mode="append", partition_by=[PARTITION_COLUMN])
    with pytest.raises(CommitConflictError):  # a writer that decided on version 0, not seeing version 1
        log.commit(stale, [Txn("S", 1).action(0)], "WRITE")
    assert open_table(table).version() == 1 and open_table(table).transaction_version("S") is None

    dt = open_table(table)
    dt.alter.add_feature(TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    with pytest.raises(DeltaProtocolError):
        TableCommitter(table, "stream").append(lambda _: _rows(6, 5), "S", 10)
    assert dt.version() == open_table(table).version(), "nothing was committed"


def test_intervals_read_as_delta_writes_them() -> None:
    assert interval_ms("interval 30 days", "interval 1 week") == 30 * 86_400_000
    assert interval_ms("interval 1 week", "interval 1 day") == 604_800_000
    assert interval_ms("INTERVAL 2 hours", "interval 1 day") == 7_200_000
    assert interval_ms("soon", "interval 1 day") == 86_400_000


@pytest.mark.parametrize("retention", [None, "interval 0 seconds"])
def test_a_checkpoint_carries_the_removed_files_until_their_tombstones_expire(
    tmp_path: Path, retention: str | None,
) -> None:
    table = Layout(tmp_path / "wh").stream_table_location("A")
    schema = pa.schema([("event_seq", pa.int64())])
    properties = {"delta.checkpointInterval": "3", "delta.dataSkippingStatsColumns": "event_seq"}
    if retention is not None:
        properties["delta.deletedFileRetentionDuration"] = retention
    ensure_table(table, schema, None, properties)
    committer = TableCommitter(table, "acks")
    committer.append(lambda _: pa.table({"event_seq": [1, 2, 3]}, schema=schema), "acks", 3)
    time.sleep(0.01)
    assert committer.delete(lambda rows: pc.less(rows.column("event_seq"), 2), lambda add: True) == 1  # version 2
    log = delta_log.log_of(table)
    checkpoint = pq.read_table(tmp_path / "wh" / "default" / "streams" / "A" / "_delta_log"
                               / "00000000000000000002.checkpoint.parquet")
    removes = checkpoint.column("remove").drop_null().to_pylist()
    assert len(removes) == (1 if retention is None else 0)
    assert len(log.state().removed) == len(removes), "expired tombstones leave the memory too"
    assert open_table(table).to_pyarrow_table().column("event_seq").to_pylist() == [2, 3]
