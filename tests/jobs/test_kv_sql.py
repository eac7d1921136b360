"""KV buckets in Spark: the flushed table of `KV_<bucket>` reads as a Delta table, the view
`kv_<bucket>_values` holds the latest value per key without deleted or purged keys, exactly what the
engine's get answers, and the table is partitioned per bucket, not per key."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine import JetStream
from jobs.sql import register_views

pytestmark = pytest.mark.spark


def _engine_values(js: JetStream, bucket: str) -> list[tuple[str, int, bytes]]:
    out = []
    for key in js.kv.keys(bucket):
        entry = js.kv.get(bucket, key)
        out.append((key, entry.revision, entry.value))
    return sorted(out)


def test_kv_table_and_values_view(js: JetStream, warehouse: Path, spark: SparkSession) -> None:
    kv = js.kv
    kv.create({"bucket": "cfg", "history": 3})
    kv.create({"bucket": "one"})
    kv.put("cfg", "app.name", b"jetlake")          # 1
    kv.put("cfg", "app.port", b"4280")             # 2
    kv.put("cfg", "app.name", b"JetLake")          # 3
    kv.put("cfg", "gone", b"soon deleted")         # 4
    kv.delete("cfg", "gone")                       # 5
    kv.put("cfg", "purged", b"p1")                 # 6
    kv.put("cfg", "purged", b"p2")                 # 7
    kv.delete("cfg", "purged", purge=True)         # 8: drops 6 and 7 before they reach the table
    kv.put("cfg", "back", b"b1")                   # 9
    kv.delete("cfg", "back")                       # 10
    kv.put("cfg", "back", b"b2", create=True)      # 11
    kv.put("cfg", "bin", b"\x00\xff")              # 12
    for i in range(3):
        kv.put("one", "k", str(i).encode())        # history 1: only the last stays
    assert js.flush() == 2
    # After the flush: removals of flushed entries are tombstones the view must apply.
    kv.put("cfg", "app.name", b"v3")               # 13
    kv.put("cfg", "app.name", b"v4")               # 14: history 3 drops revision 1
    kv.put("cfg", "app.port", b"4281")             # 15
    kv.delete("cfg", "bin", purge=True)            # 16: drops 12
    kv.put("one", "k", b"last")                    # 4 of KV_one: drops 3
    assert js.flush() == 2

    views = register_views(spark, warehouse)
    assert {"KV_cfg", "KV_one", "kv_cfg_values", "kv_one_values"} <= set(views)

    raw = spark.read.format("delta").load(str(js.layout.stream_table("KV_cfg"))).select("seq", "subject_partition").collect()
    assert sorted(r.seq for r in raw) == [1, 2, 3, 4, 5, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert {r.subject_partition for r in raw} == {"$KV.cfg"}

    rows = spark.sql(
        "SELECT bucket, key, revision, created, value, text FROM kv_cfg_values "
        "UNION ALL SELECT bucket, key, revision, created, value, text FROM kv_one_values ORDER BY bucket, key"
    ).collect()
    assert [(r.bucket, r.key, r.revision, bytes(r.value), r.text) for r in rows] == [
        ("cfg", "app.name", 14, b"v4", "v4"), ("cfg", "app.port", 15, b"4281", "4281"), ("cfg", "back", 11, b"b2", "b2"),
        ("one", "k", 4, b"last", "last"),
    ]
    assert [(r.key, r.revision, bytes(r.value)) for r in rows if r.bucket == "cfg"] == _engine_values(js, "cfg")
    assert all(r.created is not None for r in rows)


def test_a_bucket_of_1000_keys_is_one_partition(js: JetStream, warehouse: Path, spark: SparkSession) -> None:
    js.kv.create({"bucket": "big"})
    for i in range(1000):
        js.kv.put("big", f"user.{i}.profile", f"v{i}".encode())
    js.kv.delete("big", "user.7.profile")
    js.flush()
    table = js.layout.stream_table("KV_big")
    partitions = [p.name for p in table.iterdir() if p.is_dir() and not p.name.startswith("_")]
    assert len(partitions) == 1, partitions
    assert partitions[0].startswith("subject_partition=")
    register_views(spark, warehouse)
    row = spark.sql(
        "SELECT count(*) AS n, count(DISTINCT key) AS k, max(CASE WHEN key = 'user.500.profile' THEN text END) AS v, "
        "max(CASE WHEN key = 'user.500.profile' THEN revision END) AS r, "
        "count(CASE WHEN key = 'user.7.profile' THEN 1 END) AS deleted FROM kv_big_values"
    ).collect()[0]
    assert (row.n, row.k, row.v, row.r, row.deleted) == (999, 999, "v500", 501, 0)
