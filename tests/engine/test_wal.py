from __future__ import annotations

from pathlib import Path

from engine.store.wal import WriteAheadLog


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
