"""Delta tables on the real S3 server, committed by conditional PUT: delta-rs's (the jobs' and Spark's
neighbour, `aws_conditional_put=etag` from `WarehouseLocation.storage_options`), whose concurrent
appenders from several threads lose no commit and duplicate no row with no lock service; and the
engine's own log (engine/store/delta_log.py), whose deposed writer loses its version's PUT."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.store.commits import TableCommitter, ensure_table
from engine.store.delta_actions import Txn
from engine.store.delta_log import CommitConflictError, DeltaLog
from engine.store.layout import Layout
from engine.store.leases import LeaseLostError
from tests.s3 import S3Server

APPENDERS = 3
APPENDS = 8


def _rows(writer: int, batch: int) -> pa.Table:
    ids = [writer * 10_000 + batch * 10 + i for i in range(3)]
    return pa.table({"id": pa.array(ids, pa.int64()), "writer": pa.array([writer] * 3, pa.int32())})


def test_delta_rs_round_trip_with_concurrent_appenders(s3_server: S3Server) -> None:
    location = s3_server.location()
    location.open()  # the bucket exists before delta-rs is asked to write
    uri = location.uri("default/streams/ORDERS")
    options = location.storage_options()
    assert uri.startswith("s3://") and options is not None and options["aws_conditional_put"] == "etag"

    write_deltalake(uri, _rows(99, 0), storage_options=options)
    assert DeltaTable(uri, storage_options=options).version() == 0
    barrier = threading.Barrier(APPENDERS)

    def append(writer: int) -> None:
        barrier.wait(timeout=30)
        for batch in range(APPENDS):
            write_deltalake(uri, _rows(writer, batch), mode="append", storage_options=options)

    with ThreadPoolExecutor(APPENDERS) as pool:
        list(pool.map(append, range(APPENDERS)))

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == APPENDERS * APPENDS, "every append is its own commit, none lost or merged"
    ids = table.to_pyarrow_table().column("id").to_pylist()
    expected = [99 * 10_000 + i for i in range(3)]
    expected += [w * 10_000 + b * 10 + i for w in range(APPENDERS) for b in range(APPENDS) for i in range(3)]
    assert sorted(ids) == sorted(expected), "every row exactly once"
    commits = [entry for entry in table.history() if entry.get("operation") == "WRITE"]
    assert len(commits) == APPENDERS * APPENDS + 1
    listed = {meta.key for meta in location.open().list("default/streams/ORDERS/_delta_log")}
    assert f"default/streams/ORDERS/_delta_log/{APPENDERS * APPENDS:020d}.json" in listed


def test_a_deposed_owners_table_commit_is_refused_by_its_fencing_transaction(s3_server: S3Server) -> None:
    """The fence of table commits: each flush commit carries the app transaction `<stream_id>.owner =
    fencing token`. A commit based on a state older than a newer owner's commit loses the conditional
    PUT of its version (CommitConflictError) and adds nothing; the next attempt reads the larger token
    before committing (LeaseLostError)."""
    location = s3_server.location()
    location.open()
    table = Layout(location).stream_table_location("FENCED")
    schema = pa.schema([("id", pa.int64()), ("writer", pa.int32())])
    ensure_table(table, schema, None, {})
    old_owner = DeltaLog(table)
    stale = old_owner.state()  # a writer paused between reading the log and committing

    TableCommitter(table, "stream").append(lambda _: _rows(2, 0), "sid", 1, fence=("sid.owner", 2))
    with pytest.raises(CommitConflictError):
        old_owner.commit(stale, [Txn("sid.owner", 1).action(0)], "WRITE")
    with pytest.raises(LeaseLostError, match="token 2"):
        TableCommitter(table, "stream").append(lambda _: _rows(1, 0), "sid", 2, fence=("sid.owner", 1))
    fresh = DeltaTable(table.uri, storage_options=table.storage_options)
    assert fresh.version() == 1 and fresh.transaction_version("sid.owner") == 2
    assert sorted(set(fresh.to_pyarrow_table().column("writer").to_pylist())) == [2]
