"""The write-ahead log in the object store (`--wal object`): one object per group commit.

Each `append` (one group commit of a stream, or of the account's acks) becomes one object under
`<account>/_log/<STREAM>/<first LSN, 20 digits>.wal`, holding the round's records in the local log's
format (wal.py: `JLW2` headers, xxh3 checksums), written with a create-if-absent PUT and stamped with
the owner lease's fencing token (leases.py `fenced_create`). The PubAck follows the PUT: an
acknowledged message is in the bucket, so a gateway that dies loses nothing and the next owner of
the warehouse, on any machine, replays the objects in LSN order and goes on from there. A deposed
owner cannot add to the log: its PUT of an LSN the new owner wrote loses, and a newer token found
there stops it (`LeaseLostError`, the stream then refuses writes).

The flusher treats each object as a sealed segment: `rotate` hands over every object written so
far, `remove` deletes those committed to the tables. Same interface as `WriteAheadLog`, so
engine/store/delta.py and acks.py do not know which log they write.
Counterpart: none in nats-server (its log is a file store on the server's disk); the design is the
object-store streamers' (docs/object-storage.md, "--wal object").
"""

from __future__ import annotations

import logging
import uuid

from engine.store.backlog import Backlog
from engine.store.leases import Lease, LeaseLostError, fenced_create, read_fenced
from engine.store.objectstore import ObjectNotFoundError, ObjectStore, ObjectStoreError
from engine.store.layout import Layout
from engine.store.wal import SUFFIX, Damage, Payload, Record, WriteAheadLog, header, scan_segment

log = logging.getLogger(__name__)


