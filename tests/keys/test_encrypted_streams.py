"""Encryption at rest in the engine: sealed log records and table columns, plaintext reads, restarts,
wrong and missing keys, corrupted ciphertext reported per message."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from engine import EngineOptions, JetStream, JetStreamError, ManualClock, PlainBatch, PubAck
from engine.keys import MasterKey, MissingMasterKeyError, ValueAuthenticationError, WrongMasterKeyError
from engine.messages import InboundMessage
from engine.store import flush_commits, index_file
from engine.store.layout import SEALED_STREAM_SCHEMA
from engine.store.sealed import SEALED_MSG_IDS

KEY = MasterKey.from_config("engine-test-key-0123456789abcdef", "aes")
WRONG = MasterKey.from_config("not-the-engine-key-0123456789abc", "aes")
MARKER = b"Zq7-clear-marker"


def open_engine(warehouse: Path, clock: ManualClock, key: MasterKey | None = KEY) -> JetStream:
    engine = JetStream(warehouse, EngineOptions(key=key), clock=clock)
    engine.open(start_flusher=False)
    return engine


@pytest.fixture
def boxed(warehouse: Path, clock: ManualClock) -> Iterator[list[JetStream]]:
    box = [open_engine(warehouse, clock)]
    yield box
    if box[0].opened:
        box[0].close()


def warehouse_bytes(warehouse: Path) -> bytes:
    return b"".join(_plain_bytes(p) for p in sorted(warehouse.rglob("*")) if p.is_file())


def _plain_bytes(path: Path) -> bytes:
    """A file's bytes; an index snapshot's as they are before compression."""
    return index_file.plain_bytes(path.read_bytes()) if path.suffix == ".idx" else path.read_bytes()


def publish_markers(js: JetStream) -> None:
    js.add_stream({"name": "ORDERS", "subjects": ["orders.>"]})
    messages = [
        InboundMessage(f"orders.{i % 3}", MARKER + b" payload %d" % i,
                       {"Nats-Msg-Id": [f"id-{i}"], "X-Secret": [MARKER.decode() + f" header {i}"]})
        for i in range(1, 6)
    ]
    assert all(isinstance(r, PubAck) for r in js.publish(messages))
    answer = js.publish_batch(PlainBatch(["orders.9"] * 3, pa.array([MARKER + b" columnar %d" % i for i in range(3)])))
    assert not isinstance(answer, list) or all(isinstance(r, PubAck) for r in answer)


def assert_reads_plaintext(js: JetStream) -> None:
    msg = js.get_message("ORDERS", 2)
    assert msg.data == MARKER + b" payload 2"
    assert msg.headers == {"Nats-Msg-Id": ["id-2"], "X-Secret": [MARKER.decode() + " header 2"]}
    assert msg.msg_id == "id-2"
    assert js.get_message("ORDERS", 7).data == MARKER + b" columnar 1"
    found = js.stream("ORDERS").load_many(list(range(1, 9)))
    assert [m.data.split(b" ")[-1] for m in found] == [b"1", b"2", b"3", b"4", b"5", b"0", b"1", b"2"]


def test_log_and_table_hold_ciphertext_and_reads_give_plaintext(boxed: list[JetStream], warehouse: Path,
                                                                clock: ManualClock) -> None:
    js = boxed[0]
    publish_markers(js)
    assert any(js.layout.wal_dir("ORDERS").iterdir())
    assert MARKER not in warehouse_bytes(warehouse)  # the log holds sealed records
    assert_reads_plaintext(js)

    js.close()  # a restart replays the sealed log
    boxed[0] = js = open_engine(warehouse, clock)
    assert_reads_plaintext(js)
    assert js.publish_one("orders.1", b"again", {"Nats-Msg-Id": ["id-3"]}).duplicate  # ids from the sealed log

    js.flusher.flush()
    table = DeltaTable(str(js.layout.stream_table("ORDERS")))
    assert table.schema().to_arrow().field("headers").type == SEALED_STREAM_SCHEMA.field("headers").type
    rows = table.to_pyarrow_table()
    assert rows.num_rows == 8 and rows.column("msg_id").null_count == 8
    assert MARKER not in warehouse_bytes(warehouse)
    assert_reads_plaintext(js)

    js.close()  # a restart reads the sealed table (msg ids of the duplicate window from sealed headers)
    boxed[0] = js = open_engine(warehouse, clock)
    assert_reads_plaintext(js)
    assert js.publish_one("orders.1", b"again", {"Nats-Msg-Id": ["id-4"]}).duplicate
    js.add_consumer("ORDERS", {"durable_name": "C", "ack_policy": "explicit"})
    delivered = js.fetch("ORDERS", "C", 10)
    assert [d.msg.seq for d in delivered] == list(range(1, 9))
    assert delivered[0].msg.headers["X-Secret"] == [MARKER.decode() + " header 1"]


def test_kv_values_and_object_chunks_are_sealed(boxed: list[JetStream], warehouse: Path) -> None:
    js = boxed[0]
    js.kv.create({"bucket": "cfg", "history": 3})
    js.kv.put("cfg", "db", MARKER + b" kv value")
    js.objects.create({"bucket": "files"})
    js.objects.put("files", "report", MARKER * 5000, chunk_size=4096)
    js.flusher.flush()
    assert MARKER not in warehouse_bytes(warehouse)
    assert js.kv.get("cfg", "db").value == MARKER + b" kv value"
    info = js.objects.info("files", "report")
    assert b"".join(b"".join(batch) for batch in js.objects.read_batches(info, js.objects.chunk_seqs(info))) == MARKER * 5000


def test_wrong_or_missing_key_refuses_and_changes_nothing(boxed: list[JetStream], warehouse: Path,
                                                          clock: ManualClock) -> None:
    publish_markers(boxed[0])
    boxed[0].close()
    before = {p: p.read_bytes() for p in sorted(warehouse.rglob("*")) if p.is_file()}
    with pytest.raises(WrongMasterKeyError, match="does not open the keyring of account 'default'.*nothing was changed"):
        open_engine(warehouse, clock, WRONG)
    with pytest.raises(MissingMasterKeyError, match="no key was given.*nothing was changed"):
        open_engine(warehouse, clock, None)
    assert {p: p.read_bytes() for p in sorted(warehouse.rglob("*")) if p.is_file()} == before
    boxed[0] = js = open_engine(warehouse, clock)  # the right key: everything as it was
    assert_reads_plaintext(js)


def test_a_corrupted_value_is_reported_for_its_message_and_the_stream_serves(
        boxed: list[JetStream], warehouse: Path, clock: ManualClock) -> None:
    js = boxed[0]
    publish_markers(js)
    js.flusher.flush()
    js.close()
    damaged = _flip_a_byte_of(js.layout.stream_table("ORDERS"), seq=4)
    boxed[0] = js = open_engine(warehouse, clock)
    with pytest.raises(ValueAuthenticationError) as raised:
        js.get_message("ORDERS", 4)
    assert isinstance(raised.value, JetStreamError) and raised.value.to_dict()["code"] == 500
    assert "authentication failed" in raised.value.description
    assert js.get_message("ORDERS", 2).data == MARKER + b" payload 2"
    assert js.get_message("ORDERS", 5).data == MARKER + b" payload 5"  # the same row group as the damaged one
    js.add_consumer("ORDERS", {"durable_name": "C", "ack_policy": "explicit"})
    assert [d.msg.seq for d in js.fetch("ORDERS", "C", 10)] == [s for s in range(1, 9) if s != 4]
    assert isinstance(js.publish_one("orders.1", b"after"), PubAck)
    assert damaged.exists()


def test_a_corrupted_header_value_is_reported_for_its_message_only(
        boxed: list[JetStream], warehouse: Path, clock: ManualClock) -> None:
    js = boxed[0]
    publish_markers(js)
    js.flusher.flush()
    js.close()
    _flip_a_byte_of(js.layout.stream_table("ORDERS"), seq=3, column="headers")
    boxed[0] = js = open_engine(warehouse, clock)
    js.add_consumer("ORDERS", {"durable_name": "C", "ack_policy": "explicit"})
    delivered = {d.msg.seq: d.msg for d in js.fetch("ORDERS", "C", 10)}
    assert sorted(delivered) == [1, 2, 4, 5, 6, 7, 8]
    assert delivered[2].headers == {"Nats-Msg-Id": ["id-2"], "X-Secret": [MARKER.decode() + " header 2"]}
    assert delivered[2].msg_id == "id-2" and delivered[7].headers is None and delivered[7].msg_id is None
    with pytest.raises(ValueAuthenticationError):
        js.get_message("ORDERS", 3)


def test_cached_row_groups_keep_their_values_sealed(boxed: list[JetStream], warehouse: Path,
                                                    clock: ManualClock) -> None:
    js = boxed[0]
    publish_markers(js)
    js.flusher.flush()
    js.close()
    boxed[0] = js = open_engine(warehouse, clock)  # reads come from the table's row groups
    assert_reads_plaintext(js)  # point reads, then a window read ahead
    js.add_consumer("ORDERS", {"durable_name": "C", "ack_policy": "explicit"})
    delivered = js.fetch("ORDERS", "C", 10)
    assert [d.msg.data.split(b" ")[-1] for d in delivered] == [b"1", b"2", b"3", b"4", b"5", b"0", b"1", b"2"]
    assert delivered[4].msg.headers == {"Nats-Msg-Id": ["id-5"], "X-Secret": [MARKER.decode() + " header 5"]}
    reads = js.stream("ORDERS").store.reads
    windows = reads._row_groups.windows()
    assert windows and any(window.listed for window in windows)
    held = [value for window in windows for name in ("subject", "data", "headers")
            for value in window.table.column(name).to_pylist() if value]
    assert len(held) >= 8 * 2 + 5 and not any(MARKER in (v if isinstance(v, bytes) else v.encode()) for v in held)


def test_sealed_columns_are_written_plain_and_files_of_the_earlier_encoding_still_read(
        boxed: list[JetStream], warehouse: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ciphertext does not compress: an encrypted stream's files are written uncompressed, with no
    dictionary and no statistics on its sealed columns. Files written before (snappy, dictionaries) sit
    in the same table and still read."""
    js = boxed[0]
    earlier_encoding = flush_commits.message_encoding
    monkeypatch.setattr(flush_commits, "sealed_message_encoding", earlier_encoding)
    publish_markers(js)
    js.flusher.flush()
    monkeypatch.undo()
    assert isinstance(js.publish_one("orders.4", MARKER + b" later", {"X-Secret": [MARKER.decode() + " later"]}), PubAck)
    js.flusher.flush()
    files = {str(p): pq.ParquetFile(p).metadata for p in js.layout.stream_table("ORDERS").rglob("*.parquet")}
    codecs = {path: {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} for path, meta in files.items()}
    assert sorted(map(sorted, codecs.values())) == [["SNAPPY"], ["UNCOMPRESSED"]]
    new = next(meta for path, meta in files.items() if codecs[path] == {"UNCOMPRESSED"})
    names = [new.schema.column(i).name for i in range(new.num_columns)]
    for name in ("data", "headers"):
        chunk = new.row_group(0).column(names.index(name))
        assert not chunk.has_dictionary_page and not chunk.is_stats_set, name
    assert MARKER not in warehouse_bytes(warehouse)
    js.close()
    boxed[0] = js = open_engine(warehouse, clock)
    assert_reads_plaintext(js)
    later = js.get_message("ORDERS", 9)
    assert later.data == MARKER + b" later" and later.headers == {"X-Secret": [MARKER.decode() + " later"]}


