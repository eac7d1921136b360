"""A stream whose log write failed is re-read from disk and takes writes again, without a restart.

A publish runs JetStream's checks and applies them to memory (sequence, index, dedup window,
removals) before its log write; when that write fails, memory is ahead of the log. The stream then
refuses every request (503) until the flusher has rebuilt it from the disk, serves reads, and takes
writes again once its log folder does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from engine import EngineOptions, JetStream, JetStreamError, ManualClock

STREAM = "FAULTS"


def test_a_failed_log_write_is_healed_by_rereading_the_stream(
    warehouse: Path, clock: ManualClock, armed: Callable[[str], None]
) -> None:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"], "duplicate_window": 60_000_000_000})
        js.add_consumer(STREAM, {"durable_name": "C", "ack_policy": "explicit"})
        for i in range(3):
            js.publish_one(f"faults.{i}", b"m%d" % i, {"Nats-Msg-Id": [f"id-{i}"]})
        armed("wal.append=eio@1")
        with pytest.raises(JetStreamError) as failed:
            js.publish_one("faults.x", b"not stored", {"Nats-Msg-Id": ["id-failed"]})
        assert (failed.value.code, failed.value.err_code) == (503, 10077)
        with pytest.raises(JetStreamError) as unavailable:
            js.stream_info(STREAM)
        assert (unavailable.value.code, unavailable.value.err_code) == (503, 10023)

        js.flush()  # re-reads the stream from disk: memory is what the log holds
        assert js.stream_info(STREAM)["state"]["last_seq"] == 3
        assert [d.msg.seq for d in js.fetch(STREAM, "C", 10)] == [1, 2, 3]
        js.flush()  # its log folder takes writes: so does the stream
        again = js.publish_one("faults.x", b"stored", {"Nats-Msg-Id": ["id-failed"]})
        assert again.seq == 4 and not again.duplicate, "the failed message left no trace"  # type: ignore[union-attr]
        duplicate = js.publish_one("faults.0", b"m0", {"Nats-Msg-Id": ["id-0"]})
        assert duplicate.duplicate and duplicate.seq == 1  # type: ignore[union-attr]
        logs = sum(s.store.log_bytes() for s in js.streams()) + js.consumers.acks.log_bytes()
        assert js.backlog.total == logs, "the re-read log is counted once"
    finally:
        js.close()
