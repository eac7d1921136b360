"""The index after a restart: from its snapshot, from the table when there is none, and never wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from deltalake import DeltaTable

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine.errors import NoMessageFoundError
from engine.store import index_file
from engine.store.delta import DeltaStore
from engine.store.parquet_footer import FileBounds
from engine.store.stream_recovery import StreamRecovery

SUBJECTS = [f"work.{i % 7}" for i in range(7)]


def _fill(js: JetStream, batches: int = 6, size: int = 500) -> None:
    js.add_stream({"name": "WORK", "subjects": ["work.>"]})
    for b in range(batches):
        js.publish([InboundMessage(SUBJECTS[i % 7], f"{b}-{i}".encode()) for i in range(size)])
    js.flush()


def _crash(js: JetStream) -> None:
    """What a kill -9 leaves: no final flush, no snapshot; the warehouse is let go."""
    for stream in js.streams():  # the streams opened: the others have no log open
        stream.store.wal.close()
    js.consumers.acks.wal.close()
    js._owner.release()


def _open(warehouse: Path, clock: ManualClock) -> JetStream:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    return js


def _state(js: JetStream) -> tuple[object, ...]:
    ix = js.stream("WORK").index
    return (ix.msgs, ix.bytes, ix.first_seq, ix.last_seq, ix.num_subjects, ix.live_seqs().tolist(),
            {s: ix.subject_state(s) for s in SUBJECTS}, ix.last_seqs(">").tolist())


def _table_reads(js: JetStream) -> list[tuple[int, int]]:
    """Records the ranges the stream's index reads back from the table from now on."""
    store = js.stream("WORK").store
    assert isinstance(store, DeltaStore)
    calls: list[tuple[int, int]] = []
    read = store.reads.index_rows

    def counting(lo: int, hi: int):  # type: ignore[no-untyped-def]
        calls.append((lo, hi))
        return read(lo, hi)

    js.stream("WORK").index.loader = counting
    return calls


def test_a_crash_rebuilds_the_index_from_the_table_in_sequence_order(warehouse: Path, clock: ManualClock) -> None:
    js = _open(warehouse, clock)
    _fill(js)
    js.stream("WORK").remove_seqs(np.arange(100, 200, dtype=np.int64), "delete")
    js.purge("WORK", "work.3")
    before = _state(js)
    _crash(js)
    again = _open(warehouse, clock)
    try:
        assert _state(again) == before
        ix = again.stream("WORK").index
        assert ix.live_mask(np.arange(1, 3001)).sum() == before[0]
    finally:
        again.close()


def test_a_clean_restart_reads_the_index_snapshot_not_the_table(warehouse: Path, clock: ManualClock) -> None:
    js = _open(warehouse, clock)
    _fill(js)
    js.purge("WORK", keep=2000)
    before = _state(js)
    js.close()
    snapshot = js.layout.index_snapshot("WORK")
    assert snapshot.exists()
    meta, _ = index_file.decode(snapshot.read_bytes())
    assert meta["flushed_seq"] == 3000
    again = JetStream(warehouse, EngineOptions(), clock=clock)
    read = StreamRecovery._read_table_into
    reads: list[int] = []

    def watched(recovery: StreamRecovery, index: object, flushed_seq: int) -> None:
        reads.append(flushed_seq)
        rows_before = index.msgs  # type: ignore[attr-defined]
        read(recovery, index, flushed_seq)  # type: ignore[arg-type]
        assert index.msgs == rows_before, "nothing flushed after the snapshot, so nothing is read into the index"  # type: ignore[attr-defined]

    StreamRecovery._read_table_into = watched  # type: ignore[method-assign]
    try:
        again.open(start_flusher=False)
    finally:
        StreamRecovery._read_table_into = read  # type: ignore[method-assign]
    try:
        store = again.stream("WORK").store
        assert isinstance(store, DeltaStore) and store.reads._files.version == -1, "not even its file list"
        calls = _table_reads(again)
        assert _state(again) == before
        assert reads == [], "the snapshot is current (nothing committed after it): the table is not read"
        assert calls == [] or all(lo >= 1 for lo, _ in calls)
    finally:
        again.close()


def test_messages_and_removals_after_the_snapshot_are_read_back(warehouse: Path, clock: ManualClock) -> None:
    js = _open(warehouse, clock)
    _fill(js, batches=2)
    js.close()  # a snapshot at seq 1000
    js = _open(warehouse, clock)
    js.publish([InboundMessage("work.9", b"after") for _ in range(300)])
    js.flush()  # flushed after the snapshot: in the table only
    js.purge("WORK", "work.1")  # a tombstone after the snapshot
    js.publish([InboundMessage("work.8", b"logged") for _ in range(5)])  # in the log only
    before = _state(js)
    ix = js.stream("WORK").index
    expected = {s: ix.subject_state(s) for s in ("work.8", "work.9", "work.1")}
    _crash(js)
    again = _open(warehouse, clock)
    try:
        assert _state(again) == before
        ix = again.stream("WORK").index
        assert {s: ix.subject_state(s) for s in expected} == expected
        assert again.get_message("WORK", ix.last_seq).data == b"logged"
    finally:
        again.close()