def _flip_a_byte_of(table: Path, seq: int, column: str = "data") -> Path:
    """Rewrites the data file holding `seq` with one ciphertext byte of that message's `column` flipped."""
    for path in table.rglob("*.parquet"):
        rows = pq.read_table(path)
        seqs = rows.column("seq").to_pylist()
        if seq in seqs:
            data = rows.column(column).to_pylist()
            value = bytearray(data[seqs.index(seq)])
            value[20] ^= 0x01
            data[seqs.index(seq)] = bytes(value)
            rows = rows.set_column(rows.column_names.index(column), column, pa.array(data, pa.binary()))
            pq.write_table(rows, path)
            return path
    raise AssertionError(f"no file holds seq {seq}")


def test_large_groups_seal_as_one_batch_and_replay(boxed: list[JetStream], warehouse: Path, clock: ManualClock) -> None:
    js = boxed[0]
    js.add_stream({"name": "BIG", "subjects": ["big.>"]})
    messages = [InboundMessage(f"big.{i % 7}", MARKER + b" %d" % i, {"Nats-Msg-Id": [f"b{i}"]} if i % 2 else None)
                for i in range(1, 201)]
    assert all(isinstance(r, PubAck) for r in js.publish(messages))
    js.publish_one("big.small", MARKER + b" small")
    assert MARKER not in warehouse_bytes(warehouse)
    js.close()
    boxed[0] = js = open_engine(warehouse, clock)
    assert js.publish_one("big.1", b"dup", {"Nats-Msg-Id": ["b199"]}).duplicate
    js.flusher.flush()
    assert MARKER not in warehouse_bytes(warehouse)
    found = js.stream("BIG").load_many(list(range(1, 202)))
    assert [m.data for m in found] == [MARKER + b" %d" % i for i in range(1, 201)] + [MARKER + b" small"]
    assert [m.msg_id for m in found[:4]] == ["b1", None, "b3", None]


