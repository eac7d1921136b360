"""A consumer's batch read (`load_many`: the buffer's row groups a group at a time) returns what
reading each message alone returns: plain and header-carrying groups, runs across groups, deleted
and erased messages, and sequences past the stream's end."""

from __future__ import annotations

import pyarrow as pa

from engine import JetStream, PlainBatch


def one_by_one(js: JetStream, seqs: list[int]) -> dict[int, object]:
    stream = js.stream("S")
    found = {}
    for seq in seqs:
        msg = stream.store.load(seq, stream.index)
        if msg is not None:
            found[seq] = msg
    return found


def test_load_many_matches_single_loads(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for size in (3, 1, 7):
        payloads = pa.array([b"p%d" % i for i in range(size)], pa.binary())
        js.publish_batch(PlainBatch([f"s.{i}" for i in range(size)], payloads))
    js.publish_one("s.h", b"with headers", {"K": ["v"]})
    js.publish_batch(PlainBatch(["s.a", "s.b"], pa.array([b"", b"last"], pa.binary())))
    last = js.stream("S").index.last_seq
    assert last == 14
    js.delete_message("S", 2, erase=False)
    js.delete_message("S", 5, erase=True)
    stream = js.stream("S")
    for seqs in (list(range(1, last + 3)), [1, 3, 4, 11, 12, 13, 20], [13], [6, 7, 8, 9, 10]):
        got = stream.store.load_many(seqs, stream.index)
        want = one_by_one(js, seqs)
        assert got == want
        assert list(got) == sorted(got)
        assert 2 not in got and 5 not in got and 20 not in got
    assert stream.store.load_many([12], stream.index)[12].headers == {"K": ["v"]}
    assert stream.store.load_many([13], stream.index)[13].data == b""
    js.flush()
    assert stream.store.load_many(list(range(1, last + 1)), stream.index) == one_by_one(js, list(range(1, last + 1)))
