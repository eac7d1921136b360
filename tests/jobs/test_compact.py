"""Compaction: a thousand small commits read from a handful of files after; checkpoint and expired log
entries cleaned; every row still there for both readers and the engine; a rerun commits nothing."""

from __future__ import annotations

import os
import time

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream
from jobs import compact
from tests.gateway import Gateway
from tests.jobs.test_both_writers import assert_both_writers_protocol, spark_rows, table_rows
from tests.jobs.test_retention import run_job_under_load

pytestmark = pytest.mark.spark

DAY = 86400


def test_a_thousand_small_commits_read_from_a_handful_of_files_after(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "SMALL", "subjects": ["small.*"]})
    expected = []
    for i in range(1000):  # one engine flush, one delta-rs commit, one small file each
        subject = f"small.{i % 2}"
        data = f"m-{i}".encode()
        expected.append((js.publish_one(subject, data).seq, subject, data))
        js.flush()
    path = js.layout.stream_table("SMALL")
    assert len(DeltaTable(str(path)).file_uris()) == 1000
    # Make the first half of the log look 40 days old: past Delta's 30-day log retention.
    log_dir = path / "_delta_log"
    old = time.time() - 40 * DAY
    for entry in sorted(log_dir.glob("*.json"))[:500]:
        os.utime(entry, (old, old))

    figures = compact.run(spark, js.layout)

    files = DeltaTable(str(path)).file_uris()
    assert len(files) <= 4, f"{len(files)} files after compaction"  # one per partition here
    assert figures["errors"] == 0 and figures["files_removed"] >= 1000 and figures["checkpoints"] >= 1
    assert figures["log_entries_removed"] > 0 and not (log_dir / "00000000000000000001.json").exists()
    assert table_rows(path) == sorted(expected)
    assert spark_rows(spark, path) == sorted(expected)
    for table in (path, js.layout.tombstones_table):
        assert_both_writers_protocol(table)
    # The engine reads from the new files.
    for seq, subject, data in expected[::97]:
        msg = js.get_message("SMALL", seq)
        assert (msg.subject, msg.data) == (subject, data)
    version = DeltaTable(str(path)).version()
    again = compact.run(spark, js.layout)
    assert again["files_removed"] == 0 and again["errors"] == 0
    assert DeltaTable(str(path)).version() == version, "a rerun commits nothing"
    js.publish_one("small.0", b"after")  # the flusher appends on top of Spark's commits
    js.flush()
    assert len(DeltaTable(str(path)).to_pyarrow_table(columns=["seq"])) == 1001


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
