"""The write-ahead log: checksummed (xxh3) records in segment files, appended before a publish is answered.

A stream's log is a folder of segments named by the log sequence number (LSN) of their first record.
One `append` writes every record of a group commit with one `write` (and one `fsync` under
`--sync always`); a PubAck follows it. An append that fails part-way (ENOSPC, EIO, a short write) is
undone: the segment is truncated back to its size before the append, so no later record ever follows
a torn one; if even that fails, the log refuses every further append (`broken`) until `repair`.

Recovery reads the records back in order. A damaged region (a record whose magic, length or
checksum does not hold) is reported with its segment and byte offset, and reading resumes at the
next intact record (the next magic whose header and checksum hold, with a higher LSN), as
nats-server rebuilds a message block past a bad record: acknowledged records after the damage are
kept, not cut. A damaged region at the very end of the last segment is an unacknowledged torn write
and is cut. The flusher seals the current segment with `rotate` and deletes sealed segments once their
contents are committed to Delta. Counterpart: the message blocks of server/filestore.go.
"""

from __future__ import annotations

import logging
import os
import shutil
import struct
from dataclasses import dataclass, field
from pathlib import Path

import xxhash

from engine.store import failpoints
from engine.store.backlog import Backlog

log = logging.getLogger(__name__)

MAGIC = b"JLW2"
_HEADER = struct.Struct("<4sBQIQ")  # magic, kind, lsn, payload length, xxh3-64 of kind, lsn and payload
HEADER_SIZE = _HEADER.size
SUFFIX = ".wal"
_PROBE_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Record:
    kind: int
    lsn: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Damage:
    """Bytes of a segment that hold no intact record: `offset` and `length` in the segment file.

    `lost_lsns` is how many log sequence numbers are missing around it (0 when no record follows);
    `tail`: it ends the log (cut on recovery); `written`: it starts with a whole record whose checksum
    fails (a record written in full, then damaged), not a write cut short by a crash."""

    segment: str
    offset: int
    length: int
    lost_lsns: int
    tail: bool
    written: bool = False

    def to_json(self) -> dict[str, object]:
        return {"segment": self.segment, "offset": self.offset, "bytes": self.length,
                "lost_records": self.lost_lsns, "tail": self.tail, "torn_write": self.tail and not self.written}


@dataclass(slots=True)
class Scan:
    """What one segment holds: its intact records, the damaged regions between them, where the last ends.

    A damaged region is `(offset, length, lsn before it, lsn after it or 0 when no intact record
    follows, whether it starts with a whole record)`.
    """

    records: list[Record] = field(default_factory=list)
    damaged: list[tuple[int, int, int, int, bool]] = field(default_factory=list)
    end: int = 0


Payload = bytes | memoryview


def _checksum(kind: int, lsn: int, payload: Payload) -> int:
    digest = xxhash.xxh3_64(struct.pack("<BQ", kind, lsn))
    digest.update(payload)
    return digest.intdigest()


def header(kind: int, lsn: int, payload: Payload) -> bytes:
    return _HEADER.pack(MAGIC, kind, lsn, len(payload), _checksum(kind, lsn, payload))


def _segment_name(lsn: int) -> str:
    return f"{lsn:020d}{SUFFIX}"


def _record_at(data: bytes, offset: int) -> Record | None:
    """The intact record starting at `offset`, or None."""
    if offset + HEADER_SIZE > len(data):
        return None
    magic, kind, lsn, length, crc = _HEADER.unpack_from(data, offset)
    end = offset + HEADER_SIZE + length
    if magic != MAGIC or end > len(data):
        return None
    payload = data[offset + HEADER_SIZE : end]
    if _checksum(kind, lsn, payload) != crc:
        return None
    return Record(kind, lsn, payload)


def scan_segment(data: bytes, after_lsn: int = 0) -> Scan:
    """Every intact record of a segment's bytes, resynchronising past damage on the next record whose
    magic, length and checksum hold and whose LSN is above the last good one (a 64-bit checksum makes a
    false match practically impossible)."""
    scan = Scan()
    offset = 0
    last_lsn = after_lsn
    while offset < len(data):
        record = _record_at(data, offset)
        if record is None or record.lsn <= last_lsn:
            offset, record = _resync(data, offset, last_lsn, scan)
            if record is None:
                break
        scan.records.append(record)
        last_lsn = record.lsn
        offset += HEADER_SIZE + len(record.payload)
        scan.end = offset
    return scan


def _resync(data: bytes, bad: int, last_lsn: int, scan: Scan) -> tuple[int, Record | None]:
    """The next intact record after damage at `bad` (and its offset), recording the damaged region."""
    written = _whole_record_at(data, bad)
    offset = data.find(MAGIC, bad + 1)
    while offset != -1:
        found = _record_at(data, offset)
        if found is not None and found.lsn > last_lsn:
            scan.damaged.append((bad, offset - bad, last_lsn, found.lsn, written))
            return offset, found
        offset = data.find(MAGIC, offset + 1)
    scan.damaged.append((bad, len(data) - bad, last_lsn, 0, written))
    return len(data), None


