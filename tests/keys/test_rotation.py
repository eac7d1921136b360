"""Key rotation under load: new writes take the new epoch at once, nothing acknowledged is lost, and the
compaction job re-encrypts the older values under Spark and destroys the older keys."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import ManualClock, PubAck
from engine.keys import KeyDestroyedError
from engine.messages import InboundMessage
from jobs import compact
from tests.keys.test_encrypted_streams import open_engine, warehouse_bytes

pytestmark = pytest.mark.spark

MARKER = b"Rt5-rotation-marker"
PUBLISH_CAP = 200_000  # a bound on the publisher; the test stops it once both epochs have rows


def key_ids(table: Path, column: str) -> set[int]:
    values = DeltaTable(str(table)).to_pyarrow_table(columns=[column]).column(column).to_pylist()
    return {int.from_bytes(v[1:5], "big") for v in values if v}


def test_rotation_under_load_then_compaction_reencrypts_and_retires(spark: SparkSession, warehouse: Path,
                                                                   clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    acked: dict[int, bytes] = {}
    stop = threading.Event()
    failures: list[object] = []

    def publisher() -> None:
        n = 0
        while not stop.is_set() and n < PUBLISH_CAP:
            batch = [InboundMessage(f"rot.{(n + i) % 5}", MARKER + b" %d" % (n + i), {"X-N": [str(n + i)]})
                     for i in range(5)]
            for msg, result in zip(batch, js.publish(batch), strict=True):
                if isinstance(result, PubAck):
                    acked[result.seq] = msg.data
                else:
                    failures.append(result)
            n += len(batch)

    try:
        js.add_stream({"name": "ROT", "subjects": ["rot.>"]})
        keys = js.stream("ROT").store.sealer.keys
        thread = threading.Thread(target=publisher)
        thread.start()
        _wait_for(lambda: len(acked) >= 300, thread)
        js.flush()
        first_epoch_ids = key_ids(js.layout.stream_table("ROT"), "data")
        assert js.rotate_key("ROT") == 2 and keys.epoch == 2  # under load: new writes take it at once
        rotated_at = len(acked)  # the publisher runs on until stopped: writes after the rotation are certain
        _wait_for(lambda: len(acked) >= rotated_at + 600, thread)
        js.flush()
        stop.set()
        thread.join(timeout=60)
        js.flush()
        assert not failures and not thread.is_alive()
        table = js.layout.stream_table("ROT")
        assert key_ids(table, "data") > first_epoch_ids  # both epochs in the table

        figures = compact.run(spark, js.layout, keyring=js.keyring)
        assert figures["streams_rekeyed"] == 1 and figures["keys_retired"] == 1 and figures["rekey_errors"] == 0
        assert figures["rows_reencrypted"] >= 300
        assert key_ids(table, "data") == key_ids(table, "headers") and not key_ids(table, "data") & first_epoch_ids
        for key_id in first_epoch_ids:
            with pytest.raises(KeyDestroyedError):
                keys.key(key_id)
        assert compact.run(spark, js.layout, keyring=js.keyring)["streams_rekeyed"] == 0  # nothing older left
    finally:
        stop.set()
        js.close()

    js = open_engine(warehouse, clock)  # cold reads: every acknowledged message from the re-encrypted table
    try:
        found = js.stream("ROT").load_many(sorted(acked))
        assert {m.seq: m.data for m in found} == acked
        assert found[0].headers == {"X-N": ["0"]}
    finally:
        js.close()
    assert MARKER not in warehouse_bytes(warehouse)
    for path in warehouse.rglob("*.parquet"):  # decompressed values too, the replaced files included
        rows = pq.read_table(path)
        assert not [v for name in ("data", "headers") if name in rows.column_names
                    for v in rows.column(name).to_pylist() if v and MARKER in v], path


def _wait_for(condition, thread: threading.Thread, timeout: float = 60.0) -> None:  # noqa: ANN001
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert thread.is_alive() and time.monotonic() < deadline, "the publisher stopped early"
        time.sleep(0.01)
