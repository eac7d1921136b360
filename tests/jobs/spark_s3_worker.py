"""Spark's side of tests/jobs/test_spark_s3.py, in its own process (its session has S3A's jars):

    python -m tests.jobs.spark_s3_worker WAREHOUSE_URI TABLE_KEY DELETE_BELOW

Reads the Delta table through S3A, deletes the rows with `id < DELETE_BELOW`, and prints one JSON
line: the ids read before the delete and the table's version after it.
"""

from __future__ import annotations

import json
import sys

from engine.store.objectstore import WarehouseLocation
from jobs.spark import spark_session


def main(warehouse: str, key: str, delete_below: int) -> None:
    path = WarehouseLocation.parse(warehouse).spark_uri(key)
    spark = spark_session("local[1]", "jetlake-s3-test", warehouse=warehouse)
    try:
        ids = sorted(row.id for row in spark.read.format("delta").load(path).select("id").collect())
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id < {int(delete_below)}")
        version = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0].version
        print(json.dumps({"path": path, "ids": ids, "version": version}))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
