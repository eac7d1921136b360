"""The write-ahead log: checksummed (xxh3) records in segment files, appended before a publish is answered.

A stream's log is a folder of segments named by the log sequence number (LSN) of their first record.
One `append` writes every record of a group commit with one `write` (and one `fsync` under
`--sync always`); a PubAck follows it. Recovery reads the records back in order and cuts a torn tail
(an unacknowledged partial write) at the first record whose length or checksum does not hold. The
flusher seals the current segment with `rotate` and deletes sealed segments once their contents are
committed to Delta. Counterpart: the message blocks of server/filestore.go.
"""

from __future__ import annotations

import logging
import os
import struct

import xxhash
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"JLW2"
_HEADER = struct.Struct("<4sBQIQ")  # magic, kind, lsn, payload length, xxh3-64 of kind, lsn and payload
HEADER_SIZE = _HEADER.size
SUFFIX = ".wal"


@dataclass(frozen=True, slots=True)
class Record:
    kind: int
    lsn: int
    payload: bytes


Payload = bytes | memoryview


def _checksum(kind: int, lsn: int, payload: Payload) -> int:
    digest = xxhash.xxh3_64(struct.pack("<BQ", kind, lsn))
    digest.update(payload)
    return digest.intdigest()


def header(kind: int, lsn: int, payload: Payload) -> bytes:
    return _HEADER.pack(MAGIC, kind, lsn, len(payload), _checksum(kind, lsn, payload))


def _segment_name(lsn: int) -> str:
    return f"{lsn:020d}{SUFFIX}"


def read_segment(path: Path) -> tuple[list[Record], int]:
    """The valid records of a segment and the byte offset where they end."""
    data = path.read_bytes()
    records: list[Record] = []
    offset = 0
    while offset + HEADER_SIZE <= len(data):
        magic, kind, lsn, length, crc = _HEADER.unpack_from(data, offset)
        end = offset + HEADER_SIZE + length
        if magic != MAGIC or end > len(data):
            break
        payload = data[offset + HEADER_SIZE : end]
        if _checksum(kind, lsn, payload) != crc:
            break
        records.append(Record(kind, lsn, payload))
        offset = end
    return records, offset


class WriteAheadLog:
    """One stream's log. Not thread-safe: the stream's lock serialises every call."""

    def __init__(self, directory: Path, sync_always: bool = False) -> None:
        self.directory = directory
        self.sync_always = sync_always
        self.next_lsn = 1
        self._file: int | None = None
        self._current: Path | None = None
        self.bytes_written = 0

    def segments(self) -> list[Path]:
        if not self.directory.exists():
            return []
        return sorted(p for p in self.directory.iterdir() if p.name.endswith(SUFFIX))

    def recover(self) -> list[Record]:
        """Reads every record; cuts a torn tail off the last segment."""
        records: list[Record] = []
        segments = self.segments()
        for i, path in enumerate(segments):
            found, end = read_segment(path)
            size = path.stat().st_size
            if end < size:
                if i != len(segments) - 1:
                    raise RuntimeError(f"write-ahead log segment {path} is corrupt at byte {end} of {size}")
                log.warning("cutting a torn tail of %d bytes off %s", size - end, path)
                with open(path, "r+b") as f:
                    f.truncate(end)
                    os.fsync(f.fileno())
            records.extend(found)
        if records:
            self.next_lsn = records[-1].lsn + 1
        return records

    def append(self, entries: list[tuple[int, Payload]]) -> int:
        """Writes the records with one gathered write; returns the LSN of the last one."""
        if self._file is None:
            self._open_segment()
        assert self._file is not None
        parts: list[Payload] = []
        for kind, payload in entries:
            view = memoryview(payload)
            parts += (header(kind, self.next_lsn, view), view)
            self.next_lsn += 1
        total = sum(len(p) for p in parts)
        written = os.writev(self._file, parts)
        if written < total:
            rest = b"".join(bytes(p) for p in parts)[written:]
            while rest:
                rest = rest[os.write(self._file, rest) :]
        if self.sync_always:
            os.fsync(self._file)
        self.bytes_written += total
        return self.next_lsn - 1

    def _open_segment(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._current = self.directory / _segment_name(self.next_lsn)
        self._file = os.open(self._current, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        _fsync_dir(self.directory)

    def rotate(self) -> list[Path]:
        """Seals the current segment; returns every sealed segment (all but a new, empty current)."""
        self.close()
        return self.segments()

    def close(self) -> None:
        if self._file is not None:
            os.fsync(self._file)
            os.close(self._file)
            self._file = None
            self._current = None

    def remove(self, paths: list[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)
        if paths:
            _fsync_dir(self.directory)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