def test_a_damaged_or_foreign_snapshot_is_ignored(warehouse: Path, clock: ManualClock) -> None:
    js = _open(warehouse, clock)
    _fill(js, batches=2)
    before = _state(js)
    js.close()
    path = js.layout.index_snapshot("WORK")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    again = _open(warehouse, clock)
    try:
        assert _state(again) == before
    finally:
        again.close()
    # A stream deleted and made again under the same name must not take its predecessor's snapshot.
    js = _open(warehouse, clock)
    stale = path.read_bytes()
    js.delete_stream("WORK")
    js.add_stream({"name": "WORK", "subjects": ["work.>"]})
    js.publish([InboundMessage("work.1", b"new")])
    js.flush()
    _crash(js)
    path.write_bytes(stale)
    again = _open(warehouse, clock)
    try:
        ix = again.stream("WORK").index
        assert (ix.msgs, ix.first_seq, ix.last_seq) == (1, 1, 1)
    finally:
        again.close()


def test_an_erased_subject_leaves_no_name_in_the_next_snapshot(warehouse: Path, clock: ManualClock) -> None:
    from engine.erasures import registry

    js = _open(warehouse, clock)
    js.add_stream({"name": "WORK", "subjects": ["work.>"]})
    js.publish([InboundMessage("work.keep", b"k"), InboundMessage("work.secretmarker", b"s")])
    js.flush()
    registry(js.layout).erase(js.stream("WORK"), filter_="work.secretmarker")
    js.close()
    path = js.layout.index_snapshot("WORK")
    assert path.exists() and b"secretmarker" not in index_file.plain_bytes(path.read_bytes())
    again = _open(warehouse, clock)
    try:
        assert again.stream("WORK").index.subject_state("work.keep") == (1, 1, 1)
    finally:
        again.close()


def _v1_bytes(meta: dict[str, object], arrays: dict[str, np.ndarray]) -> bytes:
    """A snapshot as the previous version wrote it (JLX1: full-width arrays, no compression)."""
    import struct

    import orjson
    import xxhash

    specs = [[name, a.dtype.str, int(a.size)] for name, a in arrays.items()]
    header = orjson.dumps({"meta": meta, "arrays": specs})
    body = struct.pack("<I", len(header)) + header + b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    return struct.pack("<4sQ16s", b"JLX1", len(body), xxhash.xxh3_128_digest(body)) + body


def test_a_snapshot_in_the_previous_format_still_loads(warehouse: Path, clock: ManualClock) -> None:
    """A JLX1 snapshot (int64 histogram counts, uncompressed) is read as it is, without the table; the
    next one is written compressed (JLX2) and loads to the same state."""
    js = _open(warehouse, clock)
    _fill(js)
    js.purge("WORK", keep=2000)
    before = _state(js)
    js.close()
    path = js.layout.index_snapshot("WORK")
    meta, arrays = index_file.decode(path.read_bytes())
    arrays["hist_counts"] = arrays["hist_counts"].astype(np.int64)
    old = _v1_bytes(meta, arrays)
    assert len(old) > path.stat().st_size
    path.write_bytes(old)
    again = _open(warehouse, clock)
    try:
        store = again.stream("WORK").store
        assert isinstance(store, DeltaStore) and store.reads._files.version == -1, "the table was not opened"
        assert _state(again) == before
        again.publish([InboundMessage("work.1", b"more")])
    finally:
        again.close()
    assert path.read_bytes()[:4] == index_file.MAGIC
    third = _open(warehouse, clock)
    try:
        assert third.stream("WORK").index.msgs == before[0] + 1
    finally:
        third.close()


def test_a_compressed_snapshot_keeps_every_array_exact() -> None:
    rng = np.random.default_rng(5)
    arrays = {
        "sorted": np.cumsum(rng.integers(0, 3, 50_000)).astype(np.int64) + 1_700_000_000_000_000_000,
        "wide": rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, 1000, dtype=np.int64),
        "extremes": np.array([np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0, -1], np.int64),
        "hashes": rng.integers(0, np.iinfo(np.uint64).max, 1000, dtype=np.uint64),
        "small": rng.integers(0, 200, 1000).astype(np.int32),
        "bytes": np.frombuffer(b"names", np.uint8),
        "one": np.array([7], np.int64),
        "none": np.zeros(0, np.int64),
    }
    meta, out = index_file.decode(index_file.encode({"k": 1}, arrays))
    assert meta == {"k": 1} and out.keys() == arrays.keys()
    for name, array in arrays.items():
        assert out[name].dtype == array.dtype and out[name].tolist() == array.tolist(), name
        assert out[name].flags.writeable


