"""GDPR erasure requests in the engine (no Spark): a filter, a KV key or an object resolves against
everything stored, live or not, and the erased messages leave the gateway's memory at once (buffer,
decoded row groups, duplicate window), also after a restart."""

from __future__ import annotations

import secrets

import orjson
import pyarrow as pa
import pytest

from engine import JetStream, ManualClock, PubAck
from engine.erasures import registry
from engine.messages import AckRun, PlainBatch
from engine.store import erasures as fmt
from engine.store.delta import DeltaStore
from tests.conftest import reopen


def _pub(js: JetStream, subject: str, data: bytes, headers: dict[str, list[str]] | None = None) -> int:
    ack = js.publish_one(subject, data, headers)
    assert isinstance(ack, PubAck), ack
    return ack.seq


def _ranges(js: JetStream, erasure_id: str) -> list[list[int]]:
    record = fmt.read_request(js.layout, erasure_id)
    assert record is not None
    return record["ranges"]  # type: ignore[no-any-return]


def _seqs(ranges: list[list[int]]) -> list[int]:
    return [s for a, b in ranges for s in range(a, b + 1)]


def test_a_filter_resolves_against_every_stored_row_not_only_the_live_ones(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["users.>", "orders.>"]})
    secret = "users.zq7" + secrets.token_hex(6)
    deleted = _pub(js, secret, b"deleted with no_erase")
    _pub(js, "orders.a", b"kept")
    js.flush()
    js.delete_message("S", deleted, erase=False)
    purged_flushed = _pub(js, secret, b"purged after its flush")
    js.flush()
    js.purge("S", secret)
    live_flushed = _pub(js, secret, b"live, flushed")
    js.flush()
    # only in the buffer and the log (a flush drops a stream's unread copies of what it committed)
    removed_buffered = _pub(js, secret, b"removed before any flush")
    js.delete_message("S", removed_buffered, erase=False)
    live_buffered = _pub(js, secret, b"live, in the log")
    kept = _pub(js, "orders.b", b"kept too")

    answer = registry(js.layout).erase(js.stream("S"), filter_=secret)

    want = [deleted, purged_flushed, removed_buffered, live_flushed, live_buffered]
    assert _seqs(_ranges(js, answer["id"])) == sorted(want)
    assert answer["messages"] == len(want)
    record = fmt.read_request(js.layout, answer["id"])
    assert secret.encode() not in orjson.dumps(record), "a request keeps sequence ranges only"
    assert js.stream_info("S")["state"]["messages"] == 2
    assert js.get_message("S", kept).data == b"kept too"


def test_a_wildcard_filter_and_a_coarse_partitioning(js: JetStream) -> None:
    js.add_stream({"name": "P", "subjects": ["t.>"], "metadata": {"jetlake.partition_tokens": "1"}})
    a = _pub(js, "t.x.secret", b"1")
    b = _pub(js, "t.y.secret", b"2")
    _pub(js, "t.y.other", b"3")
    js.flush()
    js.purge("P", "t.x.secret")
    answer = registry(js.layout).erase(js.stream("P"), filter_="t.*.secret")
    assert _seqs(_ranges(js, answer["id"])) == [a, b]


def test_a_kv_key_erases_every_stored_revision(js: JetStream) -> None:
    js.kv.create({"bucket": "cfg", "history": 1})
    first = js.kv.put("cfg", "person.email", b"old@example.com")
    js.flush()
    second = js.kv.put("cfg", "person.email", b"new@example.com")  # the first leaves by the history limit
    other = js.kv.put("cfg", "person.name", b"kept")
    stream = js.kv.stream("cfg")
    assert not stream.index.is_live(first)

    answer = registry(js.layout).erase_key(js.kv, "cfg", "person.email")

    assert _seqs(_ranges(js, answer["id"])) == [first, second]
    assert js.kv.get("cfg", "person.name").revision == other


def test_an_object_erases_every_info_and_the_chunks_of_every_version(js: JetStream) -> None:
    js.objects.create({"bucket": "media"})
    old = js.objects.put("media", "scan.pdf", b"A" * 300, chunk_size=100)
    js.flush()
    new = js.objects.put("media", "scan.pdf", b"B" * 150, chunk_size=100)  # the old chunks are purged
    kept = js.objects.put("media", "other.pdf", b"C" * 50, chunk_size=100)
    stream = js.objects.stream("media")
    old_chunks = list(range(old.seq - old.chunks, old.seq))
    new_chunks = list(range(new.seq - new.chunks, new.seq))

    answer = registry(js.layout).erase_object(js.objects, "media", "scan.pdf")

    assert _seqs(_ranges(js, answer["id"])) == sorted([*old_chunks, old.seq, *new_chunks, new.seq])
    assert js.objects.info("media", "other.pdf").nuid == kept.nuid
    with pytest.raises(Exception):
        js.objects.info("media", "scan.pdf")


