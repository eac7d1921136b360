"""The ack-tracking table: readable by SQL-like scans, and compacted by snapshots."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from deltalake import DeltaTable

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine import consumers as consumers_module
from tests.conftest import reopen


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


class _LockWithAGap:
    """A stream's lock that runs `gap` once, right after its next full release: another thread's ack
    can then run between a snapshot taken under the lock and whatever its taker does after releasing it."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._depth = 0
        self.gap: Callable[[], None] | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self._lock.acquire(blocking, timeout))
        self._depth += got
        return got

    def release(self) -> None:
        self._depth -= 1
        outermost = self._depth == 0
        self._lock.release()
        if outermost and self.gap is not None:
            gap, self.gap = self.gap, None
            gap()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_an_ack_between_a_snapshot_and_its_log_write_is_not_lost(
    js: JetStream, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The log must hold events in the order they changed the state: an ack applied after a snapshot
    was taken and logged before it would be folded into a snapshot that does not hold it."""
    monkeypatch.setattr(consumers_module, "SNAPSHOT_EVERY", 5)
    js.add_stream({"name": "S", "subjects": ["s"]})
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    js.publish([InboundMessage("s", b"x") for _ in range(10)])
    assert [d.msg.seq for d in js.fetch("S", "C", 10)] == list(range(1, 11))
    stream = js.stream("S")
    lock = _LockWithAGap(stream.lock)
    monkeypatch.setattr(stream, "lock", lock)
    acked: list[list[Any]] = []

    def ack_in_the_gap() -> None:
        other = threading.Thread(target=lambda: acked.append(js.ack("S", "C", [(3, "ack", 0)])))
        other.start()
        other.join(10)

    take_snapshot = js.consumers.snapshot_row

    def snapshot_then_gap(consumer: Any, now: int) -> Any:
        row = take_snapshot(consumer, now)
        lock.gap = ack_in_the_gap
        return row

    monkeypatch.setattr(js.consumers, "snapshot_row", snapshot_then_gap)
    js.flush()  # the tick takes the snapshot; the ack runs as soon as the tick releases the lock
    assert acked == [[None]], "the ack ran in the gap and was answered OK"
    before = js.consumer_info("S", "C")
    assert before["num_ack_pending"] == 9
    again = reopen(js, clock)
    try:
        after = again.consumer_info("S", "C")
        assert (after["num_ack_pending"], after["ack_floor"]) == (9, before["ack_floor"]), "the ack survived the restart"
        assert [r.err_code if r else None for r in again.ack("S", "C", [(3, "ack", 0)])] == [10003]
    finally:
        again.close()
