from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.store import failpoints
from engine.store.wal import HEADER_SIZE, Damage, WriteAheadLog, header


def test_records_come_back_in_order_across_segments(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"a"), (2, b"b")])
    sealed = wal.rotate()
    wal.append([(1, b"c")])
    wal.close()
    assert len(sealed) == 1
    again = WriteAheadLog(tmp_path / "wal")
    records = again.recover()
    assert [(r.kind, r.lsn, r.payload) for r in records] == [(1, 1, b"a"), (2, 2, b"b"), (1, 3, b"c")]
    assert again.next_lsn == 4


def test_a_torn_tail_is_cut_and_appends_continue(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"kept")])
    wal.close()
    segment = wal.segments()[-1]
    intact = segment.stat().st_size
    with open(segment, "ab") as f:
        f.write(b"JLW2\x01garbage-of-a-half-written-record")
    again = WriteAheadLog(tmp_path / "wal")
    assert [r.payload for r in again.recover()] == [b"kept"]
    assert segment.stat().st_size == intact
    again.append([(1, b"next")])
    again.close()
    assert [r.payload for r in WriteAheadLog(tmp_path / "wal").recover()] == [b"kept", b"next"]


def test_a_flipped_byte_fails_the_checksum(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"first")])
    wal.append([(1, b"second")])
    wal.close()
    segment = wal.segments()[-1]
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))
    assert [r.payload for r in WriteAheadLog(tmp_path / "wal").recover()] == [b"first"]


@pytest.fixture
def armed() -> Iterator[Callable[[str], None]]:
    """Arms failpoints in this process for one test; disarmed after it."""
    yield failpoints.arm
    failpoints.disarm()


def test_failpoint_grammar() -> None:
    points = failpoints.parse("wal.append=enospc@3, stream.commit=raise_after,acks.fold=kill@2+")
    assert points["wal.append"] == failpoints.Failpoint("wal.append", "enospc", 3, False)
    assert points["stream.commit"] == failpoints.Failpoint("stream.commit", "raise_after", 0, False)
    assert points["acks.fold"] == failpoints.Failpoint("acks.fold", "kill", 2, True)
    for bad in ("wal.append", "wal.append=explode", "wal.append=eio@0", "wal.append=eio@x"):
        with pytest.raises(ValueError):
            failpoints.parse(bad)


def test_a_failed_append_leaves_no_partial_record(tmp_path: Path, armed: Callable[[str], None]) -> None:
    """Defect 2: a write that fails part-way is cut off, so the appends after it are not behind a torn record."""
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"before")])
    armed("wal.append=short@1")
    with pytest.raises(OSError) as failed:
        wal.append([(1, b"x" * 10_000)])
    assert failed.value.errno == errno.ENOSPC
    assert wal.broken is None
    wal.append([(2, b"after")])
    wal.close()
    again = WriteAheadLog(tmp_path / "wal")
    assert [(r.lsn, r.payload) for r in again.recover()] == [(1, b"before"), (2, b"after")]
    assert again.damage == []


def test_a_log_that_cannot_cut_a_partial_write_refuses_appends(tmp_path: Path, armed: Callable[[str], None]) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"before")])
    armed("wal.append=short@1")
    real_ftruncate = os.ftruncate

    def failing_ftruncate(fd: int, size: int) -> None:
        raise OSError(errno.EIO, "device gone")

    os.ftruncate = failing_ftruncate  # the undo itself fails, as on a dying disk
    try:
        with pytest.raises(OSError):
            wal.append([(1, b"x" * 10_000)])
        assert wal.broken is not None
        with pytest.raises(OSError, match="read-only"):
            wal.append([(1, b"refused")])
        assert not wal.repair()
    finally:
        os.ftruncate = real_ftruncate
    assert wal.repair()
    wal.append([(1, b"after")])
    wal.close()
    assert [r.payload for r in WriteAheadLog(tmp_path / "wal").recover()] == [b"before", b"after"]


def _flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damage_in_the_middle_of_a_segment_is_reported_and_read_past(tmp_path: Path) -> None:
    """A corrupt record mid-segment: its position is reported; every intact record after it is kept."""
    wal = WriteAheadLog(tmp_path / "wal")
    for i in range(5):
        wal.append([(1, f"record-{i}".encode() * 20)])
    wal.close()
    segment = wal.segments()[0]
    record_size = HEADER_SIZE + len(b"record-0" * 20)
    _flip(segment, 2 * record_size + HEADER_SIZE + 5)  # the third record's payload
    size = segment.stat().st_size
    again = WriteAheadLog(tmp_path / "wal")
    records = again.recover()
    assert [r.lsn for r in records] == [1, 2, 4, 5]
    assert again.damage == [Damage(segment.name, 2 * record_size, record_size, 1, tail=False, written=True)]
    assert segment.stat().st_size == size, "damage before intact records is not cut"
    assert again.next_lsn == 6


def test_damage_in_a_middle_segment_is_read_past(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    for i in range(3):
        wal.append([(1, b"a" * 50), (1, b"b" * 50)])
        wal.rotate()
    first, middle, last = wal.segments()
    _flip(middle, HEADER_SIZE + 10)  # its first record
    again = WriteAheadLog(tmp_path / "wal")
    assert [r.lsn for r in again.recover()] == [1, 2, 4, 5, 6]
    assert [(d.segment, d.offset, d.lost_lsns) for d in again.damage] == [(middle.name, 0, 1)]


def test_damage_at_the_end_of_a_middle_segment_counts_the_records_lost(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"a" * 50), (1, b"b" * 50)])
    wal.rotate()
    wal.append([(1, b"c" * 50)])
    wal.close()
    first, last = wal.segments()
    _flip(first, first.stat().st_size - 3)
    again = WriteAheadLog(tmp_path / "wal")
    assert [r.lsn for r in again.recover()] == [1, 3]
    assert [(d.segment, d.lost_lsns, d.tail) for d in again.damage] == [(first.name, 1, False)]


def test_a_log_payload_holding_a_log_record_is_not_mistaken_for_one(tmp_path: Path) -> None:
    """Resynchronising needs a higher LSN: a record embedded in a payload (a message that is log bytes) with an
    old LSN is skipped, not replayed."""
    inner = header(1, 1, b"inner") + b"inner"
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"first")])
    wal.append([(1, b"x" + inner + b"y")])
    wal.append([(1, b"third")])
    wal.close()
    segment = wal.segments()[0]
    _flip(segment, HEADER_SIZE + len(b"first") + 2)  # the second record's header (its length field)
    records = WriteAheadLog(tmp_path / "wal").recover()
    assert [r.payload for r in records] == [b"first", b"third"]


def test_a_damaged_last_record_is_told_from_a_torn_write(tmp_path: Path) -> None:
    """Both are cut; the damaged whole record is flagged `written` (its contents were acknowledged)."""
    wal = WriteAheadLog(tmp_path / "wal")
    wal.append([(1, b"first")])
    wal.append([(1, b"second" * 10)])
    wal.close()
    segment = wal.segments()[0]
    _flip(segment, segment.stat().st_size - 1)
    again = WriteAheadLog(tmp_path / "wal")
    assert [r.payload for r in again.recover()] == [b"first"]
    assert [(d.tail, d.written) for d in again.damage] == [(True, True)]
    with open(segment, "ab") as f:
        f.write(header(1, 2, b"cut short")[:-3])
    again = WriteAheadLog(tmp_path / "wal")
    assert [r.payload for r in again.recover()] == [b"first"]
    assert [(d.tail, d.written) for d in again.damage] == [(True, False)]
