"""Compaction: hundreds of small commits read from a handful of files after; checkpoint and expired log
entries cleaned; every row still there for both readers and the engine; a rerun commits nothing."""

from __future__ import annotations

import os
import time

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream, ManualClock
from engine.store.flush_commits import ROW_GROUP_ROWS
from jobs import compact
from tests.conftest import reopen
from tests.gateway import Gateway
from tests.jobs.test_both_writers import assert_both_writers_protocol, spark_rows, table_rows
from tests.jobs.test_retention import run_job_under_load

pytestmark = pytest.mark.spark

DAY = 86400


COMMITS = 300  # enough for several checkpoints and expired log entries; each costs an engine flush


def test_hundreds_of_small_commits_read_from_a_handful_of_files_after(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "SMALL", "subjects": ["small.*"]})
    expected = []
    for i in range(COMMITS):  # one engine flush, one delta-rs commit, one small file each
        subject = f"small.{i % 2}"
        data = f"m-{i}".encode()
        expected.append((js.publish_one(subject, data).seq, subject, data))
        js.flush()
    path = js.layout.stream_table("SMALL")
    assert len(DeltaTable(str(path)).file_uris()) == COMMITS
    # Make the first half of the log look 40 days old: past Delta's 30-day log retention.
    log_dir = path / "_delta_log"
    old = time.time() - 40 * DAY
    for entry in sorted(log_dir.glob("*.json"))[:COMMITS // 2]:
        os.utime(entry, (old, old))

    figures = compact.run(spark, js.layout)

    files = DeltaTable(str(path)).file_uris()
    assert len(files) <= 4, f"{len(files)} files after compaction"  # one per partition here
    assert figures["errors"] == 0 and figures["files_removed"] >= COMMITS and figures["checkpoints"] >= 1
    assert figures["log_entries_removed"] > 0 and not (log_dir / "00000000000000000001.json").exists()
    assert table_rows(path) == sorted(expected)
    assert spark_rows(spark, path) == sorted(expected)
    for table in (path, js.layout.tombstones_table):
        assert_both_writers_protocol(table)
    # The engine reads from the new files.
    for seq, subject, data in expected[::29]:
        msg = js.get_message("SMALL", seq)
        assert (msg.subject, msg.data) == (subject, data)
    version = DeltaTable(str(path)).version()
    again = compact.run(spark, js.layout)
    assert again["files_removed"] == 0 and again["errors"] == 0
    assert DeltaTable(str(path)).version() == version, "a rerun commits nothing"
    js.publish_one("small.0", b"after")  # the flusher appends on top of Spark's commits
    js.flush()
    assert len(DeltaTable(str(path)).to_pyarrow_table(columns=["seq"])) == COMMITS + 1


def test_compacted_files_keep_row_groups_a_point_read_decodes_cheaply(js: JetStream, spark: SparkSession,
                                                                      clock: ManualClock) -> None:
    """Compaction writes row groups like the flusher's: at most ROW_GROUP_ROWS rows, no statistics on
    payloads; a point read after it decodes only such small groups, not an 8 MiB one."""
    js.add_stream({"name": "PTS", "subjects": ["pts.*"]})
    for flush in range(12):  # 12 small files of 500 rows in one partition
        for i in range(500):
            js.publish_one(f"pts.{i % 7}", f"{flush}-{i}".encode() * 10)
        js.flush()
    path = js.layout.stream_table("PTS")

    figures = compact.run(spark, js.layout)

    assert figures["errors"] == 0 and figures["files_removed"] == 12
    files = DeltaTable(str(path)).file_uris()
    assert len(files) == 1
    meta = pq.read_metadata(files[0])
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    assert sum(g.num_rows for g in groups) == 6000 and len(groups) >= 6000 // ROW_GROUP_ROWS
    assert max(g.num_rows for g in groups) <= ROW_GROUP_ROWS, [g.num_rows for g in groups]
    names = [groups[0].column(i).path_in_schema for i in range(groups[0].num_columns)]
    assert all(g.column(names.index("data")).statistics is None for g in groups), "no payload in the footer"
    assert all(g.column(names.index("seq")).statistics.has_min_max for g in groups), "groups found by `seq`"
    assert sorted(pq.read_table(files[0], columns=["seq"]).column("seq").to_pylist()) == list(range(1, 6001))

    js = reopen(js, clock)  # a fresh engine: its reads come from the compacted file
    try:
        msg = js.get_message("PTS", 3777)
        assert (msg.subject, msg.data) == (f"pts.{3776 % 500 % 7}", f"{3776 // 500}-{3776 % 500}".encode() * 10)
        windows = js.stream("PTS").store.reads._row_groups.windows()
        assert windows and all(w.rows <= ROW_GROUP_ROWS for w in windows), [w.rows for w in windows]
    finally:
        js.close()


def test_compacted_files_hold_row_groups_of_increasing_disjoint_sequences(js: JetStream, spark: SparkSession,
                                                                          clock: ManualClock) -> None:
    """Compaction sorts each file it writes by `seq`: Delta's OPTIMIZE would concatenate a bin's files
    largest first, leaving groups whose `seq` statistics overlap (a point read decoding several). Here
    the flushes are of mixed sizes, so largest first is not sequence order."""
    js.add_stream({"name": "ORD", "subjects": ["ord.*"]})
    expected = {}
    for flush, count in enumerate((300, 2500, 700, 1800, 1100, 2200, 400)):
        for i in range(count):
            subject, data = f"ord.{i % 5}", f"{flush}-{i}".encode()
            expected[js.publish_one(subject, data).seq] = (subject, data)
        js.flush()
    path = js.layout.stream_table("ORD")

    figures = compact.run(spark, js.layout)

    assert figures["errors"] == 0 and figures["files_removed"] == 7 and figures["files_added"] == 1
    assert DeltaTable(str(path)).history(1)[0]["operation"] == "OPTIMIZE"
    files = DeltaTable(str(path)).file_uris()
    assert len(files) == 1
    meta = pq.read_metadata(files[0])
    ranges = [(st.min, st.max) for st in (meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups))]
    assert all(meta.row_group(i).num_rows <= ROW_GROUP_ROWS for i in range(meta.num_row_groups))
    assert all(lo <= hi for lo, hi in ranges) and all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), ranges
    assert pq.read_table(files[0], columns=["seq"]).column("seq").to_pylist() == sorted(expected)
    js = reopen(js, clock)  # reads from the compacted file: one row group each
    try:
        reads = js.stream("ORD").store.reads
        cache = reads._row_groups
        for seq in list(expected)[::211]:
            reads.forget()  # the decoded groups and the last point read's group: each read decodes afresh
            msg = js.get_message("ORD", seq)
            assert (msg.subject, msg.data) == expected[seq]
            assert len(cache.windows()) == 1, f"a read of {seq} decoded {len(cache.windows())} row groups"
    finally:
        js.close()


def test_compact_under_a_publish_and_ack_load(gateway: Gateway, spark: SparkSession) -> None:
    out = run_job_under_load(
        gateway, spark, lambda s, layout, times: compact.run(s, layout, lease_times=times)
    )
    figures = out["figures"]
    assert figures["errors"] == 0 and figures["files_removed"] > figures["files_added"] > 0
    assert_both_writers_protocol(out["path"])
    print(
        f"\ncompact under load: {figures} job {out['job_seconds']:.1f}s, {out['published']} publishes, "
        f"{out['during_lease']} during the lease, max latency {max(out['latencies']):.3f}s, "
        f"{out['consumer_acks']} consumer acks"
    )
