"""The heap policy (engine/heap.py) and what the flusher does with it once a write load ends.

One module owns how the allocators keep and return memory: two modules loading libc each with their own
idea (a 256 MiB trim threshold in one, a trim every 5 s in the other) is how the policy got lost. After a
load of a million distinct subjects the gateway kept ~400 MB, a third of it copies of what the table
already held (the recent-message buffer, the index's block details); `Flusher.settle` drops those once
no commit came for SETTLE_SECONDS, and the reads that follow stay exact.
"""

from __future__ import annotations

import ast
import gc
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from api.cli import build_parser
from engine import EngineOptions, JetStream, ManualClock, heap
from engine import flusher as flusher_module
from engine.errors import NoMessageFoundError
from engine.store.delta import DeltaStore
from tests.conftest import reopen
from tests.gateway import Gateway

ROOT = Path(__file__).resolve().parents[2]
_ALLOCATOR_CALLS = {"mallopt", "malloc_trim", "release_unused", "jemalloc_set_decay_ms"}
_COLLECTOR_CALLS = {"freeze", "set_threshold"}  # of `gc`


def _allocator_calls(path: Path) -> list[str]:
    """Calls of the allocators' knobs in one file, and every mention of libc."""
    text = path.read_text()
    found = [f"{path.name}: libc" for _ in range(text.count("libc.so"))]
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        of_gc = isinstance(node.func.value, ast.Name) and node.func.value.id == "gc"
        if node.func.attr in _ALLOCATOR_CALLS or (of_gc and node.func.attr in _COLLECTOR_CALLS):
            found.append(f"{path.relative_to(ROOT)}: {node.func.attr}")
    return found


def test_the_heap_module_is_the_only_place_that_tunes_or_calls_the_allocators() -> None:
    others = [call for folder in ("engine", "api", "jobs") for path in sorted((ROOT / folder).rglob("*.py"))
              if path != ROOT / "engine" / "heap.py" for call in _allocator_calls(path)]
    assert others == []
    own = _allocator_calls(ROOT / "engine" / "heap.py")
    assert {"mallopt", "malloc_trim", "release_unused", "freeze", "set_threshold"} <= {c.split(": ")[1] for c in own}


def test_malloc_variables_override_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert heap.keep_freed_memory() is False
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert heap.keep_freed_memory() is (heap._LIBC is not None)


def test_stats_count_what_glibc_and_arrow_hold() -> None:
    before = heap.stats()
    block = np.ones(16 * 1024 * 1024, np.uint8)  # 16 MiB from glibc (numpy's allocator)
    column = pc.add(pa.array(np.arange(2_000_000, dtype=np.int64)), 1)  # 16 MB from Arrow's pool (the sum)
    during = heap.stats()
    assert during["arrow_allocated"] - before["arrow_allocated"] >= 16_000_000
    if heap._LIBC is not None and hasattr(heap._LIBC, "mallinfo2"):
        assert during["glibc_in_use"] - before["glibc_in_use"] >= block.nbytes
        del block
        assert heap.stats()["glibc_in_use"] < during["glibc_in_use"] - 15 * 1024 * 1024
    assert column[1_999_999].as_py() == 2_000_000


def test_cache_bytes_bound_each_streams_copies(tmp_path: Path, clock: ManualClock) -> None:
    """`jetlake serve --cache-bytes` (default DEFAULT_CACHE_BYTES) bounds the recent-message buffer of
    each stream, and its index's cached block details at half of it."""
    parsed = build_parser().parse_args(["serve", "--cache-bytes", "4096000"])
    assert build_parser().parse_args(["serve"]).cache_bytes == EngineOptions().cache_bytes
    engine = JetStream(tmp_path / "wh", EngineOptions(cache_bytes=parsed.cache_bytes), clock=clock)
    engine.open(start_flusher=False)
    try:
        engine.add_stream({"name": "S", "subjects": ["s.>"]})
        for i in range(20_000):
            engine.publish_one(f"s.k{i}", b"x" * 400)
        engine.stream("S").get(1)  # a stream being read keeps copies of what it commits
        engine.flush()
        stream = engine.stream("S")
        store = stream.store
        assert isinstance(store, DeltaStore)
        assert 0 < store.buffer.nbytes <= 4_096_000
        assert stream.index.cache_bytes == 2_048_000
        assert [stream.get(seq).data for seq in (1, 20_000)] == [b"x" * 400] * 2
    finally:
        engine.close()