def test_a_snapshot_of_one_zstd_frame_reads_as_one_of_a_frame_an_array() -> None:
    """Snapshots are written as a zstd frame per array (the body is never whole in memory); those written
    before, the whole body in one frame, read back the same, as do damaged frames fail the same."""
    arrays = {"seqs": np.arange(1, 200_001, dtype=np.int64), "names": np.frombuffer(b"a.b" * 1000, np.uint8),
              "ids": (np.arange(200_000) % 977).astype(np.int32), "none": np.zeros(0, np.int64)}
    framed = index_file.encode({"k": 2}, arrays)
    meta, out = index_file.decode(framed)
    header = orjson.dumps({"meta": meta, "arrays": _specs(framed)})
    body = index_file._LEN.pack(len(header)) + header + b"".join(
        index_file._packed(a)[0].tobytes() for a in arrays.values())
    payload = index_file._RAW_LEN.pack(len(body)) + pa.Codec("zstd", 3).compress(body, asbytes=True)
    single = index_file._HEAD.pack(index_file.MAGIC, len(payload), xxhash.xxh3_128_digest(payload)) + payload
    assert single != framed and index_file.plain_bytes(single) == index_file.plain_bytes(framed) == body
    meta_single, out_single = index_file.decode(single)
    assert meta_single == meta == {"k": 2}
    for name, array in arrays.items():
        assert out[name].tolist() == out_single[name].tolist() == array.tolist(), name
    cut = bytearray(framed)
    cut[-3] ^= 0xFF
    with pytest.raises(ValueError, match="damaged"):
        index_file.decode(bytes(cut))


def _specs(data: bytes) -> list:
    body = index_file.plain_bytes(data)
    (length,) = index_file._LEN.unpack_from(body, 0)
    return orjson.loads(body[index_file._LEN.size : index_file._LEN.size + length])["arrays"]


def test_a_get_by_time_after_a_restart_finds_the_first_live_message_at_or_after_it(warehouse: Path,
                                                                                     clock: ManualClock) -> None:
    """After a restart the index searches cold blocks by time in the table, a row group at a time, by the
    row groups' and files' `ts` statistics: exact for any time, also inside a file's last millisecond (the
    Delta log's statistics are cut to milliseconds), and deleted messages are skipped."""
    js = _open(warehouse, clock)
    js.add_stream({"name": "WORK", "subjects": ["work.>"]})
    for _ in range(4):  # four files; timestamps 0.33 ms apart, so files end inside a millisecond
        for i in range(300):
            clock.advance(333_337)
            js.publish_one(SUBJECTS[i % 7], b"x")
        js.flush()
    deleted = {299, 300, 301, 600, 1200}
    for seq in sorted(deleted):
        js.delete_message("WORK", seq)
    js.flush()
    table = DeltaTable(str(js.layout.stream_table("WORK"))).to_pyarrow_table(columns=["seq", "ts"]).sort_by("seq")
    stamped = [(seq, ts * 1000) for seq, ts in zip(table.column("seq").to_pylist(),
                                                   table.column("ts").cast(pa.int64()).to_pylist(), strict=True)
               if seq not in deleted]  # stored in microseconds
    assert len(stamped) == 1200 - len(deleted)
    js.close()
    js = _open(warehouse, clock)
    try:
        stream = js.stream("WORK")
        assert not stream.index.holds_detail(1), "the search reads the table, not a block's detail"
        ends = [(seq, ts) for seq, ts in stamped if seq in (298, 599, 900, 1199)]  # each file's last live message
        probes = sorted({t + d for _, t in stamped[::7] + stamped[295:305] + ends + stamped[-3:] for d in (-1, 0, 1)})
        for t in probes:
            expected = next((seq for seq, ts in stamped if ts >= t), None)
            if expected is None:
                with pytest.raises(NoMessageFoundError):
                    stream.at_or_after_time(t)
            else:
                assert stream.at_or_after_time(t).seq == expected, t
    finally:
        js.close()


def _held_bounds(js: JetStream) -> dict[str, object]:
    store = js.stream("WORK").store
    assert isinstance(store, DeltaStore)
    return store.reads._row_groups.held_files()


