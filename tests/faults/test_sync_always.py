"""Defect 3: under `--sync always` a commit is on disk before the log segments it replaces are deleted.

Before, the segments were unlinked (and their folder fsynced) after a Delta commit whose Parquet
files, commit JSON and `_delta_log/` were never fsynced: a power loss could lose both. A power loss
cannot be staged here, so the test records, in order, every fsync (by the path of its descriptor)
and every unlink the engine makes, and checks that each file and folder of the commit was fsynced
before the first segment of the log went.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote

import orjson
import pytest

from engine import EngineOptions, JetStream, ManualClock

STREAM = "FAULTS"


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def synced_before_unlink(self, log_dir: Path) -> set[str]:
        """Paths fsynced before the first unlink of a segment in `log_dir`."""
        synced: set[str] = set()
        for kind, path in self.events:
            if kind == "unlink" and Path(path).parent == log_dir:
                return synced
            if kind == "fsync":
                synced.add(path)
        raise AssertionError(f"no segment of {log_dir} was unlinked")


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> _Recorder:
    rec = _Recorder()
    real_fsync, real_unlink = os.fsync, Path.unlink

    def fsync(fd: int) -> None:
        rec.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def unlink(self: Path, missing_ok: bool = False) -> None:
        rec.events.append(("unlink", str(self.resolve())))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(Path, "unlink", unlink)
    return rec


def _commit_paths(table: Path) -> set[str]:
    """The files and folders the table's latest commit wrote: added files, their folders, the commit, the log folder."""
    log_dir = table / "_delta_log"
    commit = max(log_dir.glob("*.json"))
    paths = {str(commit), str(log_dir), str(table)}
    for line in commit.read_bytes().splitlines():
        add = orjson.loads(line).get("add")
        if add:
            file = table / unquote(add["path"])
            paths |= {str(file), str(file.parent)}
    return paths


def test_a_commit_is_fsynced_before_its_log_segments_are_deleted(
    warehouse: Path, clock: ManualClock, recorder: _Recorder
) -> None:
    js = JetStream(warehouse, EngineOptions(sync_always=True), clock=clock)
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
        js.add_consumer(STREAM, {"durable_name": "C", "ack_policy": "explicit"})
        for i in range(6):
            js.publish_one(f"faults.{i % 2}.x", b"m%d" % i)
        js.delete_message(STREAM, 2, erase=False)
        delivered = js.fetch(STREAM, "C", 3)
        js.ack(STREAM, "C", [(d.msg.seq, "ack", 0) for d in delivered])
        recorder.events.clear()
        js.flush()  # the stream table, then the tombstones; the ack table
    finally:
        js.close()
    root = (warehouse / "default").resolve()
    stream_commit = _commit_paths(root / "streams" / STREAM)
    assert any("subject_partition=faults" in p for p in stream_commit), "new partition folders are in the commit"
    missing = stream_commit - recorder.synced_before_unlink(root / "_wal" / STREAM)
    assert not missing, f"not fsynced before the stream's log segments were deleted: {sorted(missing)}"
    missing = _commit_paths(root / "_system" / "tombstones") - recorder.synced_before_unlink(root / "_wal" / STREAM)
    assert not missing, f"tombstones commit not fsynced before the log segments were deleted: {sorted(missing)}"
    missing = _commit_paths(root / "_system" / "acks") - recorder.synced_before_unlink(root / "_wal" / ".acks")
    assert not missing, f"ack table commit not fsynced before the ack log segments were deleted: {sorted(missing)}"
