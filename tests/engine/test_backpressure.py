"""Backpressure (engine/backpressure.py): past `max_pending_bytes` of uncommitted messages a publish
waits for the flusher instead of growing the memory, and nothing it acknowledges is lost.

The flusher is held by taking its lock (a commit under way holds it the same way), so a publish past
the bound is seen waiting (`Backpressure.waits`), and freed when the commit can run. A stream whose
commits fail is not waited on: its log's bound answers instead (tests/faults/test_backpressure.py).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa

from engine import EngineOptions, JetStream, PlainBatch
from engine.messages import AckRun, InboundMessage
from engine.store.delta import DeltaStore

KIB = 1024
DEADLINE = 30.0


def _batch(n: int, tag: str) -> PlainBatch:
    return PlainBatch([f"bp.{i % 3}" for i in range(n)], pa.array([f"{tag}-{i}".ljust(100, ".").encode() for i in range(n)]))


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _open(warehouse: Path, start_flusher: bool = True) -> JetStream:
    js = JetStream(warehouse, EngineOptions(flush_interval=3600, max_pending_bytes=64 * KIB))
    js.open(start_flusher=start_flusher)
    return js


def test_a_publish_past_the_bound_waits_for_the_commit(tmp_path: Path) -> None:
    js = _open(tmp_path)
    try:
        js.add_stream({"name": "BP", "subjects": ["bp.>"]})
        stream = js.stream("BP")
        store = stream.store
        assert isinstance(store, DeltaStore)
        answers: list[object] = []
        with js.flusher.lock:  # the flusher cannot commit meanwhile
            while store.held_bytes() < js.backpressure.max_pending_bytes:
                answer = js.publish_batch(_batch(100, f"a{len(answers)}"))
                assert isinstance(answer, AckRun)
                answers.append(answer)
            assert js.publish_batch_nowait(_batch(1, "nowait")) is None  # the event loop hands it to a thread
            assert js.publish_nowait([InboundMessage("bp.x", b"nowait")]) is None
            held = store.held_bytes()
            waiting = threading.Thread(target=lambda: answers.append(js.publish_batch(_batch(100, "waited"))))
            waiting.start()
            _until(lambda: js.backpressure.waits == 1, "the publish to wait")
            assert waiting.is_alive()
            assert store.held_bytes() == held  # nothing was appended while it waits
            assert js.stream_info("BP")["state"]["messages"] == 100 * (len(answers))
        waiting.join(DEADLINE)
        assert not waiting.is_alive(), "the publish still waits after the flusher could commit"
        last = answers[-1]
        assert isinstance(last, AckRun) and last.first_seq == 100 * (len(answers) - 1) + 1
        assert js.backpressure.timeouts == 0
        assert store.held_bytes() < js.backpressure.max_pending_bytes
        total = 100 * len(answers)
    finally:
        js.close()
    js = _open(tmp_path, start_flusher=False)  # every acknowledged message is there after a restart
    try:
        state = js.stream_info("BP")["state"]
        assert (state["messages"], state["last_seq"]) == (total, total)
        assert bytes(js.get_message("BP", total).data).startswith(b"waited-99")
    finally:
        js.close()


def test_no_wait_without_a_running_flusher(tmp_path: Path) -> None:
    """Nothing would end the wait: the publish goes on to the log's own bound (a 503 past it)."""
    js = _open(tmp_path, start_flusher=False)
    try:
        js.add_stream({"name": "BP", "subjects": ["bp.>"]})
        for n in range(20):
            js.publish_batch(_batch(100, f"b{n}"))
        assert js.stream("BP").store.held_bytes() >= js.backpressure.max_pending_bytes  # type: ignore[attr-defined]
        assert js.backpressure.waits == 0
        assert js.stream_info("BP")["state"]["messages"] == 2000
    finally:
        js.close()