def test_numpy_arrays_stay_off_transparent_huge_pages_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy madvises every array of 4 MB and more for huge pages; the heap ranges such arrays leave when
    freed were refilled 2 MB at a time (AnonHugePages 50-90 MB after a load of a million subjects)."""
    from numpy._core import multiarray

    was = multiarray._set_madvise_hugepage(True)
    try:
        monkeypatch.delenv("NUMPY_MADVISE_HUGEPAGE", raising=False)
        heap.keep_freed_memory()
        assert multiarray._set_madvise_hugepage(True) is False  # it was off
        monkeypatch.setenv("NUMPY_MADVISE_HUGEPAGE", "1")
        heap.keep_freed_memory()
        assert multiarray._set_madvise_hugepage(False) is True  # the variable overrides: left on
    finally:
        multiarray._set_madvise_hugepage(was)


def test_settle_frees_what_only_the_cyclic_collector_frees() -> None:
    class Node:
        other: object = None

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        del a, b
        assert gone() is not None  # refcounting alone leaves a cycle
        assert heap.settle() >= 2
        assert gone() is None
    finally:
        if was_enabled:
            gc.enable()


def test_release_gives_arrow_pool_memory_back_without_touching_live_buffers() -> None:
    kept = pa.array(np.arange(1_000_000, dtype=np.int64))
    before = pa.total_allocated_bytes()
    freed = pa.array(np.arange(2_000_000, dtype=np.int64))
    del freed
    heap.release()
    assert pa.total_allocated_bytes() == before
    assert kept[999_999].as_py() == 999_999


# -- the flusher once a load ends -------------------------------------------------------------


def _load(js: JetStream, subjects: int, per_subject: int = 1) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for round_ in range(per_subject):
        for i in range(subjects):
            js.publish_one(f"s.k{i}", f"{round_}-{i}".encode())


def _store(js: JetStream) -> DeltaStore:
    store = js.stream("S").store
    assert isinstance(store, DeltaStore)
    return store


def _assert_last_by_subject_exact(js: JetStream, subjects: int, round_: int) -> None:
    stream = js.stream("S")
    for i in range(subjects):
        msg = stream.last_by_subject(f"s.k{i}")
        assert (msg.subject, msg.data) == (f"s.k{i}", f"{round_}-{i}".encode())


def test_settle_drops_the_copies_of_what_the_table_holds_and_reads_stay_exact(js: JetStream) -> None:
    _load(js, 3000)
    js.stream("S").get(1)  # a stream being read keeps copies of what it commits
    js.flush()
    stream, store = js.stream("S"), _store(js)
    stream.get(5)  # a read of a flushed message: the index reads its block's detail back (cached)
    assert store.buffer.nbytes > 0
    js.publish_one("s.k7", b"unflushed")  # the log's: stays in the buffer
    dropped = js.flusher.settle()
    assert dropped > 0
    assert len(store.buffer.unflushed()) == 1 and store.buffer.nbytes == store.buffer.unflushed()[0].nbytes
    assert stream.index.details.cache_used == 0 and not stream.index.details.cache
    assert stream.last_by_subject("s.k7").data == b"unflushed"
    assert stream.get(3001).data == b"unflushed"
    assert [stream.get(seq).data for seq in (1, 1500, 3000)] == [b"0-0", b"0-1499", b"0-2999"]
    for i in (0, 8, 2999):
        assert stream.last_by_subject(f"s.k{i}").data == f"0-{i}".encode()


def test_a_stream_only_written_to_drops_its_copies_at_each_commit(js: JetStream) -> None:
    """The copies a commit leaves serve readers that follow a stream closely; a stream nobody read since
    its previous commit (a bulk load) lets them go at once, and its reads find the table."""
    _load(js, 3000)
    js.flush()
    stream, store = js.stream("S"), _store(js)
    assert store.buffer.nbytes == 0 and stream.index.details.cache_used == 0
    assert [stream.get(seq).data for seq in (1, 3000)] == [b"0-0", b"0-2999"]  # read back from the table
    for i in range(3000, 3100):
        js.publish_one(f"s.k{i}", b"read")
    js.flush()  # read since the previous commit: the copies stay
    assert store.buffer.nbytes > 0
    assert stream.get(3100).data == b"read"
    js.publish_one("s.k0", b"again")
    js.flush()  # read (the get above) since the previous commit
    assert store.buffer.nbytes > 0
    js.publish_one("s.k0", b"unread")
    js.flush()  # nothing read since the previous commit
    assert store.buffer.nbytes == 0 and stream.index.details.cache_used == 0
    assert stream.last_by_subject("s.k0").data == b"unread"


def test_settle_keeps_a_memory_streams_messages(js: JetStream) -> None:
    js.add_stream({"name": "M", "subjects": ["m.>"], "storage": "memory"})
    for i in range(300):
        js.publish_one(f"m.{i}", str(i).encode())
    js.flush()
    js.flusher.settle()
    stream = js.stream("M")
    assert [stream.get(seq).data for seq in (1, 150, 300)] == [b"0", b"149", b"299"]
    assert stream.last_by_subject("m.42").data == b"42"


def test_the_background_flusher_settles_once_the_load_ends(js: JetStream, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flusher_module, "SETTLE_SECONDS", 0.2)
    _load(js, 2000)
    js.stream("S").get(1)  # a stream being read keeps copies of what it commits, until the settle
    store = _store(js)
    settled: list[int] = []
    real_settle = js.flusher.settle
    monkeypatch.setattr(js.flusher, "settle", lambda: settled.append(real_settle()) or settled[-1])
    js.flusher.interval = 0.05
    js.flusher.start()
    try:
        deadline = time.monotonic() + 30
        while not settled and time.monotonic() < deadline:
            time.sleep(0.02)
        assert settled and settled[0] > 0
        assert store.buffer.nbytes == 0
        time.sleep(0.5)  # idle rounds after the settle: no commit, so no second settle
        assert len(settled) == 1
    finally:
        js.flusher.stop()
    _assert_last_by_subject_exact(js, 2000, 0)


def test_an_idle_flusher_still_gives_freed_memory_back_now_and_then(js: JetStream, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads alone commit nothing, yet free what they decoded: the heap goes back every IDLE_RELEASE_SECONDS."""
    monkeypatch.setattr(flusher_module, "IDLE_RELEASE_SECONDS", 0.1)
    released: list[float] = []
    real_release = heap.release

    def release(every: float = 0.0) -> bool:
        ran = real_release(every)
        if ran:
            released.append(time.monotonic())
        return ran

    monkeypatch.setattr(flusher_module.heap, "release", release)
    js.flusher.interval = 0.02
    js.flusher.start()
    try:
        deadline = time.monotonic() + 30
        while len(released) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        js.flusher.stop()
    assert len(released) >= 3 and js.flusher.stats.commits == 0
    assert min(b - a for a, b in zip(released[1:], released[2:])) >= 0.1  # not every round: every 0.1 s


