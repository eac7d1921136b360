"""The columnar publish of plain messages (`JetStream.publish_batch`) means what `publish` means.

Each scenario publishes the same messages twice, once as a `PlainBatch` and once message by message,
to two streams of the same config, and compares the answers, the stream state, the stored messages
(before and after the flush) and the rows of the Delta table. Also: restarts replay the columnar log
records, and mixed group commits keep sequence order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from engine import AckRun, EngineOptions, JetStream, JetStreamError, ManualClock, PlainBatch, PubAck
from engine.messages import InboundMessage, PublishAnswer, PublishResult
from tests.conftest import reopen

TOO_LARGE = 10054


def batch(messages: list[tuple[str, bytes]]) -> PlainBatch:
    return PlainBatch([s for s, _ in messages], pa.array([d for _, d in messages], pa.binary()))


def answers(answer: PublishAnswer | list[PublishResult]) -> list[Any]:
    """Answers in a comparable form, the stream name left out (the twin streams differ by it)."""
    results = answer.results() if isinstance(answer, AckRun) else answer
    return [(r.seq, r.duplicate) if isinstance(r, PubAck) else r.err_code for r in results]


def stored(js: JetStream, name: str) -> list[tuple[int, str, bytes, Any]]:
    last = js.stream_info(name)["state"]["last_seq"]
    found = js.stream(name).load_many(range(1, last + 1))
    return [(m.seq, m.subject.split(".", 1)[1], bytes(m.data), m.headers) for m in found]


def table_rows(js: JetStream, name: str) -> list[tuple[Any, ...]]:
    rows = DeltaTable(str(js.layout.stream_table(name))).to_pyarrow_table().sort_by("seq").to_pylist()
    return [(r["seq"], r["subject"].split(".", 1)[1], r["data"], r["size"], r["msg_id"], r["headers"], r["ts"]) for r in rows]


def twins(js: JetStream, **config: Any) -> None:
    js.add_stream({"name": "COL", "subjects": ["col.>"], **config})
    js.add_stream({"name": "ONE", "subjects": ["one.>"], **config})


def publish_both(js: JetStream, messages: list[tuple[str, bytes]]) -> tuple[PublishAnswer, list[PublishResult]]:
    columnar = js.publish_batch(batch([(f"col.{s}", d) for s, d in messages]))
    one_by_one = js.publish([InboundMessage(f"one.{s}", d) for s, d in messages])
    return columnar, one_by_one


def assert_same(js: JetStream) -> None:
    keys = ("messages", "bytes", "first_seq", "last_seq", "num_subjects", "num_deleted")
    col, one = js.stream_info("COL")["state"], js.stream_info("ONE")["state"]
    assert {k: col[k] for k in keys} == {k: one[k] for k in keys}
    assert stored(js, "COL") == stored(js, "ONE")


CONFIGS = [
    pytest.param({}, id="limits"),
    pytest.param({"max_msg_size": 8}, id="max_msg_size"),
    pytest.param({"max_msgs": 5}, id="max_msgs-discard-old"),
    pytest.param({"max_bytes": 150}, id="max_bytes-discard-old"),
    pytest.param({"max_msgs_per_subject": 2}, id="per-subject"),
    pytest.param({"max_msgs_per_subject": 1, "max_msgs": 3}, id="per-subject-one-and-max_msgs"),
    pytest.param({"max_msgs": 5, "discard": "new"}, id="discard-new-fallback"),
    pytest.param({"retention": "interest"}, id="interest-fallback"),
    pytest.param({"storage": "memory", "max_msgs": 6}, id="memory"),
]


@pytest.mark.parametrize("config", CONFIGS)
def test_columns_mean_what_messages_mean(js: JetStream, config: dict[str, Any]) -> None:
    twins(js, **config)
    rounds = [
        [("a", b"one"), ("a", b"two"), ("b", b"")],
        [("a", b"x" * 9), ("b", b"small"), ("c", b"y" * 20), ("a", b"last")],
        [("c", bytes(range(8))) for _ in range(7)],
    ]
    for messages in rounds:
        columnar, one_by_one = publish_both(js, messages)
        assert answers(columnar) == answers(one_by_one)
        assert_same(js)
    if config.get("storage") != "memory":
        js.flush()
        assert table_rows(js, "COL") == table_rows(js, "ONE")
        assert_same(js)


def test_oversize_payloads_are_refused_alone_and_take_no_sequence(js: JetStream) -> None:
    js.add_stream({"name": "COL", "subjects": ["col.>"], "max_msg_size": 4})
    answer = js.publish_batch(batch([("col.a", b"1234"), ("col.a", b"12345"), ("col.b", b"ok")]))
    assert not isinstance(answer, AckRun)
    assert [a.seq if isinstance(a, PubAck) else a.err_code for a in answer] == [1, TOO_LARGE, 2]
    whole = js.publish_batch(batch([("col.a", b"a"), ("col.b", b"b")]))
    assert whole == AckRun("COL", 3, 2)


def test_a_batch_over_several_streams_or_bad_subjects_falls_back(js: JetStream) -> None:
    js.add_stream({"name": "A", "subjects": ["a.>"]})
    js.add_stream({"name": "B", "subjects": ["b.>"]})
    answer = js.publish_batch(batch([("a.1", b"x"), ("b.1", b"y"), ("nobody", b"z"), ("a.*", b"w"), ("a.2", b"v")]))
    assert not isinstance(answer, AckRun)
    assert [(a.stream, a.seq) if isinstance(a, PubAck) else a.err_code for a in answer] == [
        ("A", 1), ("B", 1), 10059, 10003, ("A", 2)
    ]


def test_sealed_streams_refuse_every_message(js: JetStream) -> None:
    js.add_stream({"name": "COL", "subjects": ["col.>"]})
    js.update_stream("COL", {"name": "COL", "subjects": ["col.>"], "sealed": True})
    answer = js.publish_batch(batch([("col.a", b"1"), ("col.a", b"2")]))
    assert not isinstance(answer, AckRun) and all(isinstance(a, JetStreamError) for a in answer)
    assert js.stream_info("COL")["state"]["last_seq"] == 0


def test_mixed_group_commit_keeps_sequence_order(js: JetStream) -> None:
    """One group commit of a message list, a columnar run, headers, and another run: one log append."""
    js.add_stream({"name": "COL", "subjects": ["col.>"]})
    stream = js.stream("COL")
    out = stream.process([
        [InboundMessage("col.a", b"m1"), InboundMessage("col.a", b"m2")],
        batch([("col.b", b"r1"), ("col.b", b"r2"), ("col.b", b"r3")]),
        [InboundMessage("col.h", b"h1", {"Nats-Msg-Id": ["id-1"]})],
        batch([("col.c", b"s1"), ("col.d", b"s2")]),
    ])
    assert answers(out[0]) + answers(out[1]) + answers(out[2]) + answers(out[3]) == [(i, False) for i in range(1, 9)]
    expected = [(1, "a", b"m1"), (2, "a", b"m2"), (3, "b", b"r1"), (4, "b", b"r2"), (5, "b", b"r3"),
                (6, "h", b"h1"), (7, "c", b"s1"), (8, "d", b"s2")]
    assert [(s, subj, d) for s, subj, d, _ in stored(js, "COL")] == expected
    assert js.get_message("COL", 6).msg_id == "id-1"
    js.flush()
    assert [(r[0], r[1], r[2]) for r in table_rows(js, "COL")] == expected


def test_columnar_log_records_replay_after_a_restart(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    twins(js, max_msgs_per_subject=3)
    publish_both(js, [("a", b"early")])
    js.flush()
    for k in range(3):
        publish_both(js, [(f"s{i % 4}", f"m{k}-{i}".encode()) for i in range(100)])
    before = {name: js.stream_info(name)["state"] for name in ("COL", "ONE")}
    engine[0] = js = reopen(js, clock)
    assert {name: js.stream_info(name)["state"] for name in ("COL", "ONE")} == before
    assert_same(js)
    columnar, one_by_one = publish_both(js, [("s1", b"after"), ("s9", b"new")])
    assert answers(columnar) == answers(one_by_one)
    js.flush()
    assert table_rows(js, "COL") == table_rows(js, "ONE")


def test_unflushed_columnar_runs_are_read_from_memory(warehouse: Path, clock: ManualClock) -> None:
    js = JetStream(warehouse, EngineOptions(cache_bytes=0), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": "COL", "subjects": ["col.>"]})
        js.publish_batch(batch([(f"col.{i % 3}", f"payload {i}".encode()) for i in range(200)]))
        assert js.get_message("COL", 150).data == b"payload 149"
        assert [bytes(m.data) for m in js.stream("COL").load_many([1, 200])] == [b"payload 0", b"payload 199"]
        js.flush()
        assert js.get_message("COL", 150).data == b"payload 149"
    finally:
        js.close()


def test_a_batch_of_many_distinct_subjects_is_routed_and_sized_as_a_column(js: JetStream) -> None:
    """Past 32 distinct subjects a batch is validated and routed as one column: the same answers,
    state, stored messages and table rows as one by one, with per-subject limits too."""
    twins(js, max_msgs_per_subject=1)
    for round_ in range(3):
        messages = [(f"k{i % 150}.é{i}", b"v%d" % round_) for i in range(200)]
        columnar, one_by_one = publish_both(js, messages)
        assert isinstance(columnar, AckRun)
        assert answers(columnar) == answers(one_by_one)
        assert_same(js)
    js.flush()
    assert table_rows(js, "COL") == table_rows(js, "ONE")


@pytest.mark.parametrize("bad", ["a..b", "*", "a>", "a b", "x" * 600, "OTHER"])
def test_one_bad_or_foreign_subject_among_many_falls_back_to_one_by_one(js: JetStream, bad: str) -> None:
    twins(js)
    js.add_stream({"name": "OTHER", "subjects": ["other.>"]})
    messages = [(f"s{i}", b"x") for i in range(40)]
    messages[17] = (bad, b"x")
    columnar = js.publish_batch(batch([(f"col.{s}" if s != "OTHER" else "other.1", d) for s, d in messages]))
    one_by_one = js.publish([InboundMessage(f"one.{s}" if s != "OTHER" else "other.1", d) for s, d in messages])
    assert not isinstance(columnar, AckRun)

    def outcome(results: list[PublishResult]) -> list[Any]:
        return [r.err_code if isinstance(r, JetStreamError) else "other" if r.stream == "OTHER" else r.seq for r in results]

    assert outcome(columnar) == outcome(one_by_one)  # type: ignore[arg-type]
    assert sum(isinstance(r, PubAck) for r in columnar) == (40 if bad == "OTHER" else 39)  # type: ignore[union-attr]
    assert_same(js)
