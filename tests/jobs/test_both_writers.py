"""Both writers on one table: delta-rs appends (the engine's flusher), Spark deletes and compacts under
the commit lease while publishes keep arriving, delta-rs appends again; both readers agree, and the
table stays within the protocol features both writers support."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream
from jobs import compact, retention

pytestmark = pytest.mark.spark

# Writer features delta-rs 1.6 can write; a table with any other feature would stop the engine's flusher.
DELTA_RS_WRITER_FEATURES = {"appendOnly", "invariants", "checkConstraints", "generatedColumns", "changeDataFeed", "timestampNtz"}
FORBIDDEN_FEATURES = {"deletionVectors", "clustering", "domainMetadata", "columnMapping", "rowTracking", "v2Checkpoint"}


def assert_both_writers_protocol(path: Path | str) -> None:
    """The table's protocol and features stay within what delta-rs 1.6 and Spark both write."""
    dt = DeltaTable(str(path))
    protocol = dt.protocol()
    assert protocol.min_reader_version == 1, protocol
    writer_features = set(protocol.writer_features or [])
    if protocol.min_writer_version > 2:
        assert protocol.min_writer_version == 7 and writer_features <= DELTA_RS_WRITER_FEATURES, protocol
    assert not (writer_features | set(protocol.reader_features or [])) & FORBIDDEN_FEATURES, protocol
    config = dt.metadata().configuration
    assert config.get("delta.enableDeletionVectors", "false") == "false", config
    assert not any(k.startswith("delta.columnMapping") and v != "none" for k, v in config.items()), config
    actions = pa.table(dt.get_add_actions(flatten=True))
    names = actions.schema.names
    for column in names:
        if column.startswith("deletionVector"):
            assert all(v is None for v in actions.column(column).to_pylist()), "a file carries a deletion vector"


def table_rows(path: Path) -> list[tuple[int, str, bytes]]:
    table = DeltaTable(str(path)).to_pyarrow_table(columns=["seq", "subject", "data"])
    return sorted(zip(table.column("seq").to_pylist(), table.column("subject").to_pylist(), table.column("data").to_pylist(), strict=True))


def spark_rows(spark: SparkSession, path: Path) -> list[tuple[int, str, bytes]]:
    rows = spark.read.format("delta").load(str(path)).select("seq", "subject", "data").collect()
    return sorted((r.seq, r.subject, bytes(r.data)) for r in rows)


class Load:
    """Publishes and flushes from threads, as the gateway would, while a job runs in this process."""

    def __init__(self, js: JetStream, subjects: list[str]) -> None:
        self.js = js
        self.subjects = subjects
        self.stop = threading.Event()
        self.sent: dict[int, tuple[str, bytes]] = {}
        self.latencies: list[float] = []
        self.flush_waits: list[float] = []
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._publish), threading.Thread(target=self._flush)]

    def _publish(self) -> None:
        i = 0
        try:
            while not self.stop.is_set() and i < 400:
                subject = self.subjects[i % len(self.subjects)]
                data = f"live-{i}".encode()
                t0 = time.monotonic()
                ack = self.js.publish_one(subject, data)
                self.latencies.append(time.monotonic() - t0)
                self.sent[ack.seq] = (subject, data)
                i += 1
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def _flush(self) -> None:
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                self.js.flush()
                self.flush_waits.append(time.monotonic() - t0)
                time.sleep(0.05)
        except BaseException as exc:  # noqa: BLE001
            self.errors.append(exc)

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=30)
        assert not self.errors, self.errors


def test_delta_rs_appends_spark_deletes_and_compacts_both_read_the_same(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "BOTH", "subjects": ["both.>"]})
    subjects = ["both.a", "both.b", "both.c"]
    expected: dict[int, tuple[str, bytes]] = {}
    for round_ in range(3):  # three delta-rs commits
        for i in range(10):
            subject = subjects[i % 3]
            data = f"m{round_}-{i}".encode()
            expected[js.publish_one(subject, data).seq] = (subject, data)
        js.flush()
    js.delete_message("BOTH", 2, erase=False)
    js.delete_message("BOTH", 5, erase=False)
    purged = [s for s, (subj, _) in expected.items() if subj == "both.b"]
    assert js.purge("BOTH", "both.b") == len(purged) - 2  # 2 and 5 are on both.b
    for seq in [2, 5, *purged]:
        expected.pop(seq, None)
    js.flush()
    path = js.layout.stream_table("BOTH")
    assert_both_writers_protocol(path)

    # Spark deletes while publishes keep arriving and the flusher waits for the lease.
    with Load(js, ["both.a", "both.c"]) as load:
        figures = retention.run(spark, js.layout)
    assert figures["rows_deleted"] == len(purged) and figures["errors"] == 0
    assert load.latencies, "publishes succeeded while the job ran (their latency: bench/jobs.py)"
    assert_both_writers_protocol(path)
    assert_both_writers_protocol(js.layout.tombstones_table)
    expected.update(load.sent)
    js.flush()  # delta-rs appends after Spark's DELETE

    with Load(js, ["both.a", "both.c"]) as load:
        figures = compact.run(spark, js.layout)
    assert figures["errors"] == 0 and figures["files_removed"] > 0
    assert load.latencies
    for table in (path, js.layout.tombstones_table):
        assert_both_writers_protocol(table)
    expected.update(load.sent)
    js.publish_one("both.a", b"after-compact")
    expected[js.stream("BOTH").index.last_seq] = ("both.a", b"after-compact")
    js.flush()  # and again after Spark's OPTIMIZE and checkpoint

    want = sorted((seq, subj, data) for seq, (subj, data) in expected.items())
    assert table_rows(path) == want
    assert spark_rows(spark, path) == want
    assert_both_writers_protocol(path)
    # The engine still serves every live message (from files Spark wrote) and nothing removed.
    for seq, subject, data in want[:: max(1, len(want) // 25)]:
        msg = js.get_message("BOTH", seq)
        assert (msg.subject, msg.data) == (subject, data)
    history = DeltaTable(str(path)).history()
    operations = [h["operation"] for h in history]
    assert "DELETE" in operations and "OPTIMIZE" in operations and operations[0] == "WRITE"
