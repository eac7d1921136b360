"""Spark reads a delta-rs table on the real S3 server through S3A (`s3a://`), deletes from it, and
delta-rs reads Spark's commit back (`s3://`): both writers on one table in a bucket.

Spark runs in a subprocess: S3A's jars must be on the JVM's classpath at start, and the session
shared by the other tests is started without them (the AWS SDK bundle is ~690 MB).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.s3 import S3Server

ROOT = Path(__file__).resolve().parents[2]
KEY = "default/streams/ORDERS"


@pytest.mark.spark
def test_spark_reads_a_delta_rs_table_on_s3_and_delta_rs_reads_sparks_delete(
    s3a_available: None, s3_server: S3Server
) -> None:
    location = s3_server.location()
    location.open()
    uri, options = location.uri(KEY), location.storage_options()
    for batch in range(3):
        ids = list(range(batch * 10, batch * 10 + 10))
        write_deltalake(uri, pa.table({"id": pa.array(ids, pa.int64()), "batch": pa.array([batch] * 10, pa.int32())}),
                        mode="append", storage_options=options)
    assert DeltaTable(uri, storage_options=options).version() == 2

    result = subprocess.run(
        [sys.executable, "-m", "tests.jobs.spark_s3_worker", location.uri(), KEY, "5"],
        cwd=ROOT, env={**os.environ, **s3_server.env, "PYTHONPATH": str(ROOT), "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    spark = json.loads(result.stdout.strip().splitlines()[-1])
    assert spark["path"].startswith("s3a://") and spark["path"].endswith(KEY)
    assert spark["ids"] == list(range(30)), "Spark read every row delta-rs wrote"
    assert spark["version"] == 3

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 3, "delta-rs sees Spark's commit"
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(5, 30))
    write_deltalake(uri, pa.table({"id": pa.array([100], pa.int64()), "batch": pa.array([9], pa.int32())}),
                    mode="append", storage_options=options)
    again = DeltaTable(uri, storage_options=options)
    assert again.version() == 4
    assert sorted(again.to_pyarrow_table().column("id").to_pylist()) == [*range(5, 30), 100]