class ObjectLog:
    """One stream's log (or the ack log) as objects under `prefix`. The owner's lock serialises calls.

    Args:
        store: the warehouse's object store.
        prefix: the log's folder key, e.g. `default/_log/ORDERS`.
        lease: the warehouse owner's lease; its token fences every object.
        name: prefixes log lines (`wal`, `acklog`).
        backlog: the gateway's bound on unflushed bytes.
    """

    def __init__(self, store: ObjectStore, prefix: str, lease: Lease, name: str = "wal",
                 backlog: Backlog | None = None) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.directory = self.prefix  # what log lines and reports call the log
        self.lease = lease
        self.name = name
        self.backlog = backlog or Backlog()
        self.next_lsn = 1
        self.size = 0
        self.bytes_written = 0
        self.broken: str | None = None
        self.damage: list[Damage] = []
        self._objects: dict[str, int] = {}  # key -> bytes, every object not yet removed
        self._unremoved: list[str] = []

    # -- recovery -----------------------------------------------------------------------------

    def segments(self) -> list[str]:
        return sorted(meta.key for meta in self.store.list(self.prefix) if meta.key.endswith(SUFFIX))

    def recover(self) -> list[Record]:
        records, _ = self.recover_segments()
        return [r for group in records for r in group]

    def recover_segments(self) -> tuple[list[list[Record]], list[str]]:
        """Every object's records in LSN order. An object is whole or absent (a PUT is atomic), so damage
        here is a bucket's bytes changed after the write: reported, and read past as the local log does."""
        keys = self.segments()
        grouped: list[list[Record]] = []
        self.damage = []
        self._grow(-self.size)
        self._objects = {}
        last_lsn = 0
        for key in keys:
            try:
                data = read_fenced(self.store, key).payload
            except ObjectNotFoundError:
                continue  # removed by a flush meanwhile (only before this owner took over)
            except ValueError as exc:
                self.damage.append(Damage(key, 0, 0, 0, False, True))
                log.error("log object %s unreadable (%s); skipped", key, exc)
                continue
            scan = scan_segment(data, last_lsn)
            for offset, length, before, after, written in scan.damaged:
                lost = max(after - before - 1, 0) if after else 0
                self.damage.append(Damage(key, offset, length, lost, False, written))
                log.error("log object %s is damaged at byte %d (%d bytes)", key, offset, length)
            if scan.records:
                last_lsn = scan.records[-1].lsn
            grouped.append(scan.records)
            self._objects[key] = len(data)
            self._grow(len(data))
        self.next_lsn = max(self.next_lsn, last_lsn + 1)
        return grouped, keys

    def _grow(self, nbytes: int) -> None:
        self.size += nbytes
        self.backlog.add(nbytes)

    # -- appends ------------------------------------------------------------------------------

    def append(self, entries: list[tuple[int, Payload]]) -> int:
        """Writes the records as one object; returns the LSN of the last one. Raises OSError when the
        object is not written (the caller answers the publish with an error, as for a local log)."""
        if self.broken is not None:
            raise OSError(f"log {self.prefix} refuses appends: {self.broken}")
        first_lsn = self.next_lsn
        parts: list[bytes] = []
        lsn = first_lsn
        for kind, payload in entries:
            view = memoryview(payload)
            parts += (header(kind, lsn, view), bytes(view))
            lsn += 1
        data = b"".join(parts)
        key = f"{self.prefix}/{first_lsn:020d}{SUFFIX}"
        try:
            fenced_create(self.lease, key, data)
        except LeaseLostError as exc:
            self.broken = f"this gateway no longer owns the warehouse: {exc}"
            raise OSError(self.broken) from exc
        except ObjectStoreError as exc:
            if not self._landed(key, data):
                raise OSError(f"log object {key} not written: {exc}") from exc
        self.next_lsn = lsn
        self._objects[key] = len(data)
        self._grow(len(data))
        self.bytes_written += len(data)
        return lsn - 1

    def _landed(self, key: str, data: bytes) -> bool:
        """After a failed PUT: whether the object is there with exactly these bytes (an answer lost)."""
        try:
            return read_fenced(self.store, key).payload == data
        except (ObjectStoreError, ValueError):
            return False

    def repair(self) -> bool:
        return self.broken is None

    def probe(self) -> bool:
        """Whether the store takes a write again: a small object written and removed."""
        key = f"{self.prefix}/.probe-{uuid.uuid4().hex}"
        try:
            self.store.put(key, b"\0")
            self.store.delete(key)
            return True
        except ObjectStoreError:
            return False

    # -- sealing and removal ------------------------------------------------------------------

    def rotate(self) -> list[str]:
        """Every object written so far is sealed (one object per append)."""
        return sorted(self._objects)

    def close(self) -> None:
        """Nothing is open between appends."""

    def forget(self) -> None:
        self._grow(-self.size)

    def remove(self, keys: list[str]) -> None:
        """Deletes objects committed to the tables; one that cannot be deleted now is retried next time."""
        pending = list(dict.fromkeys(self._unremoved + keys))
        self._unremoved = []
        for i, key in enumerate(pending):
            try:
                self.store.delete(key)
            except ObjectStoreError as exc:
                log.error("removing flushed log object %s failed (%s); retried at the next flush", key, exc)
                self._unremoved = pending[i:]
                return
            self._grow(-min(self._objects.pop(key, 0), self.size))

    def destroy(self) -> None:
        """Removes the whole log (the stream is deleted or made anew)."""
        self._objects = {}
        self.store.delete_prefix(self.prefix)


def open_log(layout: Layout, name: str, lease: Lease | None, sync_always: bool = False, log_name: str = "wal",
             backlog: Backlog | None = None) -> WriteAheadLog | ObjectLog:
    """A stream's log (`name` = the stream, or `.acks`): in the object store, fenced by `lease`, when one
    is given (`--wal object`); else in its local folder."""
    if lease is None:
        return WriteAheadLog(layout.wal_dir(name), sync_always=sync_always, name=log_name, backlog=backlog)
    return ObjectLog(layout.objects, layout.object_log_key(name), lease, log_name, backlog)


def read_log_objects(store: ObjectStore, prefix: str) -> list[tuple[str, list[Record]]]:
    """The records of every log object under `prefix`, read-only: for readers beside the owner (the erase
    and rekey jobs check which sequences a stream's log still holds). An object removed meanwhile by a
    flush is left out. Raises ValueError for an object that is not a fenced log object."""
    out: list[tuple[str, list[Record]]] = []
    for key in sorted(meta.key for meta in store.list(prefix) if meta.key.endswith(SUFFIX)):
        try:
            data = read_fenced(store, key).payload
        except ObjectNotFoundError:
            continue
        out.append((key, scan_segment(data).records))
    return out