def test_message_ids_stay_sealed_in_the_index_snapshot_and_still_deduplicate(
    boxed: list[JetStream], warehouse: Path, clock: ManualClock
) -> None:
    js = boxed[0]
    js.add_stream({"name": "IDS", "subjects": ["ids.>"]})
    msg_id = MARKER.decode() + "-order-1"
    assert isinstance(js.publish_one("ids.a", b"first", {"Nats-Msg-Id": [msg_id]}), PubAck)
    js.flush()
    js.close()  # writes the index snapshot, which holds the duplicate window of plain streams
    assert MARKER not in warehouse_bytes(warehouse)
    boxed[0] = js = open_engine(warehouse, clock)
    again = js.publish_one("ids.a", b"again", {"Nats-Msg-Id": [msg_id]})
    assert isinstance(again, PubAck) and again.duplicate and again.seq == 1


def test_a_restart_takes_the_duplicate_window_sealed_in_the_snapshot(
    boxed: list[JetStream], warehouse: Path, clock: ManualClock
) -> None:
    """The window rides in the snapshot as one sealed value: a restart with a current snapshot opens no
    table, so with the table's data files gone it still knows the ids; after a rotation the next
    snapshot's window is sealed under the new epoch, so retiring the older keys leaves it readable."""
    js = boxed[0]
    js.add_stream({"name": "IDS", "subjects": ["ids.>"]})
    ids = [MARKER.decode() + f"-order-{i}" for i in range(3)]
    assert all(isinstance(js.publish_one("ids.a", b"m", {"Nats-Msg-Id": [i]}), PubAck) for i in ids)
    js.flush()
    js.close()
    snapshot = index_file.read(js.layout.objects, js.layout.index_snapshot_key("IDS"))
    assert snapshot is not None and SEALED_MSG_IDS in snapshot[1] and "msg_id_bytes" not in snapshot[1]
    assert "last_msg_id" not in snapshot[0] and MARKER not in warehouse_bytes(warehouse)

    table = js.layout.stream_table("IDS")
    hidden = {p: p.read_bytes() for p in table.rglob("*.parquet")}
    assert hidden
    for path in hidden:
        path.unlink()
    boxed[0] = js = open_engine(warehouse, clock)
    again = [js.publish_one("ids.a", b"again", {"Nats-Msg-Id": [i]}) for i in ids]
    assert all(isinstance(a, PubAck) and a.duplicate for a in again) and [a.seq for a in again] == [1, 2, 3]
    js.close()
    for path, data in hidden.items():
        path.write_bytes(data)

    boxed[0] = js = open_engine(warehouse, clock)
    keys = js.stream("IDS").store.sealer.keys
    keys.rotate()
    assert isinstance(js.publish_one("ids.b", b"new epoch", {"Nats-Msg-Id": ["fresh"]}), PubAck)
    js.flush()
    keys.retire_epochs_before(keys.epoch)  # as compaction does once the table holds no older value
    js.close()  # the snapshot's window is sealed under the new epoch
    boxed[0] = js = open_engine(warehouse, clock)
    assert js.publish_one("ids.b", b"x", {"Nats-Msg-Id": ["fresh"]}).duplicate
