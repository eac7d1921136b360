"""The delta-rs → Spark path: what the engine flushed, Spark reads, byte for byte."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from engine import JetStream

pytestmark = pytest.mark.spark


def test_spark_reads_every_acknowledged_message_after_a_flush(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "ORDERS", "subjects": ["orders.>"]})
    sent = []
    for i in range(30):
        headers = {"Nats-Msg-Id": [f"m{i}"], "Trace": ["a", "b"]} if i % 3 == 0 else None
        ack = js.publish_one(f"orders.{i % 4}.x", f"payload-{i}".encode(), headers)
        sent.append((ack.seq, f"orders.{i % 4}.x", f"payload-{i}".encode(), headers))
    assert js.flush() == 1

    path = str(js.layout.stream_table("ORDERS"))
    rows = spark.read.format("delta").load(path).collect()
    got = sorted((r.seq, r.subject, bytes(r.data), dict(r.headers) if r.headers else None) for r in rows)
    assert got == sorted(sent)
    partitions = {r.subject_partition for r in rows}
    assert partitions == {"orders"}  # a new stream is partitioned by its subjects' first token
    sizes = {r.seq: r.size for r in rows}
    assert sizes[2] == len("orders.1.x") + len(b"payload-1") + 16


def test_table_stays_within_what_both_writers_support(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "P", "subjects": ["p"]})
    js.publish_one("p", b"x")
    js.flush()
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{js.layout.stream_table('P')}`").collect()[0]
    assert detail.minReaderVersion == 1 and detail.minWriterVersion <= 2
    assert set(detail.tableFeatures or []) <= {"appendOnly", "invariants"}, "legacy writer-v2 features only"
    assert detail.partitionColumns == ["subject_partition"]
    assert detail.properties["delta.dataSkippingStatsColumns"] == "seq,ts"
