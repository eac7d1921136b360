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


def test_ack_log_written_by_the_column_version_is_recovered(js: JetStream, clock: ManualClock) -> None:
    """Logs of packed records with every column written out (kind 2, before runs) still replay."""
    import struct

    import numpy as np
    import orjson

    from engine.store import ack_log

    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for _ in range(3):
        js.publish_one("s.a", b"z")
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    js.flush()
    consumer_id = js.stream("S").consumers["C"].consumer_id
    store = js.consumers.acks
    now = clock.now_ns()
    meta = orjson.dumps([["S", "C", consumer_id, 3, "deliver", None], ["S", "C", consumer_id, 1, "ack", None]])
    columns = np.array([[1, 2, 3, 2], [1, 2, 3, 0], [1, 1, 1, 0], [now] * 4, [0] * 4], "<i8")
    payload = struct.pack("<qqI", store._next_event_seq, 4, len(meta)) + meta + columns.tobytes()
    store.wal.append([(ack_log.KIND_PACKED_EVENTS, payload)])
    store.wal.close()
    store._next_event_seq += 4
    again = reopen(js, clock)
    try:
        i = again.consumer_info("S", "C")
        assert (i["delivered"]["stream_seq"], i["ack_floor"]["stream_seq"], i["num_ack_pending"]) == (3, 0, 2)
        assert again.fetch("S", "C", 10) == []  # 1 and 3 still pending, not due yet; nothing new
    finally:
        again.close()


def test_pull_and_ack_records_write_runs(js: JetStream, clock: ManualClock) -> None:
    """A pull's deliveries and an ack run are one record each, their uniform columns written as runs;
    the record reads back as the events that changed the state."""
    from engine.store import ack_log

    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for i in range(600):
        js.publish_one(f"s.{i % 3}", b"w")
    js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit", "max_ack_pending": -1})
    js.flush()
    store = js.consumers.acks
    before = store.wal.size
    got = [d.msg.seq for d in js.fetch("S", "C", 500)]
    pulled = store.wal.size - before
    assert js.ack_run("S", "C", got[::2], "ack") == [None] * 250
    records = [r for r in store.wal.recover() if r.kind == ack_log.KIND_RUN_EVENTS]
    assert len(records) == 2
    (_, (deliveries,)), (_, (acks,)) = (ack_log.decode(r.payload, r.kind) for r in records)
    events = deliveries[3]
    assert events.stream_seq.tolist() == got == list(range(1, 501))
    assert events.consumer_seq.tolist() == list(range(1, 501))
    assert set(events.kind) == {"deliver"} and set(events.count.tolist()) == {1} and len(set(events.ts.tolist())) == 1
    assert acks[3].stream_seq.tolist() == got[::2] and set(acks[3].kind) == {"ack"}
    assert pulled < 500 * 8 + 1024  # the stream sequences and a header: no other column written out
    want = figures(js, "C")
    again = reopen(js, clock)
    try:
        assert figures(again, "C") == want
        assert want["num_ack_pending"] == 250
    finally:
        again.close()


def test_run_records_read_back_what_was_written() -> None:
    """Columns that are runs and columns that are not, in blocks of every size, round-trip exactly."""
    import numpy as np

    from engine.ack_events import AckEvents
    from engine.store import ack_log

    rng = random.Random(11)

    def column(n: int) -> np.ndarray:
        shape = rng.random()
        if shape < 0.3:
            return np.full(n, rng.randint(-5, 2**62), np.int64)
        if shape < 0.6:
            return np.arange(n, dtype=np.int64) * rng.randint(-3, 3) + rng.randint(0, 10**18)
        return np.array([rng.randint(0, 2**62) for _ in range(n)], np.int64)

    for _ in range(200):
        blocks = []
        for _ in range(rng.randint(1, 4)):
            n = rng.choice([0, 1, 2, 3, 500])
            kinds = ["deliver"] * n if rng.random() < 0.7 else [rng.choice(["ack", "nak"]) for _ in range(n)]
            events = AckEvents(kinds, column(n), column(n), column(n), column(n), column(n))
            blocks.append(("S", "C", "id", events, rng.choice([None, [1, 2, "{}"]])))
        first, back = ack_log.decode(ack_log.encode(blocks, 42))
        assert first == 42 and len(back) == len(blocks)
        for (*names, events, extra), (*names_back, events_back, extra_back) in zip(blocks, back, strict=True):
            assert names == names_back and extra == extra_back and events.kind == events_back.kind
            for name in ("stream_seq", "consumer_seq", "count", "ts", "delay"):
                assert getattr(events_back, name).tolist() == getattr(events, name).tolist()


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
