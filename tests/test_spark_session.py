from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from engine.store.flush_commits import ROW_GROUP_ROWS
from tests.conftest import restore_session, session_state

pytestmark = pytest.mark.spark


def test_spark_reads_a_table_written_by_delta_rs(spark: SparkSession, tmp_path: Path) -> None:
    table = pa.table(
        {
            "seq": pa.array([1, 2, 3], pa.int64()),
            "subject": pa.array(["orders.a", "orders.b", "orders.a"]),
            "data": pa.array([b"x", b"yy", b"zzz"]),
        }
    )
    write_deltalake(str(tmp_path / "t"), table, partition_by=["subject"])

    rows = spark.read.format("delta").load(str(tmp_path / "t")).collect()

    assert sorted((r.seq, r.subject, bytes(r.data)) for r in rows) == [
        (1, "orders.a", b"x"),
        (2, "orders.b", b"yy"),
        (3, "orders.a", b"zzz"),
    ]


def test_spark_stays_on_loopback(spark: SparkSession) -> None:
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1"
    assert conf.get("spark.driver.bindAddress") == "127.0.0.1"


def test_a_test_gets_the_shared_session_back_as_it_was(shared_spark: SparkSession) -> None:
    """What the `spark` fixture does after each test: settings back, added ones unset, views dropped."""
    before = session_state(shared_spark)
    assert before[0]["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS", "the factory sets it"
    shared_spark.conf.set("spark.sql.shuffle.partitions", "7")
    shared_spark.conf.set("spark.databricks.delta.optimize.maxFileSize", "1234")
    shared_spark.conf.set("spark.sql.parquet.outputTimestampType", "INT96")
    shared_spark.sql("CREATE OR REPLACE TEMPORARY VIEW leaked AS SELECT 1 AS one")
    assert session_state(shared_spark) != before
    restore_session(shared_spark, before)
    assert session_state(shared_spark) == before
    assert not shared_spark.catalog.tableExists("leaked")


def test_files_spark_writes_have_small_row_groups(spark: SparkSession, tmp_path: Path) -> None:
    """~24 MB of incompressible rows in one file: row groups of at most 1,024 rows and 8 MiB, not one of 128 MiB."""
    import pyarrow.parquet as pq

    rows = spark.range(0, 240_000, numPartitions=1).selectExpr("id AS seq", "unhex(sha2(cast(id AS STRING), 512)) AS a",
                                                               "unhex(sha2(cast(id + 1 AS STRING), 512)) AS b")
    rows.coalesce(1).write.format("delta").save(str(tmp_path / "t"))
    files = list((tmp_path / "t").glob("*.parquet"))
    assert len(files) == 1
    meta = pq.read_metadata(files[0])
    sizes = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    assert sum(sizes) > 20 * 1024 * 1024, sizes
    assert len(sizes) >= 2 and max(sizes) <= 12 * 1024 * 1024, sizes
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert max(rows) <= ROW_GROUP_ROWS, "rows per group as the engine's flusher writes them"
