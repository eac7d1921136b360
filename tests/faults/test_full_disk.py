"""A real filesystem that fills up: a size-limited tmpfs mounted (and unmounted) by the test.

Defect 2: a log append that fails part-way (ENOSPC after a short write) used to leave a torn record
in the middle of the segment while later appends (a delete here) followed it; recovery cut the log
at the torn record and lost them. Now the torn bytes are cut off at once, the stream refuses writes
with a 503 until its folder takes writes again, and nothing after a torn record is ever written.
End to end: a gateway whose warehouse fills up answers 503 ApiErrors (never a 500, never a lost
ack), reports the failing flushes in `/healthz`, and serves again once space is freed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import EngineOptions, JetStream, JetStreamError, ManualClock
from tests.faults.harness import STREAM, Load, check_restart, create_consumer, create_stream
from tests.gateway import Gateway

MIB = 1024 * 1024


def _mount(path: Path, size_mib: int) -> None:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (no CAP_SYS_ADMIN in this container?): {done.stderr.strip()}")


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs, the warehouse on it."""
    path = tmp_path / "warehouse"
    _mount(path, 24)
    try:
        yield path
    finally:
        _unmount(path)


def _fill(disk: Path, leave: int) -> Path:
    """A filler file taking all but about `leave` bytes of the disk."""
    free = shutil.disk_usage(disk).free
    filler = disk / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        chunk = b"\0" * MIB
        remaining = max(free - leave, 0)
        while remaining > 0:
            remaining -= f.write(chunk[: min(MIB, remaining)])
        f.flush()
    return filler


def test_a_log_append_cut_short_by_a_full_disk_leaves_nothing_torn(small_disk: Path) -> None:
    clock = ManualClock()
    js = JetStream(small_disk, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
        acked = [js.publish_one(f"faults.{i}", b"kept-%d" % i).seq for i in range(10)]  # type: ignore[union-attr]
        filler = _fill(small_disk, 64 * 1024)
        with pytest.raises(JetStreamError) as refused:
            js.publish_one("faults.big", os.urandom(512 * 1024))
        assert refused.value.code == 503 and "No space left" in refused.value.description
        filler.unlink()
        deadline = time.monotonic() + 10
        while True:  # the stream takes writes again once its folder does (the flusher heals it)
            try:
                js.delete_message(STREAM, acked[3], erase=False)
                break
            except JetStreamError as exc:
                assert exc.code == 503 and time.monotonic() < deadline, exc
                js.flush()
    finally:
        for entry in js.streams():
            entry.store.close()
        js._owner.release()  # a crash: nothing flushed at close
    again = JetStream(small_disk, EngineOptions(), clock=clock)
    again.open(start_flusher=False)
    try:
        stream = again.stream(STREAM)
        live = [s for s in acked if stream.index.is_live(s)]
        assert live == acked[:3] + acked[4:], "the delete after the torn write is kept"
        assert again.get_message(STREAM, acked[-1]).data == b"kept-9"
        assert again.publish_one("faults.next", b"next").seq == acked[-1] + 1  # type: ignore[union-attr]
    finally:
        again.close()


def test_a_commit_that_fills_the_disk_leaves_no_data_file_behind(small_disk: Path) -> None:
    """The flusher writes a commit's Parquet files itself (engine/store/data_files.py): a file cut short
    by a full disk is removed, so a failing commit does not keep the disk full, and the next one, with
    space again, holds every message once."""
    js = JetStream(small_disk, EngineOptions(), clock=ManualClock())
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
        payloads = [os.urandom(16 * 1024) for _ in range(300)]  # 4.8 MB that does not compress
        acked = [js.publish_one(f"faults.{i % 7}", p).seq for i, p in enumerate(payloads)]  # type: ignore[union-attr]
        filler = _fill(small_disk, MIB)
        report = js.flush_report()
        assert report.failed and "No space left" in str(report.failed), report
        table = js.layout.stream_table(STREAM)
        assert not list(table.rglob("*.parquet")), "the torn file is removed"
        filler.unlink()
        assert not js.flush_report().failed
        assert len(list(table.rglob("*.parquet"))) == 1
        assert [js.get_message(STREAM, s).data for s in acked] == payloads
    finally:
        js.close()


def test_a_gateway_whose_disk_fills_refuses_writes_then_serves_again(small_disk: Path) -> None:
    gw = Gateway(small_disk, "--flush-interval", "0.2").start()
    load = Load(gw.url, deletes=False, payload=1024)
    try:
        with gw.client() as c:
            create_stream(c)
            create_consumer(c)
            filler = _fill(small_disk, 2 * MIB)
            load.start()
            deadline = time.monotonic() + 30
            while not load.refused and time.monotonic() < deadline:
                time.sleep(0.05)
            assert load.refused, "the disk never filled"
            while (flushed := c.post("/v1/flush")).status_code == 200 and time.monotonic() < deadline:
                time.sleep(0.05)  # a commit may still fit in what a cut-back write freed; the load fills it
            assert flushed.status_code == 503 and flushed.json()["success"] is False, flushed.text
            assert flushed.json()["failed"] and "No space left" in flushed.text
            failing = c.get("/healthz").json()
            load.stop()
            assert failing["status"] in ("degraded", "unavailable")
            assert failing.get("streams_failed") or failing["flush"]["failing"]
            filler.unlink()
            deadline = time.monotonic() + 20
            while c.post("/v1/publish/faults.after", content=b"space again").status_code != 200:
                assert time.monotonic() < deadline, "the gateway did not take writes again after space was freed"
                time.sleep(0.1)
            flushed = c.post("/v1/flush")
            assert flushed.status_code == 200, flushed.text
            assert c.get("/healthz").json()["status"] == "ok"
    finally:
        load.stop()
        gw.stop()
    assert not load.unexpected, load.unexpected[:5]
    assert load.acked
    check_restart(small_disk, load).stop()