def test_work_queue_and_interest_removals_are_resolved(js: JetStream) -> None:
    for name, retention in (("WQ", "workqueue"), ("INT", "interest")):
        js.add_stream({"name": name, "subjects": [f"{name.lower()}.>"], "retention": retention})
        js.add_consumer(name, {"durable_name": "C", "ack_policy": "explicit"})
        seq = _pub(js, f"{name.lower()}.secret", b"acked, then removed by retention")
        js.flush()
        delivered = js.fetch(name, "C", 10)
        assert [d.msg.seq for d in delivered] == [seq]
        assert js.ack(name, "C", [(seq, "ack", 0)]) == [None]
        assert not js.stream(name).index.is_live(seq), "removed once acknowledged"
        answer = registry(js.layout).erase(js.stream(name), filter_=f"{name.lower()}.secret")
        assert _seqs(_ranges(js, answer["id"])) == [seq]


def _held_bytes(store: DeltaStore) -> bytes:
    """Every payload and subject the store holds in memory: its buffer and its decoded row groups."""
    parts: list[bytes] = []
    for rows in store.buffer._batches:
        parts += [rows.message(i).data + rows.subjects[i].encode() for i in range(len(rows))]
    reads = store.reads
    for window in reads._row_groups.windows():
        table = window.table
        parts += [d or b"" for d in table.column("data").to_pylist()]
        parts += [s.encode() for s in table.column("subject").to_pylist()]
    for _, _, window in reads._windows:
        parts += [d or b"" for d in window.table.column("data").to_pylist()]
    return b"|".join(parts)


def test_erased_messages_leave_the_memory_and_the_duplicate_window(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    marker = "zq7" + secrets.token_hex(8)
    flushed = _pub(js, f"s.{marker}", f"flushed {marker}".encode(), {"Nats-Msg-Id": [f"id-{marker}"]})
    _pub(js, f"s.{marker}", f"also flushed {marker}".encode(), {"Nats-Msg-Id": [f"id3-{marker}"]})
    for _ in range(100):
        _pub(js, "s.plain", b"x")
    js.flush()
    assert js.get_message("S", flushed).data.startswith(b"flushed")  # decoded into the row-group cache
    js.stream("S").load_many(list(range(1, 90)))  # the windowed read path too
    buffered = _pub(js, f"s.{marker}", f"buffered {marker}".encode(), {"Nats-Msg-Id": [f"id2-{marker}"]})
    store = js.stream("S").store
    assert isinstance(store, DeltaStore)
    assert marker.encode() in _held_bytes(store)

    registry(js.layout).erase(js.stream("S"), filter_=f"s.{marker}")

    assert marker.encode() not in _held_bytes(store)
    assert js.get_message("S", 3).data == b"x", "other messages still read"
    again = js.publish_one(f"s.{marker}", b"new", {"Nats-Msg-Id": [f"id-{marker}"]})
    assert isinstance(again, PubAck) and not again.duplicate and again.seq > buffered
    js.flush()

    # After a restart the table still holds the erased rows (the job has not run) and the rebuilt
    # duplicate window would know their ids again: the pending request makes it forget them.
    engine[0] = js = reopen(js, clock)
    third = js.publish_one(f"s.{marker}", b"newer", {"Nats-Msg-Id": [f"id3-{marker}"]})
    assert isinstance(third, PubAck) and not third.duplicate
    assert js.publish_one("s.x", b"y", {"Nats-Msg-Id": [f"id-{marker}"]}).duplicate, "the re-published id is live"


def test_columnar_buffer_rows_are_blanked(js: JetStream) -> None:
    js.add_stream({"name": "C", "subjects": ["c.>"]})
    marker = "zq7" + secrets.token_hex(8)
    subjects = [f"c.{marker}" if i % 10 == 0 else "c.plain" for i in range(200)]
    data = [f"{marker}-{i}".encode() if i % 10 == 0 else b"p" for i in range(200)]
    answer = js.publish_batch(PlainBatch(subjects, pa.array(data, pa.binary())))
    assert isinstance(answer, AckRun) and answer.count == 200, answer
    store = js.stream("C").store
    assert isinstance(store, DeltaStore)
    assert marker.encode() in _held_bytes(store)
    registry(js.layout).erase(js.stream("C"), filter_=f"c.{marker}")
    assert marker.encode() not in _held_bytes(store)
    js.flush()
    assert js.stream_info("C")["state"]["messages"] == 180
    assert [js.get_message("C", s).data for s in range(2, 11)] == [b"p"] * 9


def test_a_memory_stream_forgets_erased_messages(js: JetStream) -> None:
    js.add_stream({"name": "M", "subjects": ["m.>"], "storage": "memory"})
    marker = "zq7" + secrets.token_hex(8)
    _pub(js, f"m.{marker}", marker.encode())
    _pub(js, "m.plain", b"x")
    js.purge("M", f"m.{marker}")
    answer = registry(js.layout).erase(js.stream("M"), filter_=f"m.{marker}")
    assert answer["messages"] == 1
    buffer = js.stream("M").store.buffer  # type: ignore[attr-defined]
    held = b"".join(
        rows.message(i).data + rows.subjects[i].encode() for rows in buffer._batches for i in range(len(rows)))
    assert marker.encode() not in held and b"x" in held
