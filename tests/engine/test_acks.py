"""The ack-tracking table: readable by SQL-like scans, and compacted by snapshots."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine import consumers as consumers_module


def _consume_all(js: JetStream, n: int) -> None:
    for _ in range(n):
        for d in js.fetch("S", "C", 10):
            assert js.ack("S", "C", [(d.token, "ack", 0)]) == [None]


def test_snapshots_fold_old_events_so_restarts_stay_fast(
    js: JetStream, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumers_module, "SNAPSHOT_EVERY", 50)
    js.add_stream({"name": "S", "subjects": ["s"]})
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    js.publish([InboundMessage("s", b"x") for _ in range(400)])
    _consume_all(js, 40)
    js.flush()  # writes the events; the tick notices the consumer is due for a snapshot
    js.flush()  # writes the snapshot and deletes the events it folds
    rows = DeltaTable(str(js.layout.acks_table)).to_pyarrow_table().to_pylist()
    assert len(rows) < 100, f"{len(rows)} rows: the snapshot did not fold the events"
    snapshot = [r for r in rows if r["kind"] == "snapshot"][-1]
    assert (snapshot["delivered_stream_seq"], snapshot["ack_floor_stream_seq"]) == (400, 400)
    before = js.consumer_info("S", "C")
    js.close()
    again = JetStream(js.layout.warehouse, EngineOptions(), clock=clock)
    again.open(start_flusher=False)
    try:
        after = again.consumer_info("S", "C")
        assert {k: after[k] for k in ("delivered", "ack_floor", "num_pending")} == {
            k: before[k] for k in ("delivered", "ack_floor", "num_pending")
        }
    finally:
        again.close()


def test_events_name_sequences_and_ids_not_payloads(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s"]})
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    js.publish_one("s", b"secret-payload")
    _consume_all(js, 1)
    js.flush()
    table = DeltaTable(str(js.layout.acks_table)).to_pyarrow_table().sort_by("event_seq")
    assert table.column("kind").to_pylist() == ["deliver", "ack"]
    assert table.column("stream_seq").to_pylist() == [1, 1]
    assert "secret-payload" not in str(table.to_pylist())