def _table_files(warehouse: Path) -> set[str]:
    table = warehouse / "default" / "streams" / "WORK"
    return {str(p) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


def test_files_bounds_are_written_at_commit_and_survive_a_restart(warehouse: Path, clock: ManualClock) -> None:
    js = _open(warehouse, clock)
    js.add_stream({"name": "WORK", "subjects": ["work.>"]})
    for b in range(6):  # a commit, so a file, per batch
        js.publish([InboundMessage(SUBJECTS[i % 7], f"{b}-{i}".encode()) for i in range(500)])
        js.flush()
    held = _held_bounds(js)
    assert len(held) == 6 and set(held) == _table_files(warehouse), "each commit read its new file's bounds"
    expected = {path: (b.lows.tolist(), b.highs.tolist(), b.last_ts.tolist(), b.size)  # type: ignore[attr-defined]
                for path, b in held.items()}
    js.close()
    meta, arrays = index_file.decode(js.layout.index_snapshot("WORK").read_bytes())
    assert len(meta["file_bounds"]["paths"]) == len(expected)
    footers: list[str] = []
    read = FileBounds.read

    def counted(path: str, *args: object) -> FileBounds:
        footers.append(path)
        return read(path, *args)  # type: ignore[arg-type]

    FileBounds.read = counted  # type: ignore[method-assign,assignment]
    again = _open(warehouse, clock)
    try:
        for seq in (1, 2, 800, 1500, 2999, 3000):
            b, i = divmod(seq - 1, 500)
            assert again.get_message("WORK", seq).data == f"{b}-{i}".encode()
        start = again.stream("WORK").index.first_ts
        assert again.stream("WORK").at_or_after_time(start).seq == 1
        held = _held_bounds(again)
        assert {path: (b.lows.tolist(), b.highs.tolist(), b.last_ts.tolist(), b.size)  # type: ignore[attr-defined]
                for path, b in held.items()} == expected
        assert footers == [], "reads by sequence and by time chose their row groups without a footer"
    finally:
        FileBounds.read = read  # type: ignore[method-assign]
        again.close()


def test_a_snapshot_whose_checksum_fails_leaves_bounds_to_the_footers(warehouse: Path, clock: ManualClock) -> None:
    js = _open(warehouse, clock)
    _fill(js)
    before = _state(js)
    js.close()
    path = js.layout.index_snapshot("WORK")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))
    assert index_file.read(js.layout.objects, js.layout.index_snapshot_key("WORK")) is None
    again = _open(warehouse, clock)
    try:
        assert _state(again) == before, "the index is rebuilt from the table"
        assert again.get_message("WORK", 2999).data == b"5-498"
        assert set(_held_bounds(again)) <= _table_files(warehouse)
    finally:
        again.close()
    js = _open(warehouse, clock)  # the close above wrote a whole snapshot again, bounds with it
    try:
        meta, _ = index_file.decode(path.read_bytes())
        assert meta["file_bounds"]["paths"]
        assert js.get_message("WORK", 1).data == b"0-0"
    finally:
        js.close()


def test_bounds_from_a_snapshot_meet_a_file_rewritten_in_place_at_its_size(warehouse: Path,
                                                                           clock: ManualClock) -> None:
    """A file rewritten under its name at the size the Delta log records (another writer's layout, padded
    between its pages and its footer) passes a size check: the snapshot's bounds describe a footer that is
    no longer there. The first read of that file finds it out and reads the file's own footer."""
    js = _open(warehouse, clock)
    js.add_stream({"name": "WORK", "subjects": ["work.>"]})
    for b in range(3):
        js.publish([InboundMessage(SUBJECTS[i % 7], f"{b}-{i}".encode()) for i in range(500)])
        js.flush()
    js.close()
    path = next(p for p in sorted(_table_files(warehouse)) if pq.read_table(p).column("seq")[0].as_py() == 501)
    out = pa.BufferOutputStream()
    pq.write_table(pq.read_table(path), out, compression="zstd", compression_level=19, store_schema=False)
    raw, size = out.getvalue().to_pybytes(), Path(path).stat().st_size
    assert len(raw) <= size, "the rewritten file must fit the size the Delta log records"
    footer = len(raw) - 8 - int.from_bytes(raw[-8:-4], "little")
    Path(path).write_bytes(raw[:footer] + bytes(size - len(raw)) + raw[footer:])
    again = _open(warehouse, clock)
    try:
        assert [again.get_message("WORK", seq).data for seq in (1, 501, 777, 1000, 1001, 1500)] == [
            b"0-0", b"1-0", b"1-276", b"1-499", b"2-0", b"2-499"]
        rewritten = _held_bounds(again)[path]
        assert rewritten.checked and rewritten.size == size  # type: ignore[attr-defined]
    finally:
        again.close()
