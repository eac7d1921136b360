"""delta-rs writes and reads Delta tables on the real S3 server, committing by conditional PUT
(`aws_conditional_put=etag`, from `WarehouseLocation.storage_options`): concurrent appenders from
several threads lose no commit and duplicate no row, with no lock service."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError

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
    """The fence of table commits the integration builds on: each flush commit carries the app
    transaction `<stream_id>.owner = fencing token`. A commit based on a snapshot older than a newer
    owner's commit of that app id is refused by delta-rs's conflict check (ConcurrentTransaction);
    one based on the new snapshot sees the larger token before committing."""
    location = s3_server.location()
    location.open()
    uri, options = location.uri("default/streams/FENCED"), location.storage_options()
    write_deltalake(uri, _rows(0, 0), storage_options=options)
    old_owner = DeltaTable(uri, storage_options=options)
    new_owner = DeltaTable(uri, storage_options=options)

    write_deltalake(new_owner, _rows(2, 0), mode="append", storage_options=options,
                    commit_properties=CommitProperties(app_transactions=[Transaction("sid.owner", 2)]))
    with pytest.raises(CommitFailedError):
        write_deltalake(old_owner, _rows(1, 0), mode="append", storage_options=options,
                        commit_properties=CommitProperties(app_transactions=[Transaction("sid.owner", 1)]))
    fresh = DeltaTable(uri, storage_options=options)
    assert fresh.transaction_version("sid.owner") == 2, "a reloaded stale owner sees it was deposed"
    writers = sorted(set(fresh.to_pyarrow_table().column("writer").to_pylist()))
    assert writers == [0, 2], "the deposed owner's rows are not in the table"
