"""Reads from a stream's table: row groups found by compact bounds, decoded through a footer of their
own entries alone, within a byte budget that the table's size does not move.

At 100 M messages a table's parsed footers (2-3 MB each, ~224 files) did not fit the 64 MB row-group
cache and every random read parsed one again. Now a file's footer is read once into its row groups'
bounds (engine/store/parquet_footer.py, ~41 bytes a group) and a read parses the entries of the groups
it decodes. What the cache drops is freed at once, not at the next cyclic collection: the gateway runs
Python's cyclic collector rarely (api/cli.py: `gc.freeze`, high thresholds), and pyarrow's
`FileMetaData.schema` made every parsed footer such an object (the gateway grew ~3 MB a read).
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from engine import EngineOptions, JetStream, ManualClock, PubAck
from engine.errors import JetStreamError
from engine.messages import PlainBatch
from engine.store.delta import DeltaStore
from engine.store.parquet_footer import FileBounds
from tests.conftest import reopen

_LOCAL = pafs.LocalFileSystem()
_COLUMNS = ["seq", "subject", "ts", "msg_id", "headers", "data", "size"]


def _publish(js: JetStream, stream: str, count: int, clock: ManualClock, per_flush: int) -> None:
    """`count` messages on 7 subjects, a millisecond apart, flushed every `per_flush` (one file each)."""
    for start in range(0, count, per_flush):
        n = min(per_flush, count - start)
        for i in range(start, start + n, 500):
            k = min(500, start + n - i)
            payloads = pa.array([f"m-{j}".encode() for j in range(i, i + k)], pa.binary())
            js.publish_batch(PlainBatch([f"{stream.lower()}.{j % 7}" for j in range(i, i + k)], payloads))
            clock.advance(1_000_000)
        js.flush()


def _files(js: JetStream, stream: str) -> list[str]:
    files = sorted(str(p) for p in Path(js.layout.stream_table(stream)).rglob("*.parquet"))
    assert files
    return files


def test_a_footer_of_chosen_entries_reads_what_the_whole_footer_reads(js: JetStream, clock: ManualClock,
                                                                        tmp_path: Path) -> None:
    js.add_stream({"name": "F", "subjects": ["f.>"]})
    _publish(js, "F", 12_000, clock, 12_000)  # one file of 12 row groups, written by delta-rs
    other = tmp_path / "pyarrow.parquet"  # and a file of another writer (parquet-cpp's field layout)
    whole_table = pq.read_table(_files(js, "F")[0])
    pq.write_table(whole_table, other, row_group_size=700)
    for path in (_files(js, "F")[0], str(other)):
        whole = pq.ParquetFile(path)
        bounds = FileBounds.read(path, _LOCAL, ("msg_id", "headers"))
        assert len(bounds) == whole.metadata.num_row_groups >= 12
        assert bounds.nbytes < 64 * len(bounds) + 8192, "bounds cost tens of bytes a row group"
        seqs = whole.read(columns=["seq"]).column("seq").to_numpy()
        for g in range(len(bounds)):
            rows = whole.metadata.row_group(g)
            part = seqs[sum(whole.metadata.row_group(i).num_rows for i in range(g)):][: rows.num_rows]
            assert (bounds.lows[g], bounds.highs[g], bounds.rows[g]) == (part.min(), part.max(), rows.num_rows)
        assert bounds.empty(3, "msg_id") and bounds.empty(3, "headers") and not bounds.empty(3, "data")
        for groups in ([0], [5], [len(bounds) - 1], [1, 2, 3], [0, 4, 5, len(bounds) - 1]):
            with _LOCAL.open_input_file(path) as file:
                meta = bounds.metadata(file, groups)
                assert meta.num_row_groups == len(groups)
                got = pq.ParquetFile(file, metadata=meta).read_row_groups(list(range(len(groups))), columns=_COLUMNS)
            assert got.equals(whole.read_row_groups(groups, columns=_COLUMNS)), (path, groups)


def test_reads_stay_exact_within_a_budget_smaller_than_the_tables_bounds(warehouse: Path, clock: ManualClock) -> None:
    js = JetStream(warehouse, EngineOptions(cache_bytes=256 * 1024), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": "B", "subjects": ["b.>"]})
        start = clock.now_ns()
        _publish(js, "B", 40_000, clock, 4_000)  # 10 files of 4 row groups
        js.delete_message("B", 777)
        js.delete_message("B", 30_001, erase=False)
        js = reopen(js, clock, cache_bytes=256 * 1024)  # every read from the table
        stream = js.stream("B")
        store = stream.store
        assert isinstance(store, DeltaStore)
        cache = store.reads._row_groups
        cache.bounds_budget = 3 * FileBounds.read(_files(js, "B")[0], _LOCAL).nbytes  # fewer than the files
        rng = random.Random(5)
        for seq in [rng.randrange(1, 40_001) for _ in range(300)] + [1, 40_000]:
            if seq in (777, 30_001):
                continue
            msg = js.get_message("B", seq)
            assert (msg.seq, msg.subject, msg.data) == (seq, f"b.{(seq - 1) % 7}", f"m-{seq - 1}".encode())
            assert cache.nbytes <= cache.budget and cache._files_bytes <= cache.bounds_budget
        for seq in (777, 30_001):
            with pytest.raises(JetStreamError):
                js.get_message("B", seq)
        for seq in [rng.randrange(1, 40_001) for _ in range(100)] + [777, 30_001]:
            since = start + (seq - 1) // 500 * 1_000_000  # when the batch of `seq` was stamped
            first = (seq - 1) // 500 * 500 + 1
            expected = first + (first == 777) + (first == 30_001)  # a removed message is skipped
            assert stream.at_or_after_time(since).seq == expected, seq
        assert len(cache._files) <= 3 and cache.nbytes <= cache.budget
    finally:
        js.close()


def test_a_read_through_the_cache_leaves_no_cyclic_garbage(js: JetStream, clock: ManualClock) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    _publish(js, "S", 3000, clock, 3000)
    store = js.stream("S").store
    assert isinstance(store, DeltaStore)
    path = _files(js, "S")[0]
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        bounds = FileBounds.read(path, _LOCAL)
        assert bounds.schema.names[:3] == ["seq", "subject", "ts"] and int(bounds.rows.sum()) == 3000
        assert np.all(bounds.lows <= bounds.highs)
        del bounds
        assert gc.collect() == 0, "a file's bounds were left for the cyclic collector"
        cache = store.reads._row_groups
        cache.clear()
        assert cache.find(path, 1234) is not None  # what a read by sequence reads and keeps
        assert cache.nbytes > 0
        cache.clear()  # and what the cache drops
        assert gc.collect() == 0, "a read dropped by the cache was left for the cyclic collector"
    finally:
        if was_enabled:
            gc.enable()


def _expect(js: JetStream, stream: str, seq: int) -> None:
    msg = js.get_message(stream, seq)
    assert (msg.seq, msg.subject, msg.data) == (seq, f"{stream.lower()}.{(seq - 1) % 7}", f"m-{seq - 1}".encode())


def test_whole_footers_are_kept_parsed_only_while_every_held_files_fit_their_share(
        warehouse: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch) -> None:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": "W", "subjects": ["w.>"]})
        _publish(js, "W", 24_000, clock, 4_000)  # 6 files of 4 row groups
        js = reopen(js, clock)
        store = js.stream("W").store
        assert isinstance(store, DeltaStore)
        cache = store.reads._row_groups
        for seq in range(1, 24_001, 997):
            _expect(js, "W", seq)
        assert set(cache._footers) == set(cache._files) and len(cache._files) == 6, "every file's footer kept"
        assert cache._footers_bytes == sum(b.parsed_nbytes for b in cache._files.values()) <= cache.footers_budget
        assert cache.nbytes <= cache.budget

        cache.clear()
        cache.footers_budget = 3 * FileBounds.read(_files(js, "W")[0], _LOCAL).parsed_nbytes
        parses: list[int] = []
        whole_metadata = FileBounds.whole_metadata
        monkeypatch.setattr(FileBounds, "whole_metadata",
                            lambda self, file: parses.append(1) or whole_metadata(self, file))
        rng = random.Random(7)
        for seq in [rng.randrange(1, 24_001) for _ in range(200)]:
            _expect(js, "W", seq)
            assert cache._footers_bytes <= cache.footers_budget and cache.nbytes <= cache.budget
        assert len(cache._files) == 6 and len(cache._footers) <= 3
        assert len(parses) <= 3, "past a share of 3 files' footers, random reads parse no whole footer"
    finally:
        js.close()


def test_a_kept_footer_never_serves_a_file_replaced_purged_or_erased(engine: list[JetStream],
                                                                      clock: ManualClock) -> None:
    js = engine[0]
    js.add_stream({"name": "R", "subjects": ["r.>"]})
    _publish(js, "R", 9_000, clock, 3_000)  # 3 files of 3 row groups
    js = engine[0] = reopen(js, clock)  # every read from the table
    store = js.stream("R").store
    assert isinstance(store, DeltaStore)
    cache = store.reads._row_groups
    for seq in (1, 2_500, 4_000, 8_999):
        _expect(js, "R", seq)
    assert len(cache._footers) == 3

    path = next(p for p in _files(js, "R") if pq.read_table(p, columns=["seq"]).column("seq")[0].as_py() == 1)
    pq.write_table(pq.read_table(path), path, row_group_size=333)  # the same rows in other groups, same name
    store.reads._row_groups._entries.clear()  # no decoded group left to answer: the file is read again
    for seq in (1, 334, 2_000, 3_000):
        _expect(js, "R", seq)
    assert len(cache._files[path]) == 10, "the replaced file's bounds are read again"

    js.purge("R", "r.3")
    js.delete_message("R", 5_000)  # an erasure: the message leaves every read at once
    for seq in (4, 11, 5_000):  # r.3
        with pytest.raises(JetStreamError):
            js.get_message("R", seq)
    for seq in (1, 4_999, 5_001, 8_998):
        _expect(js, "R", seq)

    js = engine[0] = reopen(js, clock)
    for seq in (4, 5_000):
        with pytest.raises(JetStreamError):
            js.get_message("R", seq)
    for seq in (1, 334, 4_999, 5_001, 8_998):
        _expect(js, "R", seq)


def test_point_reads_through_the_last_row_group_are_exact_and_an_erase_drops_it(js: JetStream, clock: ManualClock) -> None:
    """A KV bucket's gets of keys written one after another land in one row group: the group that answered
    the last point read answers the next without the file list (table_reads.py `message`). Its rows
    read exactly as the whole way reads them (headers and msg ids too), a sequence outside it goes the
    whole way, and an erase drops it with every other decoded row."""
    js.add_stream({"name": "K", "subjects": ["$KV.k.>"], "allow_direct": True})
    expected: dict[int, tuple[str, bytes, dict[str, list[str]] | None]] = {}
    for i in range(3000):
        headers = {"Nats-Msg-Id": [f"id-{i}"], "X-Key": [str(i)]} if i % 5 == 0 else None
        ack = js.publish_one(f"$KV.k.{i}", f"v-{i}".encode(), headers)
        assert isinstance(ack, PubAck)
        expected[ack.seq] = (f"$KV.k.{i}", f"v-{i}".encode(), headers)
        clock.advance(1000)
    js = reopen(js, clock)  # every read from the table
    stream = js.stream("K")
    store = stream.store
    assert isinstance(store, DeltaStore)
    rng = random.Random(7)
    order = list(expected) + [rng.randrange(1, 3001) for _ in range(300)]
    for i, seq in enumerate(order):
        msg = stream.last_by_subject(expected[seq][0]) if i % 2 else js.get_message("K", seq)
        assert (msg.seq, msg.subject, msg.data, msg.headers) == (seq, *expected[seq]), seq
        assert msg.msg_id == (expected[seq][2] or {}).get("Nats-Msg-Id", [None])[0]
    hint = store.reads._point_hint
    assert hint is not None and hint[0] <= order[-1] <= hint[1]
    js.delete_message("K", order[-1], erase=True)
    assert store.reads._point_hint is None
    with pytest.raises(JetStreamError):
        js.get_message("K", order[-1])
    js.close()


def _publish_distinct(js: JetStream, stream: str, count: int, per_flush: int, clock: ManualClock) -> None:
    """`count` messages, each on its own subject `<stream>.<i>` with payload `v-<i>`, a file per `per_flush`."""
    for start in range(0, count, per_flush):
        subjects = [f"{stream.lower()}.{i}" for i in range(start, min(count, start + per_flush))]
        payloads = pa.array([f"v-{s.split('.')[1]}".encode() for s in subjects], pa.binary())
        js.publish_batch(PlainBatch(subjects, payloads))
        clock.advance(1_000_000)
        js.flush()


def _expect_last(js: JetStream, stream: str, i: int) -> None:
    msg = js.stream(stream).last_by_subject(f"{stream.lower()}.{i}")
    assert (msg.seq, msg.subject, msg.data) == (i + 1, f"{stream.lower()}.{i}", f"v-{i}".encode()), i


def test_a_last_by_subject_read_decodes_no_subjects_and_a_read_that_needs_them_decodes_them(
        engine: list[JetStream], clock: ManualClock) -> None:
    """The index knows a literal subject's last sequence, so its row group is decoded without the
    `subject` column; a read by sequence that does not know the subject, or a consumer's window, gets the
    group decoded whole in its place, and both read exactly."""
    js = engine[0]
    js.add_stream({"name": "L", "subjects": ["l.>"]})
    _publish_distinct(js, "L", 3_000, 1_000, clock)
    js = engine[0] = reopen(js, clock)  # every read from the table
    store = js.stream("L").store
    assert isinstance(store, DeltaStore)
    cache = store.reads._row_groups
    _expect_last(js, "L", 1_500)
    [lean] = cache.windows()
    assert not lean.has_subject and "subject" not in lean.table.column_names
    hint = store.reads._point_hint
    assert hint is not None and cache.cached(hint[2]) is lean

    path, group = hint[2]
    bounds = cache.bounds(path)
    whole = cache.window(path, bounds, group)  # a read that does not know the subject
    assert whole.has_subject and cache.windows() == [whole]
    seq = int(whole.seqs[3])
    msg = whole.get(seq)
    assert msg is not None and (msg.subject, msg.data) == (f"l.{seq - 1}", f"v-{seq - 1}".encode())
    assert cache.window(path, bounds, group, subjects=False) is whole, "a whole group answers a lean read"
    for i in (0, 999, 1_000, 1_499, 1_501, 2_999):
        _expect_last(js, "L", i)

    store.reads.forget()
    _expect_last(js, "L", 2_000)
    path, group = store.reads._point_hint[2]
    listed = cache.window(path, cache.bounds(path), group, listed=True)  # a consumer's window
    assert listed.has_subject and listed.listed
    assert [js.get_message("L", s).subject for s in (1_999, 2_001, 2_003)] == ["l.1998", "l.2000", "l.2002"]


def test_lean_last_by_subject_reads_stay_exact_after_erase_purge_eviction_and_a_replaced_file(
        engine: list[JetStream], clock: ManualClock) -> None:
    """Erased and purged messages never come back through a group decoded without subjects, the last
    point read's group answers only while the cache holds it (its bytes are the cache's), and a file
    replaced under its name is read again."""
    js = engine[0]
    js.add_stream({"name": "L", "subjects": ["l.>"]})
    _publish_distinct(js, "L", 3_000, 1_000, clock)
    js = engine[0] = reopen(js, clock)
    store = js.stream("L").store
    assert isinstance(store, DeltaStore)
    cache = store.reads._row_groups
    stream = js.stream("L")
    for i in (41, 42, 43):
        _expect_last(js, "L", i)

    js.delete_message("L", 43, erase=True)  # l.42's only message
    js.purge("L", "l.41")
    for subject in ("l.42", "l.41"):
        with pytest.raises(JetStreamError):
            stream.last_by_subject(subject)
    _expect_last(js, "L", 40)
    js.publish_one("l.41", b"again")
    js.flush()
    msg = stream.last_by_subject("l.41")
    assert (msg.seq, msg.subject, msg.data) == (3_001, "l.41", b"again")

    _expect_last(js, "L", 2_500)
    hint = store.reads._point_hint
    assert hint is not None
    cache._entries.clear()  # the group left the cache (evicted): the hint holds no window of its own
    assert cache.cached(hint[2]) is None
    _expect_last(js, "L", 2_501)
    assert len(cache.windows()) == 1

    path = next(p for p in _files(js, "L") if pq.read_table(p, columns=["seq"]).column("seq")[0].as_py() == 1_001)
    pq.write_table(pq.read_table(path), path, row_group_size=333)  # the same rows in other groups, same name
    cache._entries.clear()
    for i in (1_000, 1_400, 1_999):
        _expect_last(js, "L", i)
    assert len(cache._files[path]) == 4, "the replaced file's bounds are read again"

    js = engine[0] = reopen(js, clock)
    for subject in ("l.42",):
        with pytest.raises(JetStreamError):
            js.stream("L").last_by_subject(subject)
    msg = js.stream("L").last_by_subject("l.41")
    assert (msg.seq, msg.data) == (3_001, b"again")
    for i in (0, 40, 1_400, 2_999):
        _expect_last(js, "L", i)


def test_a_pull_through_row_groups_of_several_partitions_reads_each_message_once_in_order(
        js: JetStream, clock: ManualClock) -> None:
    """A pull's messages from the table (`windowed_many`): the row groups of three partitions overlap in
    sequences, so a sequence in one group's range may be in another's; a deleted one is left out, and
    those past the row groups at hand are read through the next window."""
    js.add_stream({"name": "P", "subjects": ["a.>", "b.>", "c.>"]})
    subjects = [f"{'abc'[i % 3 if i < 3_000 else 0]}.{i % 11}" for i in range(6_000)]
    for start in range(0, 6_000, 500):
        payloads = pa.array([f"m-{j}".encode() for j in range(start, start + 500)], pa.binary())
        js.publish_batch(PlainBatch(subjects[start:start + 500], payloads))
        clock.advance(1_000_000)
    js.flush()
    js.delete_message("P", 1_234, erase=False)
    stream = js.stream("P")
    assert isinstance(stream.store, DeltaStore)
    with stream.lock:
        stream.store.shed_caches(stream.index)  # nothing from the buffer: every message from the table
    seqs = list(range(1, 6_001))
    read: dict[int, object] = {}
    for start in range(0, 6_000, 500):  # pulls of 500, as a consumer makes them
        read.update(stream.store.load_many(seqs[start:start + 500], stream.index))
    assert list(read) == [s for s in seqs if s != 1_234]
    assert all(read[s].subject == subjects[s - 1] and read[s].data == f"m-{s - 1}".encode() for s in read)
