"""A crash between a table commit and the removal of its log segments leaves segments whose every
record is in the tables. Before, they went only with a later flush, and never if nothing new was
published (so the erase job, waiting for a message to leave the log, waited forever). Now recovery
removes them at once, and nothing in them is committed twice.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest

from engine import EngineOptions, JetStream, ManualClock
from engine.store.failpoints import ENV
from tests.faults.harness import STREAM, Load, create_stream, table_rows
from tests.gateway import Gateway


def test_segments_already_committed_are_removed_when_the_stream_recovers(warehouse: Path, clock: ManualClock) -> None:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    log_dir = warehouse / "default" / "_wal" / STREAM
    kept = warehouse / "kept-segments"
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
        for i in range(5):
            js.publish_one(f"faults.{i}", b"m%d" % i)
        js.delete_message(STREAM, 2, erase=False)
        shutil.copytree(log_dir, kept)
        js.flush()
        assert not list(log_dir.glob("*.wal"))
    finally:
        js.close()
    for segment in kept.glob("*.wal"):  # as if the process died after the commits, before the unlink
        shutil.copy(segment, log_dir / segment.name)

    again = JetStream(warehouse, EngineOptions(), clock=clock)
    again.open(start_flusher=False)
    try:
        assert not list(log_dir.glob("*.wal")), "segments whose records are all committed are removed on start"
        assert again.stream_info(STREAM)["state"]["messages"] == 4
        assert again.publish_one("faults.next", b"next").seq == 6  # type: ignore[union-attr]
        again.flush()
    finally:
        again.close()
    assert sorted(table_rows(warehouse)) == [1, 3, 4, 5, 6]  # 2 was deleted before its flush


def test_a_gateway_killed_before_removing_committed_segments_removes_them_on_start(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "60", env={ENV: "wal.unlink=kill@1"}).start()
    load = Load(gw.url, consume=False, deletes=False, max_batches=5)
    try:
        with gw.client() as c:
            create_stream(c)
        load.start().join()  # five batches a publisher, all answered
        with gw.client() as c, pytest.raises(httpx.HTTPError):
            c.post("/v1/flush")  # commits, then dies before unlinking
        assert gw.proc is not None
        gw.proc.wait(timeout=20)
        gw.proc = None
    finally:
        load.stop()
        gw.stop()
    log_dir = warehouse / "default" / "_wal" / STREAM
    assert list(log_dir.glob("*.wal")), "the kill left the committed segments behind"
    gw = Gateway(warehouse, "--flush-interval", "60").start()  # no flush will come to remove them
    try:
        assert not list(log_dir.glob("*.wal"))
        with gw.client() as c:
            assert c.get(f"/v1/streams/{STREAM}").json()["state"]["last_seq"] >= max(load.acked.values())
    finally:
        gw.stop()
    rows = table_rows(warehouse)
    assert all(rows[seq] == msg_id for msg_id, seq in load.acked.items())
