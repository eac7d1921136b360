"""Stream semantics on the engine, with a hand-moved clock, across restarts of the same warehouse."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from engine import EngineOptions, JetStream, JetStreamError, ManualClock, PubAck
from engine.config import NS_PER_S
from tests.conftest import reopen

SECOND = NS_PER_S






def _ack(result: PubAck | JetStreamError) -> PubAck:
    assert isinstance(result, PubAck), result
    return result


def test_max_age_removes_messages_from_every_read_at_once(js: JetStream, clock: ManualClock) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"], "max_age": 2 * SECOND})
    _ack(js.publish_one("s.a", b"1"))
    clock.advance(SECOND)
    _ack(js.publish_one("s.a", b"2"))
    clock.advance(SECOND + 1)
    state = js.stream_info("S")["state"]
    assert (state["messages"], state["first_seq"], state["last_seq"]) == (1, 2, 2)
    with pytest.raises(JetStreamError) as err:
        js.get_message("S", 1)
    assert err.value.err_code == 10037
    js.flush()
    rows = DeltaTable(str(js.layout.tombstones_table)).to_pyarrow_table().to_pylist()
    assert [(r["first_seq"], r["last_seq"], r["reason"]) for r in rows] == [(1, 1, "max_age")]
    assert "s.a" not in str(rows), "tombstones name sequences, never subjects"


def test_duplicate_window_expires(js: JetStream, clock: ManualClock) -> None:
    js.add_stream({"name": "S", "subjects": ["s"], "duplicate_window": SECOND})
    first = _ack(js.publish_one("s", b"x", {"Nats-Msg-Id": ["id"]}))
    assert _ack(js.publish_one("s", b"x", {"Nats-Msg-Id": ["id"]})).duplicate
    clock.advance(SECOND + 1)
    again = _ack(js.publish_one("s", b"x", {"Nats-Msg-Id": ["id"]}))
    assert not again.duplicate and again.seq == first.seq + 1


def test_duplicate_window_and_deletions_survive_a_restart(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    js.add_stream({"name": "S", "subjects": ["s.*"]})
    for i in range(6):
        _ack(js.publish_one(f"s.{i % 2}", f"m{i}".encode(), {"Nats-Msg-Id": [f"id{i}"]}))
    js.flush()
    js.delete_message("S", 2)
    js.purge("S", "s.1", keep=1)
    engine[0] = js = reopen(js, clock)
    state = js.stream_info("S", "s.*")["state"]
    assert state["subjects"] == {"s.0": 3, "s.1": 1}
    assert (state["messages"], state["first_seq"], state["last_seq"], state["num_deleted"]) == (4, 1, 6, 2)
    assert _ack(js.publish_one("s.0", b"again", {"Nats-Msg-Id": ["id3"]})) == PubAck("S", 4, duplicate=True)
    assert _ack(js.publish_one("s.0", b"new")).seq == 7


def test_duplicate_window_expires_after_a_restart(engine: list[JetStream], clock: ManualClock) -> None:
    """The window rebuilt at start keeps each id for the rest of its own window from its publish time:
    a restart neither forgets a recent id nor keeps an expired one."""
    js = engine[0]
    js.add_stream({"name": "S", "subjects": ["s"], "duplicate_window": 2 * SECOND})

    def pub(msg_id: str) -> PubAck:
        return _ack(js.publish_one("s", b"x", {"Nats-Msg-Id": [msg_id]}))

    assert pub("m1") == PubAck("S", 1)
    clock.advance(SECOND)
    assert pub("m2") == PubAck("S", 2)
    engine[0] = js = reopen(js, clock)
    assert (pub("m1"), pub("m2")) == (PubAck("S", 1, duplicate=True), PubAck("S", 2, duplicate=True))
    clock.advance(SECOND + SECOND // 2)  # m1 is 2.5 s old, out of the window; m2 1.5 s, still in it
    engine[0] = js = reopen(js, clock)
    assert pub("m1") == PubAck("S", 3), "an id whose window ran out before the restart is not a duplicate"
    assert pub("m2") == PubAck("S", 2, duplicate=True)
    clock.advance(SECOND)  # m2 is 2.5 s old: its window runs out after the restart
    assert pub("m2") == PubAck("S", 4)
    engine[0] = js = reopen(js, clock)
    assert (pub("m1"), pub("m2")) == (PubAck("S", 3, duplicate=True), PubAck("S", 4, duplicate=True))


def test_memory_streams_are_gone_after_a_restart(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    js.add_stream({"name": "MEM", "subjects": ["mem"], "storage": "memory"})
    js.add_stream({"name": "FILE", "subjects": ["file"]})
    _ack(js.publish_one("mem", b"1"))
    _ack(js.publish_one("file", b"1"))
    assert js.get_message("MEM", 1).data == b"1"
    engine[0] = js = reopen(js, clock)
    assert [s["config"]["name"] for s in js.list_streams()["streams"]] == ["FILE"]
    assert not (js.layout.stream_table("MEM")).exists()


def test_first_seq_and_purge_past_the_end_survive_a_restart(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    js.add_stream({"name": "F", "subjects": ["f"], "first_seq": 100})
    js.add_stream({"name": "P", "subjects": ["p"]})
    _ack(js.publish_one("p", b"1"))
    assert js.purge("P", seq=50) == 1
    engine[0] = js = reopen(js, clock)
    assert _ack(js.publish_one("f", b"x")).seq == 100
    assert _ack(js.publish_one("p", b"x")).seq == 50
    state = js.stream_info("P")["state"]
    assert (state["first_seq"], state["last_seq"], state["messages"]) == (50, 50, 1)


def test_lowering_a_limit_removes_the_oldest_at_once(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s"]})
    for i in range(5):
        _ack(js.publish_one("s", bytes([i])))
    info = js.update_stream("S", {"name": "S", "subjects": ["s"], "max_msgs": 2})
    assert (info["state"]["messages"], info["state"]["first_seq"]) == (2, 4)


def test_messages_read_back_from_the_table_once_evicted_from_memory(warehouse: Path, clock: ManualClock) -> None:
    js = JetStream(warehouse, EngineOptions(cache_bytes=0), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": "S", "subjects": ["s.*"]})
        for i in range(20):
            _ack(js.publish_one(f"s.{i % 3}", f"payload {i}".encode(), {"K": [str(i)]}))
        js.flush()
        assert js.stream("S").store.buffer.nbytes == 0  # type: ignore[attr-defined]
        msg = js.get_message("S", 14)
        assert (msg.subject, msg.data, msg.headers) == ("s.1", b"payload 13", {"K": ["13"]})
        assert js.stream("S").last_by_subject("s.2").seq == 18
        assert js.stream("S").next_by_subject("s.0", 5).seq == 7
    finally:
        js.close()


def test_publish_failures_take_no_sequence(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s"], "max_msgs": 2, "discard": "new", "max_msg_size": 10})
    _ack(js.publish_one("s", b"1"))
    too_big = js.publish_one("s", b"x" * 11)
    assert isinstance(too_big, JetStreamError) and too_big.err_code == 10054
    _ack(js.publish_one("s", b"2"))
    full = js.publish_one("s", b"3")
    assert isinstance(full, JetStreamError) and (full.code, full.err_code) == (503, 10077)
    assert js.stream_info("S")["state"]["last_seq"] == 2


@pytest.mark.parametrize("limit", [{"max_msgs": 5}, {"max_bytes": 5 * (len("s.a") + 2 + 16)}])
def test_discard_new_run_without_headers_stored_whole_or_refused_as_one_by_one(js: JetStream, limit: dict[str, int]) -> None:
    from engine import InboundMessage

    js.add_stream({"name": "S", "subjects": ["s.>"], "discard": "new", **limit})
    first = js.publish([InboundMessage("s.a", b"%02d" % i) for i in range(3)])  # fits whole: one run
    assert [_ack(r).seq for r in first] == [1, 2, 3]
    second = js.publish([InboundMessage("s.a", b"%02d" % i) for i in range(3, 6)])  # does not: one by one
    assert [type(r).__name__ for r in second] == ["PubAck", "PubAck", "JetStreamError"]
    assert isinstance(second[2], JetStreamError) and second[2].err_code == 10077
    state = js.stream_info("S")["state"]
    assert (state["messages"], state["last_seq"]) == (5, 5)


def test_buckets_made_by_nats_clients_are_partitioned_per_bucket(js: JetStream) -> None:
    from engine.config import DEFAULT_PARTITION_TOKENS, StreamConfig

    kv = {"name": "KV_cfg", "subjects": ["$KV.cfg.>"]}
    obj = {"name": "OBJ_media", "subjects": ["$O.media.C.>", "$O.media.M.>"]}
    assert StreamConfig.model_validate(kv).partition_tokens == 2
    assert StreamConfig.model_validate(obj).partition_tokens == 3
    not_buckets = [{"name": "KV_cfg", "subjects": ["$KV.cfg.>", "other"]}, {"name": "ORDERS", "subjects": ["$KV.cfg.>"]}]
    assert [StreamConfig.model_validate(c).partition_tokens for c in not_buckets] == [DEFAULT_PARTITION_TOKENS] * 2
    js.add_stream(kv)
    for key in ("a", "b", "c"):
        _ack(js.publish_one(f"$KV.cfg.{key}", b"v"))
    js.flush()
    folders = [p.name for p in (js.layout.warehouse / "default" / "streams" / "KV_cfg").iterdir() if p.name.startswith("subject_partition")]
    assert len(folders) == 1, folders
