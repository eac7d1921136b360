"""Many idle streams: a restart opens no stream table, reads the tombstones once, and keeps no file open
per stream; what it restores (messages, removals, consumers, the duplicate window) is what was there.
An idle stream is not even opened until its first use (engine/catalog.py); one with an unflushed log is."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from deltalake import DeltaTable

from engine import InboundMessage, JetStream, ManualClock
from engine.errors import ErrorCode, JetStreamError
from engine.messages import PubAck
from engine.store.delta import DeltaStore
from engine.store.delta_log import log_of
from tests.engine.restarts import crash, open_engine

STREAMS = 110  # one tombstones commit each: past the table's checkpoint interval (100)




def _open_files_under(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
        except OSError:
            pass
    return count


def _fill(js: JetStream, streams: int) -> None:
    for i in range(streams):
        name = f"S{i}"
        js.add_stream({"name": name, "subjects": [f"s{i}.>"]})
        js.add_consumer(name, {"durable_name": "C", "ack_policy": "explicit"})
        js.publish([InboundMessage(f"s{i}.a", b"one"), InboundMessage(f"s{i}.b", b"two")])
        js.publish([InboundMessage(f"s{i}.a", b"three", {"Nats-Msg-Id": [f"id-{i}"]})])
        js.purge(name, f"s{i}.b")
        delivered = js.fetch(name, "C", 1)
        assert js.ack(name, "C", [(delivered[0].token, "ack", 0)]) == [None]
        js.flush()  # one commit of each stream's messages and one of its tombstone


def test_idle_streams_restart_from_their_snapshots_and_one_read_of_the_tombstones(
    warehouse: Path, clock: ManualClock
) -> None:
    js = open_engine(warehouse, clock)
    _fill(js, STREAMS)
    assert _open_files_under(warehouse / "default" / "_wal") == 0, "no log segment stays open once flushed"
    js.close()

    tombstones = js.layout.tombstones_table
    assert (tombstones / "_delta_log" / "_last_checkpoint").exists()
    read = dict(log_of(js.layout.tombstones).state().txns)  # one replay of the log for every stream
    table = DeltaTable(str(tombstones))
    assert read is not None and len(read) == 2 * STREAMS
    assert read == {app_id: table.transaction_version(app_id) for app_id in read}

    again = open_engine(warehouse, clock)
    try:
        for i in range(STREAMS):
            stream = again.stream(f"S{i}")
            assert isinstance(stream.store, DeltaStore)
            assert stream.store.reads._files.version == -1, f"S{i}: its table was opened at the restart"
            assert (stream.index.msgs, stream.index.last_seq) == (2, 3)
            assert not stream.index.is_live(2), "the purge (a tombstone) holds after the restart"
            info = again.consumer_info(f"S{i}", "C")
            assert info["ack_floor"]["stream_seq"] == 1 and info["num_pending"] == 1
        answer = again.publish([InboundMessage("s7.a", b"again", {"Nats-Msg-Id": ["id-7"]})])[0]
        assert answer.duplicate and answer.seq == 3, "the duplicate window came back from the snapshot"  # type: ignore[union-attr]
        assert again.get_message("S7", 1).data == b"one", "an old message is read from the table on demand"
        assert again.publish([InboundMessage("s7.a", b"four")])[0].seq == 4  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_commit_after_the_snapshot_makes_the_restart_read_the_table(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    _fill(js, 2)
    js.close()
    js = open_engine(warehouse, clock)
    js.publish([InboundMessage("s1.c", b"later", {"Nats-Msg-Id": ["late"]})])
    js.purge("S1", "s1.a")
    js.flush()  # a commit (and a tombstone) after the snapshot, and no new snapshot: not due yet
    crash(js)
    again = open_engine(warehouse, clock)
    try:
        stream = again.stream("S1")
        assert (stream.index.msgs, stream.index.last_seq) == (1, 4)
        assert again.get_message("S1", 4).data == b"later"
        assert again.publish([InboundMessage("s1.c", b"x", {"Nats-Msg-Id": ["late"]})])[0].duplicate  # type: ignore[union-attr]
        assert again.publish([InboundMessage("s1.c", b"x", {"Nats-Msg-Id": ["id-1"]})])[0].duplicate  # type: ignore[union-attr]
        assert again.stream("S0").store.reads._files.version == -1  # type: ignore[union-attr]
    finally:
        again.close()


def _unopened(js: JetStream) -> set[str]:
    return {name for name, entry in js.registry.entries.items() if entry.stream is None}


def test_a_restart_leaves_idle_streams_unopened_and_first_use_opens_one_with_everything(
    warehouse: Path, clock: ManualClock
) -> None:
    js = open_engine(warehouse, clock)
    _fill(js, 12)
    js.add_stream({"name": "PUSH", "subjects": ["push.>"]})
    js.add_consumer("PUSH", {"durable_name": "P", "deliver_subject": "out.p", "ack_policy": "explicit"})
    js.close()

    again = open_engine(warehouse, clock)
    try:
        assert _unopened(again) == {f"S{i}" for i in range(12)}, "idle streams wait; a push consumer's does not"
        assert again.stream_names()["streams"] == ["PUSH", *sorted(f"S{i}" for i in range(12))]
        assert again.stream_names("s4.x")["streams"] == ["S4"]
        assert again.stream_name_for_subject("s3.a") == "S3" and "S3" in _unopened(again)
        try:
            again.add_stream({"name": "OVER", "subjects": ["s5.>"]})
            raise AssertionError("an unopened stream's subjects are taken")
        except JetStreamError as exc:
            assert exc.err_code == ErrorCode.STREAM_SUBJECT_OVERLAP

        answer = again.publish([InboundMessage("s3.a", b"x", {"Nats-Msg-Id": ["id-3"]})])[0]
        assert isinstance(answer, PubAck) and answer.duplicate and answer.seq == 3, "the first publish opened S3 whole"
        assert _unopened(again) == {f"S{i}" for i in range(12)} - {"S3"}
        info = again.consumer_info("S6", "C")
        assert info["ack_floor"]["stream_seq"] == 1 and info["num_pending"] == 1 and info["num_ack_pending"] == 0
        assert again.stream_info("S7")["state"]["messages"] == 2
        assert [d.msg.data for d in again.fetch("S8", "C", 5)] == [b"three"], "the acked message is not delivered again"
        assert "S9" in _unopened(again)
        listed = again.list_streams(offset=0, limit=3)
        assert listed["total"] == 13 and [s["config"]["name"] for s in listed["streams"]] == ["PUSH", "S0", "S1"]
        assert "S2" in _unopened(again) and "S1" not in _unopened(again)
        before = _unopened(again)
        info = again.account_info()
        assert info["streams"] == 13 and info["consumers"] == 13 and info["storage"] > 0
        assert _unopened(again) == before, "account info counts an idle stream from the catalog copy"
        again.registry.open_all()
        assert again.account_info() == info, "the counters are those of the streams opened"
    finally:
        again.close()


def test_a_stream_with_an_unflushed_log_after_kill_9_is_recovered_at_start_and_loses_nothing(
    warehouse: Path, clock: ManualClock
) -> None:
    js = open_engine(warehouse, clock)
    _fill(js, 4)
    js.close()
    js = open_engine(warehouse, clock)
    acked = [js.publish([InboundMessage("s2.z", b"p%d" % k)])[0] for k in range(3)]
    assert all(isinstance(a, PubAck) for a in acked)
    delivered = js.fetch("S1", "C", 1)
    assert [d.msg.data for d in delivered] == [b"three"] and js.ack("S1", "C", [(delivered[0].token, "ack", 0)]) == [None]
    crash(js)  # nothing flushed: S2's messages and S1's ack are only in the logs

    again = open_engine(warehouse, clock)
    try:
        assert _unopened(again) == {"S0", "S3", "S1"}, "S2's log holds records: it is recovered at start"
        stream = again.registry.entries["S2"].stream
        assert stream is not None and (stream.index.msgs, stream.index.last_seq) == (5, 6)
        assert [again.get_message("S2", s).data for s in (4, 5, 6)] == [b"p0", b"p1", b"p2"]
        info = again.consumer_info("S1", "C")
        assert info["ack_floor"]["stream_seq"] == 3 and info["num_pending"] == 0, "the logged ack came back"
    finally:
        again.close()


def test_a_stream_asked_for_by_many_threads_at_once_is_opened_once(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    _fill(js, 2)
    js.close()
    again = open_engine(warehouse, clock)
    try:
        assert _unopened(again) == {"S0", "S1"}
        with ThreadPoolExecutor(8) as pool:
            found = list(pool.map(lambda _: again.stream("S1"), range(8)))
        assert all(s is found[0] for s in found) and again.streams() == [found[0]]
        assert len(found[0].consumers) == 1 and found[0].index.msgs == 2
    finally:
        again.close()