def _whole_record_at(data: bytes, offset: int) -> bool:
    """Whether a record header at `offset` declares a length that fits the bytes: a record written in
    full (a torn write is a prefix of one, so its declared end lies past the end of the file)."""
    if offset + HEADER_SIZE > len(data):
        return False
    magic, _, _, length, _ = _HEADER.unpack_from(data, offset)
    return magic == MAGIC and offset + HEADER_SIZE + length <= len(data)


def read_segment(path: Path) -> tuple[list[Record], int]:
    """The intact records of a segment (past any damage) and the byte offset where the last one ends."""
    scan = scan_segment(path.read_bytes())
    return scan.records, scan.end


class WriteAheadLog:
    """One stream's log (or the ack log). Not thread-safe: the owner's lock serialises every call.

    `name` prefixes its failpoints (`wal`, `acklog`); `size` is the bytes of its segments not yet removed.
    """

    def __init__(
        self, directory: Path, sync_always: bool = False, name: str = "wal", backlog: Backlog | None = None
    ) -> None:
        self.directory = directory
        self.backlog = backlog or Backlog()
        self.sync_always = sync_always
        self.name = name
        self.next_lsn = 1
        self._file: int | None = None
        self._current: Path | None = None
        self._current_size = 0
        self.bytes_written = 0
        self.size = 0
        self.broken: str | None = None
        self.damage: list[Damage] = []
        self._unremoved: list[Path] = []
        self._fp_append = f"{name}.append"
        self._fp_rotate = f"{name}.rotate"
        self._fp_unlink = f"{name}.unlink"

    def segments(self) -> list[Path]:
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return [self.directory / name for name in sorted(names) if name.endswith(SUFFIX)]

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> list[Record]:
        """Every intact record in LSN order. Damage is reported (`damage`, the log) and read past; a torn
        region at the end of the last segment is cut."""
        records, _ = self.recover_segments()
        return [r for group in records for r in group]

    def recover_segments(self) -> tuple[list[list[Record]], list[Path]]:
        """`recover`, grouped by segment: the records of each segment and the segments' paths."""
        segments = self.segments()
        grouped: list[list[Record]] = []
        self.damage = []
        self._grow(-self.size)
        last_lsn = 0
        for i, path in enumerate(segments):
            data = path.read_bytes()
            scan = scan_segment(data, last_lsn)
            last = i == len(segments) - 1
            for offset, length, before, after, written in scan.damaged:
                tail = offset + length == len(data)
                if tail and not last:
                    after = _first_lsn(segments[i + 1])
                lost = max(after - before - 1, 0) if after else 0
                self._report(Damage(path.name, offset, length, lost, tail and last, written))
            if last and scan.end < len(data):
                self._cut(path, scan.end)
                data = data[: scan.end]
            if scan.records:
                last_lsn = scan.records[-1].lsn
            grouped.append(scan.records)
            self._grow(len(data))
        self.next_lsn = max(self.next_lsn, last_lsn + 1)
        return grouped, segments

    def _grow(self, nbytes: int) -> None:
        self.size += nbytes
        self.backlog.add(nbytes)

    def _report(self, damage: Damage) -> None:
        self.damage.append(damage)
        if damage.tail and not damage.written:
            log.warning("cutting a torn tail of %d bytes at byte %d of %s", damage.length, damage.offset,
                        self.directory / damage.segment)
        elif damage.tail:
            log.error("write-ahead log %s: the last record (byte %d, %d bytes) is damaged; it is cut and its "
                      "contents are lost", self.directory / damage.segment, damage.offset, damage.length)
        else:
            log.error(
                "write-ahead log %s is damaged at byte %d (%d bytes, about %d records lost); "
                "reading on from the next intact record", self.directory / damage.segment, damage.offset,
                damage.length, damage.lost_lsns,
            )

    @staticmethod
    def _cut(path: Path, end: int) -> None:
        with open(path, "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())

    # -- appends ------------------------------------------------------------------------------

    def append(self, entries: list[tuple[int, Payload]]) -> int:
        """Writes the records with one gathered write; returns the LSN of the last one.

        On failure the segment is cut back to where it was, so the log holds no partial record; if
        that fails too, the log refuses every later append (`broken`).
        """
        if self.broken is not None:
            raise OSError(f"write-ahead log {self.directory} is read-only after a failed write: {self.broken}")
        if self._file is None:
            self._open_segment()
        assert self._file is not None
        first_lsn = self.next_lsn
        parts: list[Payload] = []
        lsn = first_lsn
        total = 0
        for kind, payload in entries:
            view = memoryview(payload)
            parts += (header(kind, lsn, view), view)
            total += HEADER_SIZE + len(view)
            lsn += 1
        try:
            action = failpoints.hit(self._fp_append) if failpoints.ARMED else None
            self._write(parts, total, action)
            if self.sync_always:
                os.fsync(self._file)
            if action is not None:
                self._after_append(action, total)
        except OSError as exc:
            self._undo(exc)
            raise
        self.next_lsn = lsn
        self._current_size += total
        self.size += total
        self.backlog.add(total)
        self.bytes_written += total
        return lsn - 1

    def _write(self, parts: list[Payload], total: int, action: str | None) -> None:
        assert self._file is not None
        if action == "short":
            data = b"".join(bytes(p) for p in parts)
            os.write(self._file, data[: max(len(data) // 2, 1)])
            failpoints.after(self._fp_append, action)
        written = os.writev(self._file, parts)
        if written < total:
            rest = b"".join(bytes(p) for p in parts)[written:]
            while rest:
                rest = rest[os.write(self._file, rest) :]

    def _after_append(self, action: str, total: int) -> None:
        """A failpoint's "after" action on a written append: `corrupt` flips a byte of it in place."""
        assert self._file is not None and self._current is not None
        if action != "corrupt":
            failpoints.after(self._fp_append, action)
            return
        at = self._current_size + HEADER_SIZE + (total - HEADER_SIZE) // 2
        with open(self._current, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0xFF]))

    def _undo(self, exc: OSError) -> None:
        """Cuts a failed append off the segment; marks the log broken when that is impossible."""
        try:
            os.ftruncate(self._file, self._current_size)  # type: ignore[arg-type]
            os.fsync(self._file)  # type: ignore[arg-type]
            log.error("write-ahead log append to %s failed (%s); the segment is cut back to %d bytes",
                      self._current, exc, self._current_size)
        except OSError as undo_exc:
            self.broken = f"{exc}; cutting the partial write failed: {undo_exc}"
            log.critical("write-ahead log %s refuses appends: %s", self.directory, self.broken)

    def repair(self) -> bool:
        """A broken log: tries again to cut the partial write; True when the log takes appends again."""
        if self.broken is None:
            return True
        try:
            if self._file is not None:
                os.ftruncate(self._file, self._current_size)
                os.fsync(self._file)
        except OSError:
            return False
        log.warning("write-ahead log %s is writable again", self.directory)
        self.broken = None
        return True

    def probe(self) -> bool:
        """Whether the log's folder takes a write again (after ENOSPC/EIO): writes, syncs and removes a small file."""
        path = self.directory / ".probe"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"\0" * _PROBE_BYTES)
                os.fsync(fd)
            finally:
                os.close(fd)
            return True
        except OSError:
            return False
        finally:
            path.unlink(missing_ok=True)

    def _open_segment(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._current = self.directory / _segment_name(self.next_lsn)
        self._file = os.open(self._current, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._current_size = os.fstat(self._file).st_size
        _fsync_dir(self.directory)

    # -- sealing and removal ------------------------------------------------------------------

    def rotate(self) -> list[Path]:
        """Seals the current segment; returns every sealed segment (all but a new, empty current)."""
        action = failpoints.hit(self._fp_rotate) if failpoints.ARMED else None
        self.close()
        failpoints.after(self._fp_rotate, action)
        return self.segments()

    def close(self) -> None:
        if self._file is not None:
            fd, self._file = self._file, None
            self._current = None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def destroy(self) -> None:
        """Removes the whole log folder (the stream is deleted or made anew)."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def forget(self) -> None:
        """This log object is done with (closed, or replaced by one re-reading the folder): its bytes
        leave the gateway's backlog."""
        self._grow(-self.size)

    def remove(self, paths: list[Path]) -> None:
        """Deletes flushed segments. A segment that cannot be deleted now is retried at the next call."""
        pending = list(dict.fromkeys(self._unremoved + paths))
        self._unremoved = []
        removed = False
        for i, path in enumerate(pending):
            try:
                action = failpoints.hit(self._fp_unlink) if failpoints.ARMED else None
                size = path.stat().st_size if path.exists() else 0
                path.unlink(missing_ok=True)
                self._grow(-min(size, self.size))
                removed = True
                failpoints.after(self._fp_unlink, action)
            except OSError as exc:
                log.error("removing flushed log segment %s failed (%s); retried at the next flush", path, exc)
                self._unremoved = pending[i + (0 if path.exists() else 1) :]
                break
        if removed:
            try:
                _fsync_dir(self.directory)
            except OSError as exc:
                log.error("syncing log folder %s failed: %s", self.directory, exc)


def _first_lsn(segment: Path) -> int:
    """A segment's first LSN, from its name."""
    try:
        return int(segment.name[: -len(SUFFIX)])
    except ValueError:
        return 0


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
