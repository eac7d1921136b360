"""Protected subjects (`jetlake.protected_subjects`): the subject column of the log and the table is
sealed, partition folders are keyed hashes, the index snapshot seals its subject names; reads by
subject, wildcards, last-by-subject, KV, objects, purges, erasures and crypto-shredding work from the
plain subjects the index keeps in memory, across restarts with and without a snapshot. No marker
subject is left in clear in any file or file name under the warehouse."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from engine import JetStream, JetStreamError, ManualClock, PlainBatch, PubAck
from engine.encryption import PROTECTED_SUBJECTS_KEY
from engine.erasures import registry
from engine.keys import KeyDestroyedError, Keyring, keyring_folder
from engine.messages import InboundMessage
from engine.objects import meta_subject
from engine.store import index_file
from engine.store.layout import PROTECTED_STREAM_SCHEMA
from engine.store.sealed import SEALED_SUBJECT_NAMES
from tests.keys.test_encrypted_streams import KEY, open_engine

MARK = "Wq4marker"  # in subjects only: the payloads below never carry it
PROTECTED = {PROTECTED_SUBJECTS_KEY: "true"}
# The stream's own config names no marker (configs stay plain, docs/encryption.md); its partitions are
# the first two tokens, `s.<marker>`, so a plain stream's folder names would show the marker.
SECRETS = {"name": "SECRETS", "subjects": ["s.>"], "metadata": {**PROTECTED, "jetlake.partition_tokens": "2"}}


def _plain_bytes(path: Path) -> bytes:
    """A file's bytes; an index snapshot's as they are before compression."""
    return index_file.plain_bytes(path.read_bytes()) if path.suffix == ".idx" else path.read_bytes()


def leaks(warehouse: Path, needle: str = MARK) -> list[str]:
    """Files under the warehouse whose name or bytes hold `needle` (any case)."""
    found = []
    for path in sorted(warehouse.rglob("*")):
        if needle.lower() in str(path.relative_to(warehouse)).lower():
            found.append(f"name: {path}")
        elif path.is_file() and needle.lower().encode() in _plain_bytes(path).lower():
            found.append(f"bytes: {path}")
    return found


def publish(js: JetStream) -> None:
    """Seqs 1-4 single publishes, 5-104 one large group (an Arrow record), 105-107 a columnar batch."""
    js.add_stream(SECRETS)
    for i, subject in enumerate([f"s.{MARK}.a.1", f"s.{MARK}.b.2", f"s.{MARK}.a.1", "s.other.x"], 1):
        assert isinstance(js.publish_one(subject, b"payload %d" % i, {"Nats-Msg-Id": [f"id-{i}"]}), PubAck)
    assert all(isinstance(r, PubAck) for r in js.publish(
        [InboundMessage(f"s.{MARK}.bulk.{i % 7}", b"bulk %d" % i) for i in range(100)]))
    answer = js.publish_batch(PlainBatch([f"s.{MARK}.col"] * 3, pa.array([b"col %d" % i for i in range(3)])))
    assert not isinstance(answer, list) or all(isinstance(r, PubAck) for r in answer)


def assert_reads(js: JetStream) -> None:
    stream = js.stream("SECRETS")
    assert js.get_message("SECRETS", 2).subject == f"s.{MARK}.b.2"
    assert stream.last_by_subject(f"s.{MARK}.a.1").seq == 3
    assert stream.last_by_subject(f"s.{MARK}.col").data == b"col 2"
    assert list(stream.live_seqs(f"s.{MARK}.a.*")) == [1, 3]
    assert len(stream.live_seqs(f"s.{MARK}.bulk.>")) == 100
    assert [m.subject for m in stream.load_many([1, 4, 106])] == [f"s.{MARK}.a.1", "s.other.x", f"s.{MARK}.col"]
    subjects = js.stream_info("SECRETS", subjects_filter=f"s.{MARK}.b.>")["state"]["subjects"]
    assert subjects == {f"s.{MARK}.b.2": 1}
    assert js.publish_one(f"s.{MARK}.a.1", b"again", {"Nats-Msg-Id": ["id-2"]}).duplicate


def test_refused_without_a_key_for_memory_and_on_update(warehouse: Path, clock: ManualClock, tmp_path: Path) -> None:
    plain = open_engine(tmp_path / "plain", clock, key=None)
    try:
        with pytest.raises(JetStreamError) as raised:
            plain.add_stream(SECRETS)
        assert (raised.value.code, raised.value.err_code) == (400, 10052)
        assert "no key" in raised.value.description and PROTECTED_SUBJECTS_KEY in raised.value.description
        assert plain.list_streams()["total"] == 0
    finally:
        plain.close()

    js = open_engine(warehouse, clock)
    try:
        with pytest.raises(JetStreamError) as raised:
            js.add_stream({**SECRETS, "storage": "memory"})
        assert raised.value.err_code == 10052
        with pytest.raises(JetStreamError) as raised:
            js.add_stream({**SECRETS, "metadata": {PROTECTED_SUBJECTS_KEY: "maybe"}})
        assert raised.value.err_code == 10052
        js.add_stream(SECRETS)
        with pytest.raises(JetStreamError) as raised:
            js.update_stream("SECRETS", {**SECRETS, "metadata": {}})
        assert raised.value.err_code == 10052 and "can not change" in raised.value.description
        js.add_stream({"name": "OPEN", "subjects": ["open.>"]})
        with pytest.raises(JetStreamError):
            js.update_stream("OPEN", {"name": "OPEN", "subjects": ["open.>"], "metadata": PROTECTED})
        assert js.update_stream("SECRETS", {**SECRETS, "max_msgs": 10})["config"]["max_msgs"] == 10
        assert js.stream_info("OPEN")["config"].get("metadata") is None
    finally:
        js.close()


def test_no_subject_in_clear_and_every_read_works(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    try:
        publish(js)
        assert not leaks(warehouse), "the log holds subjects in clear"
        assert_reads(js)
        js.flush()
        table = DeltaTable(str(js.layout.stream_table("SECRETS")))
        assert table.schema().to_arrow().field("subject").type == PROTECTED_STREAM_SCHEMA.field("subject").type
        actions = pa.table(table.get_add_actions(flatten=True))
        partitions = set(actions.column("partition.subject_partition").to_pylist())
        hasher = js.stream("SECRETS").store.sealer.keys.subject_hasher()
        assert partitions == {hasher.partition_value(f"s.{MARK}"), hasher.partition_value("s.other")}
        rows = pq.read_table(js.layout.stream_table("SECRETS"), columns=["subject"]).column("subject").to_pylist()
        assert len(rows) == 107 and not [s for s in rows if MARK.encode() in s]
        assert not leaks(warehouse), "the table holds subjects in clear"
        assert_reads(js)
    finally:
        js.close()  # writes an index snapshot
    snapshot = index_file.read(js.layout.objects, js.layout.index_snapshot_key("SECRETS"))
    assert snapshot is not None and SEALED_SUBJECT_NAMES in snapshot[1] and "subject_arena" not in snapshot[1]
    assert not leaks(warehouse), "the index snapshot holds subjects in clear"

    js = open_engine(warehouse, clock)  # from the sealed snapshot
    try:
        assert_reads(js)
    finally:
        js.close()
    js.layout.objects.delete(js.layout.index_snapshot_key("SECRETS"))
    js = open_engine(warehouse, clock)  # rebuilt from the table's sealed subjects
    try:
        assert_reads(js)
        assert js.purge("SECRETS", f"s.{MARK}.bulk.>") == 100
        assert js.stream_info("SECRETS")["state"]["messages"] == 7
        js.stream("SECRETS").delete_message(2, False)  # stays in the table until a job rewrites it
        js.flush()
        answer = registry(js.layout).erase(js.stream("SECRETS"), filter_=f"s.{MARK}.b.*")  # found in the table
        assert answer["messages"] == 1
        assert registry(js.layout).erase(js.stream("SECRETS"), filter_=f"s.{MARK}.a.1")["messages"] == 2
        assert list(js.stream("SECRETS").live_seqs()) == [4, 105, 106, 107]
        js.flush()
    finally:
        js.close()
    assert not leaks(warehouse)


def test_kv_and_object_store_hide_keys_and_names(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    try:
        js.kv.create({"bucket": "cfg", "history": 2, "metadata": PROTECTED})
        js.kv.put("cfg", f"s.{MARK}.db", b"v1")
        js.kv.put("cfg", f"s.{MARK}.db", b"v2")
        js.kv.put("cfg", "plain", b"p")
        js.objects.create({"bucket": "files", "metadata": PROTECTED})
        js.objects.put("files", f"{MARK}-report.pdf", b"0123456789" * 900, chunk_size=1024)
        js.flush()
        js.kv.delete("cfg", "plain")
    finally:
        js.close()
    encoded_name = meta_subject("files", f"{MARK}-report.pdf").rsplit(".", 1)[1]  # the info's subject token
    assert not leaks(warehouse) and not leaks(warehouse, encoded_name)
    js.layout.objects.delete(js.layout.index_snapshot_key("KV_cfg"))
    js = open_engine(warehouse, clock)
    try:
        assert js.kv.get("cfg", f"s.{MARK}.db").value == b"v2"
        assert [e.value for e in js.kv.history("cfg", f"s.{MARK}.db")] == [b"v1", b"v2"]
        assert js.kv.keys("cfg") == [f"s.{MARK}.db"]
        assert [i.name for i in js.objects.list_objects("files")] == [f"{MARK}-report.pdf"]
        info = js.objects.info("files", f"{MARK}-report.pdf")
        assert b"".join(b"".join(batch) for batch in js.objects.read_batches(info, js.objects.chunk_seqs(info))) \
            == b"0123456789" * 900
        registry(js.layout).erase_key(js.kv, "cfg", f"s.{MARK}.db")
        with pytest.raises(JetStreamError):
            js.kv.get("cfg", f"s.{MARK}.db")
        js.objects.delete("files", f"{MARK}-report.pdf")  # its chunks and first info stay in the table only
        js.flush()
        answer = registry(js.layout).erase_object(js.objects, "files", f"{MARK}-report.pdf")
        assert answer["messages"] == 9 + 2  # found by their sealed subjects, in their keyed partitions
    finally:
        js.close()
    assert not leaks(warehouse)


def test_shredding_a_protected_prefix_and_rebuilding_without_a_snapshot(warehouse: Path, clock: ManualClock) -> None:
    users = {"name": "USERS", "subjects": ["users.>"],
             "metadata": {"jetlake.key_tokens": "2", PROTECTED_SUBJECTS_KEY: "true"}}
    js = open_engine(warehouse, clock)
    try:
        js.add_stream(users)
        js.publish([InboundMessage(f"users.{u}.{MARK}", f"of {u}".encode()) for u in (1, 2, 1, 2)])
        js.flush()
        js.publish_one(f"users.1.{MARK}", b"in the log")  # seq 5
        answer = registry(js.layout).erase(js.stream("USERS"), filter_="users.1.>")
        assert answer["messages"] == 3 and "key_destroyed" in answer
        sealer = js.stream("USERS").store.sealer
        other = Keyring.open(keyring_folder(js.layout.root), "default", KEY).stream(sealer.keys.stream_id, 2)
        sealed = {r["seq"]: r["subject"] for r in pq.read_table(js.layout.stream_table("USERS")).to_pylist()}
        with pytest.raises(KeyDestroyedError):  # the subject went with its prefix's key
            other.open_one("subject", 1, None, sealed[1])
        assert other.open_one("subject", 2, None, sealed[2]) == f"users.2.{MARK}".encode()
    finally:
        js.close()
    js.layout.objects.delete(js.layout.index_snapshot_key("USERS"))
    js = open_engine(warehouse, clock)  # subjects that no longer open: rows of erased messages
    try:
        stream = js.stream("USERS")
        assert list(stream.live_seqs()) == [2, 4]
        assert [m.subject for m in stream.load_many([1, 2, 3, 4, 5])] == [f"users.2.{MARK}"] * 2
        assert js.stream_info("USERS", subjects_filter=">")["state"]["subjects"] == {f"users.2.{MARK}": 2}
        js.publish_one(f"users.1.{MARK}", b"a new life")
        assert stream.last_by_subject(f"users.1.{MARK}").data == b"a new life"
    finally:
        js.close()
    assert not leaks(warehouse)


def test_consumer_configs_are_sealed_and_reopen(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    try:
        publish(js)
        js.add_consumer("SECRETS", {"durable_name": "reader", "filter_subject": f"s.{MARK}.a.>",
                                    "ack_policy": "explicit"})
        assert [d.msg.seq for d in js.fetch("SECRETS", "reader", 10)] == [1, 3]
        js.kv.create({"bucket": "cfg", "metadata": PROTECTED})
        js.kv.put("cfg", f"{MARK}.db", b"v")
        js.add_consumer("KV_cfg", {"name": "watcher", "filter_subject": f"$KV.cfg.{MARK}.db"})
        js.flush()
    finally:
        js.close()
    assert not leaks(warehouse)
    js = open_engine(warehouse, clock)
    try:
        info = js.consumer_info("SECRETS", "reader")
        assert info["config"]["filter_subject"] == f"s.{MARK}.a.>" and info["num_ack_pending"] == 2
        assert js.consumer_info("KV_cfg", "watcher")["config"]["filter_subject"] == f"$KV.cfg.{MARK}.db"
        js.publish_one(f"s.{MARK}.a.9", b"later")
        assert [d.msg.seq for d in js.fetch("SECRETS", "reader", 10)] == [108]
    finally:
        js.close()
    assert not leaks(warehouse)
