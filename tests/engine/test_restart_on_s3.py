"""A restart on an S3 warehouse (versitygw on loopback) takes main's shortcuts through the object store:
a current index snapshot (an object, checked against the table's latest `_delta_log` commit) opens no
stream table, and an encrypted stream keeps its message ids out of every object of the bucket."""

from __future__ import annotations

from pathlib import Path

from engine import EngineOptions, InboundMessage, JetStream, ManualClock, PubAck
from engine.keys import MasterKey, keyring_folder
from engine.store.delta import DeltaStore
from engine.store.objectstore import WarehouseLocation
from tests.s3 import S3Server

KEY = MasterKey.from_config("s3-restart-key-0123456789abcdefgh", "aes")
MARKER = b"Qx9-clear-marker"


def _open(location: WarehouseLocation, state: Path, clock: ManualClock, key: MasterKey | None = None) -> JetStream:
    js = JetStream(location, EngineOptions(wal_dir=str(state), key=key), clock=clock)
    js.open(start_flusher=False)
    return js


def _bucket_bytes(location: WarehouseLocation) -> bytes:
    store = location.open()
    return b"".join(store.get(meta.key).data for meta in store.list())


def test_idle_streams_restart_on_s3_from_their_snapshots(
    s3_server: S3Server, tmp_path: Path, clock: ManualClock
) -> None:
    location = s3_server.location()
    js = _open(location, tmp_path / "state", clock)
    for i in range(3):
        js.add_stream({"name": f"S{i}", "subjects": [f"s{i}.>"]})
        js.add_consumer(f"S{i}", {"durable_name": "C", "ack_policy": "explicit"})
        js.publish([InboundMessage(f"s{i}.a", b"one"), InboundMessage(f"s{i}.b", b"two")])
        js.publish([InboundMessage(f"s{i}.a", b"three", {"Nats-Msg-Id": [f"id-{i}"]})])
        js.purge(f"S{i}", f"s{i}.b")
        delivered = js.fetch(f"S{i}", "C", 1)
        assert js.ack(f"S{i}", "C", [(delivered[0].token, "ack", 0)]) == [None]
        js.flush()
    js.close()

    again = _open(location, tmp_path / "state", clock)
    try:
        for i in range(3):
            stream = again.stream(f"S{i}")
            assert isinstance(stream.store, DeltaStore)
            assert stream.store.reads._files.version == -1, f"S{i}: its table was opened at the restart"
            assert (stream.index.msgs, stream.index.last_seq) == (2, 3)
            assert not stream.index.is_live(2), "the purge (a tombstone) holds after the restart"
            info = again.consumer_info(f"S{i}", "C")
            assert info["ack_floor"]["stream_seq"] == 1 and info["num_pending"] == 1
        answer = again.publish([InboundMessage("s1.a", b"again", {"Nats-Msg-Id": ["id-1"]})])[0]
        assert isinstance(answer, PubAck) and answer.duplicate and answer.seq == 3
        assert again.get_message("S1", 1).data == b"one", "an old message is read from the table on S3"
        again.publish([InboundMessage("s1.c", b"four")])
        again.flush()  # a commit after the snapshot: the next restart reads the table
    finally:
        again.close()
    third = _open(location, tmp_path / "state", clock)
    try:
        assert (third.stream("S1").index.msgs, third.stream("S1").index.last_seq) == (3, 4)
        assert third.get_message("S1", 4).data == b"four"
    finally:
        third.close()


def test_an_encrypted_stream_on_s3_keeps_its_message_ids_out_of_the_bucket(
    s3_server: S3Server, tmp_path: Path, clock: ManualClock
) -> None:
    location = s3_server.location()
    js = _open(location, tmp_path / "state", clock, KEY)
    keyring = js.layout.key("_system", "keys", "keyring.json")
    assert js.layout.objects.head(keyring).size > 0, "the keyring is in the bucket"
    assert not keyring_folder(js.layout.root).exists(), "no keyring on local disk"
    js.add_stream({"name": "IDS", "subjects": ["ids.>"]})
    msg_id = MARKER.decode() + "-order-1"
    assert isinstance(js.publish_one("ids.a", MARKER + b" first", {"Nats-Msg-Id": [msg_id]}), PubAck)
    js.flush()
    js.close()  # writes the index snapshot (an object in the bucket)
    assert js.layout.objects.head(js.layout.index_snapshot_key("IDS")).size > 0
    assert MARKER not in _bucket_bytes(location), "no message id or payload in clear in any object"
    again = _open(location, tmp_path / "state", clock, KEY)
    try:
        answer = again.publish_one("ids.a", b"again", {"Nats-Msg-Id": [msg_id]})
        assert isinstance(answer, PubAck) and answer.duplicate and answer.seq == 1
        msg = again.get_message("IDS", 1)
        assert msg.data == MARKER + b" first" and msg.msg_id == msg_id
    finally:
        again.close()
