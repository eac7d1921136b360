"""A file stream's index snapshots: when one is due, what it holds, and whether a restart can trust it.

A snapshot (index_file.py's format) is the index as it will be once a flush job is committed,
written after that commit with the table version it matches and the file bounds the reads hold;
a restart that finds it current reads no table at all. One is due after SNAPSHOT_ROWS flushed
messages or SNAPSHOT_SECONDS, whichever comes first, or when asked (a close, a rebuild, an erasure).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.index import MessageIndex
from engine.seqset import SeqSet
from engine.store import index_file
from engine.store.commits import is_latest_version
from engine.store.flush_commits import FlushJob
from engine.store.layout import Layout, Partitioner, TableLocation
from engine.store.objectstore import ObjectStoreError
from engine.store.sealed import Sealer
from engine.store.table_reads import TableReads

log = logging.getLogger(__name__)

SNAPSHOT_SECONDS = 30.0  # an index snapshot at most this often ...
SNAPSHOT_ROWS = 1_000_000  # ... or after this many flushed messages, whichever comes first

DedupSource = Callable[[], tuple[index_file.MsgIds, "str | None"]]  # the stream's duplicate window, last msg id
Snapshot = tuple[dict[str, Any], dict[str, np.ndarray]]  # meta, arrays


class IndexSnapshots:
    """The index snapshots of one stream, an object of the account's store (`Layout.index_snapshot_key`)."""

    # one per stream beside its store (thousands of streams): no instance dict
    __slots__ = (
        "layout", "key", "table", "stream", "stream_id", "reads", "partitioner", "index_cache_bytes", "sealer",
        "_at", "_rows", "_now",
    )

    def __init__(self, layout: Layout, table: TableLocation, stream: str, stream_id: str,
                 reads: TableReads, partitioner: Partitioner, index_cache_bytes: int,
                 sealer: Sealer | None = None) -> None:
        self.layout = layout
        self.key = layout.index_snapshot_key(stream)
        self.table = table
        self.stream = stream
        self.stream_id = stream_id
        self.reads = reads
        self.partitioner = partitioner
        self.index_cache_bytes = index_cache_bytes
        self.sealer = sealer
        self._at = time.monotonic()
        self._rows = 0
        self._now = False

    def request(self) -> None:
        """The next flush also writes an index snapshot (on close, so the next start reads no table)."""
        self._now = True

    def count(self, rows: int) -> None:
        """`rows` messages and removals were sealed into a flush job."""
        self._rows += rows

    def due(self) -> bool:
        return self._now or self._rows >= SNAPSHOT_ROWS or (
            self._rows > 0 and time.monotonic() - self._at >= SNAPSHOT_SECONDS
        )

    def stale(self) -> bool:
        """Whether messages or removals were flushed since the last snapshot, or one was asked for."""
        return bool(self._rows or self._now)

    def capture(self, index: MessageIndex, flushed_seq: int, lsn: int, dedup: DedupSource | None) -> Snapshot:
        """The index as it will be once the job is committed (everything sealed is in it), without the
        names of subjects that have no message left (no erased subject outlives its messages), and the
        duplicate window's ids (all of them are sealed too). An encrypted stream's ids are header content
        and the snapshot is not encrypted: they go into it sealed (sealed.py `seal_msg_ids`)."""
        index.forget_dead_subjects()
        meta: dict[str, Any] = {"stream_id": self.stream_id, "flushed_seq": flushed_seq, "lsn": lsn,
                                "partitions": sorted(self.partitioner.names())}
        arrays = index.to_arrays()
        if self.sealer is not None:
            arrays = self.sealer.seal_subject_arrays(arrays, flushed_seq)
        if dedup is not None:
            msg_ids, last_msg_id = dedup()
            packed = index_file.pack_msg_ids(msg_ids)
            if self.sealer is None:
                meta["last_msg_id"] = last_msg_id
            else:
                packed = self.sealer.seal_msg_ids(packed, last_msg_id, flushed_seq)
            arrays.update(packed)
        self._now = False
        return meta, arrays

    def write(self, job: FlushJob, table_version: int | None) -> None:
        """Writes the job's snapshot, if it carries one, now that the job is committed at `table_version`."""
        if job.snapshot is None:
            return
        meta, arrays = job.snapshot
        meta["table_version"] = table_version
        meta["file_bounds"], bounds = self.reads.file_bounds()
        arrays = {**arrays, **bounds}
        try:
            size = index_file.write(self.layout.objects, self.key, meta, arrays)
            log.debug("stream %s: index snapshot at seq %d (%d bytes)", self.stream, meta["flushed_seq"], size)
        except (OSError, ObjectStoreError) as exc:  # a snapshot only saves work at the next start
            log.warning("stream %s: index snapshot not written: %s", self.stream, exc)
        self._at = time.monotonic()
        self._rows = 0
        job.snapshot = None

    def drop(self) -> None:
        """Removes the index snapshot (an erasure: the next one is written without the erased subjects)."""
        self.layout.objects.delete(self.key)
        self._now = True

    # -- at a restart -------------------------------------------------------------------------

    def read(self) -> Snapshot | None:
        """The index snapshot, its sealed subject names opened (protected subjects); None when there is
        none or they do not open (sealed under a key since retired): the index is rebuilt from the table."""
        snapshot = index_file.read(self.layout.objects, self.key)
        if snapshot is None or self.sealer is None:
            return snapshot
        meta, arrays = snapshot
        if not self.sealer.open_subject_arrays(arrays, int(meta.get("flushed_seq", 0))):
            log.warning("stream %s: the index snapshot's subjects do not open: rebuilding from the table", self.stream)
            return None
        return snapshot

    def is_current(self, meta: dict[str, Any]) -> bool:
        """Whether nothing was committed to the table since the snapshot was written (at its
        `table_version`): then the table is not opened at all (a restart of many idle streams reads one
        small object per stream and the metadata of two commit objects, `commits.is_latest_version`). A
        maintenance job's commit also makes it stale, although jobs change no index content (they make
        tombstoned ranges physical and rewrite files): the table is read then, as for any snapshot."""
        version = meta.get("table_version")
        if meta.get("stream_id") != self.stream_id or not isinstance(version, int):
            return False
        return is_latest_version(self.table, version)

    def index_from(self, found: Snapshot | None, flushed_seq: int) -> tuple[MessageIndex | None, SeqSet | None]:
        """The snapshot's index if it belongs to this stream and the table holds what it says; and the
        removals it already counts."""
        if found is None:
            return None, None
        meta, arrays = found
        if meta.get("stream_id") != self.stream_id or meta.get("flushed_seq", 0) > flushed_seq:
            log.warning("stream %s: index snapshot is not this stream's or ahead of its table: rebuilding", self.stream)
            return None, None
        index = MessageIndex.from_arrays(arrays, cache_bytes=self.index_cache_bytes)
        index.loader = self.reads.index_rows
        index.time_seeker = self.reads.first_at_or_after
        index.flushed_upto = meta["flushed_seq"]
        self.partitioner.learn(set(meta.get("partitions", [])))
        if "file_bounds" in meta:
            self.reads.adopt_file_bounds(meta["file_bounds"], arrays)
        covered = SeqSet.from_arrays(*index.removed.to_arrays())
        return index, covered

    def msg_ids(self, snapshot: Snapshot, since_ns: int) -> tuple[index_file.MsgIds | None, str | None]:
        """The duplicate window the snapshot carries (opened for an encrypted stream), and the last id;
        (None, None) when it carries none the stream can use: the caller reads them from the table."""
        meta, arrays = snapshot
        last_msg_id = meta.get("last_msg_id")
        if self.sealer is not None:
            opened = self.sealer.open_msg_ids(arrays, int(meta["flushed_seq"]))
            if opened is None:
                return None, None
            (last_msg_id,) = opened
        return index_file.unpack_msg_ids(arrays, since_ns), last_msg_id
