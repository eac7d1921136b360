"""Block-applied deliveries and acks leave exactly the state one event at a time leaves.

`Consumer.fetch` applies a pull's new deliveries as one block and `Consumer.ack_many` a run of acks in
one loop; here the same traffic goes through the block paths and through `Consumer.ack` one by one
(and through a restart, which replays the logged events one by one), and ConsumerInfo must agree.
"""

from __future__ import annotations

import random
from typing import Any

from engine import JetStream, ManualClock
from tests.conftest import reopen

MS = 1_000_000


def figures(js: JetStream, name: str) -> dict[str, Any]:
    i = js.consumer_info("S", name)
    return {k: i[k] for k in ("delivered", "ack_floor", "num_ack_pending", "num_redelivered", "num_pending")}


def one_by_one(js: JetStream, name: str, seqs: list[int], kind: str = "ack") -> None:
    stream = js.stream("S")
    with stream.lock:
        consumer = stream.consumers[name]
        for seq in seqs:
            consumer.ack(seq, kind, 0, js.clock.now_ns())


def test_block_acks_match_single_acks(js: JetStream, clock: ManualClock) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for i in range(300):
        js.publish_one(f"s.{i % 3}", b"x")
    for name in ("A", "B"):
        js.add_consumer("S", {"durable_name": name, "ack_policy": "explicit", "max_ack_pending": -1})
    rng = random.Random(7)
    for _ in range(4):
        a = [d.msg.seq for d in js.fetch("S", "A", 70)]
        b = [d.msg.seq for d in js.fetch("S", "B", 70)]
        assert a == b
        chosen = rng.sample(a, 50)
        assert js.ack("S", "A", [(s, "ack", 0) for s in chosen]) == [None] * 50
        one_by_one(js, "B", chosen)
        assert figures(js, "A") == figures(js, "B")
        clock.advance(MS)
    # a stale ack and an unknown one are reported per sequence; the others are applied
    results = js.ack("S", "A", [(chosen[0], "ack", 0), (10_000, "ack", 0), (a[0], "ack", 0)])
    assert [r is None for r in results] == [False, False, a[0] not in chosen]


def test_block_state_survives_restart(js: JetStream, clock: ManualClock) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for i in range(1200):
        js.publish_one(f"s.{i % 4}", b"y" * (i % 7))
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit", "max_ack_pending": -1})
    got = [d.msg.seq for d in js.fetch("S", "C", 500)]
    js.ack("S", "C", [(s, "ack", 0) for s in got[:200] + got[300:450]])
    js.ack("S", "C", [(s, "nak", 0) for s in got[450:460]])
    js.fetch("S", "C", 500)
    want = figures(js, "C")
    again = reopen(js, clock)
    try:
        assert figures(again, "C") == want
        rest = [d.msg.seq for d in again.fetch("S", "C", 2000)]
        # the cursor was recovered, and the naked messages redelivered before the restart are not due again
        assert rest == list(range(991, 1201))
    finally:
        again.close()


def test_ack_log_written_by_the_arrow_version_is_recovered(js: JetStream, clock: ManualClock) -> None:
    """Logs written before the packed record kind (Arrow IPC records) still replay after an upgrade."""
    from engine.ack_events import AckEvent
    from engine.store import ack_log
    from engine.store.acks import EventRow, _batch

    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for _ in range(3):
        js.publish_one("s.a", b"z")
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    js.flush()
    consumer = js.stream("S").consumers["C"]
    store = js.consumers.acks
    now = clock.now_ns()
    rows = [EventRow("S", "C", consumer.consumer_id, AckEvent("deliver", s, s, 1, now)) for s in (1, 2, 3)]
    rows.append(EventRow("S", "C", consumer.consumer_id, AckEvent("ack", 2, 0, 0, now)))
    store.wal.append([(ack_log.KIND_ARROW_EVENTS, memoryview(_batch(rows, store._next_event_seq).serialize()))])
    store.wal.close()
    store._next_event_seq += len(rows)
    again = reopen(js, clock)
    try:
        i = again.consumer_info("S", "C")
        assert (i["delivered"]["stream_seq"], i["ack_floor"]["stream_seq"], i["num_ack_pending"]) == (3, 0, 2)
    finally:
        again.close()


def test_background_flush_defers_deleting_folded_rows(js: JetStream) -> None:
    """Folded rows go with an explicit flush, and only every FOLD_INTERVAL with the background one."""
    store = js.consumers.acks
    store._folded["gone"] = 10
    store.flush(fold=False)
    assert store._folded == {"gone": 10}
    store.flush()
    assert store._folded == {}


def test_ack_run_matches_ack_and_is_logged(js: JetStream, clock: ManualClock) -> None:
    """`ack_run` (one kind for many sequences, the NATS door's plain acks) leaves the state `ack`
    leaves, reports each sequence's error, and is in the log when it returns (a restart keeps it)."""
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for i in range(200):
        js.publish_one(f"s.{i % 3}", b"z")
    for name in ("A", "B"):
        js.add_consumer("S", {"durable_name": name, "ack_policy": "explicit", "max_ack_pending": -1})
    got = [d.msg.seq for d in js.fetch("S", "A", 120)]
    assert got == [d.msg.seq for d in js.fetch("S", "B", 120)]
    acked = got[:40] + got[50:90]
    assert js.ack_run("S", "A", acked, "ack") == [None] * len(acked)
    js.ack("S", "B", [(s, "ack", 0) for s in acked])
    nowait = js.ack_run_nowait("S", "A", got[90:95], "term")
    assert nowait is None or nowait == [None] * 5
    if nowait is None:
        js.ack_run("S", "A", got[90:95], "term")
    js.ack("S", "B", [(s, "term", 0) for s in got[90:95]])
    assert js.ack_run("S", "A", got[40:45], "nak", 5 * MS) == [None] * 5
    js.ack("S", "B", [(s, "nak", 5 * MS) for s in got[40:45]])
    assert figures(js, "A") == figures(js, "B")
    results = js.ack_run("S", "A", [got[0], 10_000, got[100]], "ack")
    assert [r is None for r in results] == [False, False, True]
    assert "already acknowledged" in results[0].description
    js.ack("S", "B", [(got[100], "ack", 0)])
    want = figures(js, "A")
    assert want == figures(js, "B")
    clock.advance(6 * MS)
    assert sorted(d.msg.seq for d in js.fetch("S", "A", 5)) == got[40:45]  # the naked ones, after their delay
    want = figures(js, "A")
    again = reopen(js, clock)
    try:
        assert figures(again, "A") == want
    finally:
        again.close()
