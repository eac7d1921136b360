"""Many idle streams: a restart opens no stream table, reads the tombstones once, and keeps no file open
per stream; what it restores (messages, removals, consumers, the duplicate window) is what was there."""

from __future__ import annotations

import os
from pathlib import Path

from deltalake import DeltaTable

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine.store.commits import transactions
from engine.store.delta import DeltaStore

STREAMS = 110  # one tombstones commit each: past the table's checkpoint interval (100)


def _open(warehouse: Path, clock: ManualClock) -> JetStream:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    return js


def _crash(js: JetStream) -> None:
    """What a kill -9 leaves: no final flush, no snapshot; the warehouse is let go."""
    for entry in js._streams.values():
        entry.stream.store.wal.close()
    js.consumers.acks.wal.close()
    js._owner.release()


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
    js = _open(warehouse, clock)
    _fill(js, STREAMS)
    assert _open_files_under(warehouse / "default" / "_wal") == 0, "no log segment stays open once flushed"
    js.close()

    tombstones = js.layout.tombstones_table
    assert (tombstones / "_delta_log" / "_last_checkpoint").exists()
    read = transactions(js.layout.tombstones)
    table = DeltaTable(str(tombstones))
    assert read is not None and len(read) == 2 * STREAMS
    assert read == {app_id: table.transaction_version(app_id) for app_id in read}

    again = _open(warehouse, clock)
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
    js = _open(warehouse, clock)
    _fill(js, 2)
    js.close()
    js = _open(warehouse, clock)
    js.publish([InboundMessage("s1.c", b"later", {"Nats-Msg-Id": ["late"]})])
    js.purge("S1", "s1.a")
    js.flush()  # a commit (and a tombstone) after the snapshot, and no new snapshot: not due yet
    _crash(js)
    again = _open(warehouse, clock)
    try:
        stream = again.stream("S1")
        assert (stream.index.msgs, stream.index.last_seq) == (1, 4)
        assert again.get_message("S1", 4).data == b"later"
        assert again.publish([InboundMessage("s1.c", b"x", {"Nats-Msg-Id": ["late"]})])[0].duplicate  # type: ignore[union-attr]
        assert again.publish([InboundMessage("s1.c", b"x", {"Nats-Msg-Id": ["id-1"]})])[0].duplicate  # type: ignore[union-attr]
        assert again.stream("S0").store.reads._files.version == -1  # type: ignore[union-attr]
    finally:
        again.close()