def test_flushers_of_several_accounts_asking_at_once_trim_the_process_once() -> None:
    assert heap.release() is True
    assert heap.release(every=60) is False  # another account's flusher, a moment later
    assert heap.release() is True


@pytest.mark.parametrize("after", ["settle", "restart"])
def test_last_by_subject_stays_exact_through_purge_erase_and_per_subject_limits(
    js: JetStream, clock: ManualClock, after: str
) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"], "max_msgs_per_subject": 2})
    for round_ in range(3):
        for i in range(500):
            js.publish_one(f"s.k{i}", f"{round_}-{i}".encode())
    js.flush()
    js.purge("S", "s.k1")
    stream = js.stream("S")
    last_of_k2 = stream.last_by_subject("s.k2").seq
    js.delete_message("S", last_of_k2, erase=True)
    js.flush()
    engine = js
    if after == "settle":
        js.flusher.settle()
    else:
        engine = reopen(js, clock)
    try:
        stream = engine.stream("S")
        with pytest.raises(NoMessageFoundError):
            stream.last_by_subject("s.k1")
        assert stream.last_by_subject("s.k2").data == b"1-2"  # the erased last gone, the one before it answers
        assert stream.index.subjects.state("s.k3")[0] == 2  # the per-subject limit kept two
        for i in (0, 3, 250, 499):
            msg = stream.last_by_subject(f"s.k{i}")
            assert (msg.subject, msg.data) == (f"s.k{i}", f"2-{i}".encode())
        assert stream.last_by_subject("s.*").data == b"2-499"
    finally:
        if engine is not js:
            engine.close()


def test_a_gateway_takes_cache_bytes_and_reports_its_heap_in_metrics(warehouse: Path) -> None:
    gateway = Gateway(warehouse, "--flush-interval", "0.2", "--cache-bytes", str(2 * 1024 * 1024)).start()
    try:
        with gateway.client() as c:
            assert c.post("/v1/streams", json={"name": "S", "subjects": ["s.>"]}).status_code in (200, 201)
            text = c.get("/metrics").text
    finally:
        gateway.stop()
    gauges = dict(line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("jetlake_heap_"))
    assert {"jetlake_heap_arrow_allocated_bytes", "jetlake_heap_glibc_in_use_bytes"} <= gauges.keys()
    assert all(int(value) >= 0 for value in gauges.values())
    if heap._LIBC is not None and hasattr(heap._LIBC, "mallinfo2"):
        assert int(gauges["jetlake_heap_glibc_in_use_bytes"]) > 1024 * 1024  # a gateway's own objects
