from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

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
