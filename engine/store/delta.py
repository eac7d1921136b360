"""A file stream's storage: write-ahead log first, then its Delta table, written with delta-rs.

Publishes are made durable in the stream's log and kept in memory until the flusher commits them to
the table: one commit per stream per flush, carrying a Delta app transaction (`txn`, app id = the
stream's id, version = the last sequence it holds) so that replaying the log after a crash applies
each message exactly once. Removals go the same way into the shared tombstones table, versioned by
log sequence number. Reads of messages no longer in memory prune the table's files by partition and
by the `seq` statistics of the Delta log, then read one row group. `DeltaStore` composes the parts:
the unflushed backlog (unflushed.py), the flush's commit (flush_commits.py), the index snapshots
(index_snapshots.py), message reads (message_reads.py over table_reads.py) and the recovery at a
restart (stream_recovery.py). Counterpart: server/filestore.go.
"""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa

from engine.errors import JetStreamError
from engine.index import MessageIndex
from engine.store import delta_log
from engine.store.backlog import Backlog
from engine.store.base import Recovered, Removal, StoredMessage
from engine.store.commits import ensure_table, latest_version
from engine.store.flush_commits import FlushCommitter, FlushJob, flush_table
from engine.store.index_snapshots import DedupSource, IndexSnapshots
from engine.store.layout import (
    PARTITION_COLUMN,
    STREAM_SCHEMA,
    STREAM_TABLE_PROPERTIES,
    TOMBSTONE_SCHEMA,
    TOMBSTONE_TABLE_PROPERTIES,
    Layout,
    Partitioner,
)
from engine.store.lease import commit_lease
from engine.store.leases import Lease
from engine.store.memory import MessageBuffer
from engine.store.message_reads import MessageReads
from engine.store.object_log import open_log
from engine.store.removal_records import KIND_REMOVE, encode_removal
from engine.store.rows import RowGroup
from engine.store.sealed import Sealer
from engine.store.stream_recovery import StreamRecovery
from engine.store.table_reads import TableReads
from engine.store.tombstones import TombstoneView
from engine.store.unflushed import Unflushed

log = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 32 * 1024 * 1024  # per stream; `jetlake serve --cache-bytes`
LIFECYCLE_LEASE_TIMEOUT = 60.0  # how long a stream create or delete waits for a job's command on its table


class DeltaStore:
    """Storage of one file stream. The stream's lock serialises every call but `commit`."""

    def __init__(
        self,
        layout: Layout,
        stream: str,
        stream_id: str,
        partition_tokens: int = 0,
        sync_always: bool = False,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        backlog: Backlog | None = None,
        index_cache_bytes: int | None = None,
        sealer: Sealer | None = None,
        tombstones: TombstoneView | None = None,
        log_lease: Lease | None = None,
        stream_lease: bool = False,
    ) -> None:
        self.layout = layout
        # `stream_lease`: `log_lease` is the stream's own (several gateways), and its token fences the
        # stream's table commits too (a deposed owner's flush is refused by the table).
        self.fence_lease = log_lease if stream_lease else None
        self.stream = stream
        self.stream_id = stream_id
        keyed = sealer.keys.subject_hasher() if sealer is not None and sealer.protected else None
        self.partitioner = Partitioner(partition_tokens, keyed=keyed)
        self.sync_always = sync_always
        self.table = layout.stream_table_location(stream)
        delta_log.drop(self.table)  # a namesake's log state, or one another gateway has committed to since
        self.backlog = backlog or Backlog()
        self.wal = open_log(layout, stream, log_lease, sync_always, backlog=self.backlog)
        self.buffer = MessageBuffer(cache_bytes)
        self.sealer = sealer  # an encrypted stream (sealed.py): the log and the table hold sealed values
        self._unopened: dict[int, JetStreamError] = {}  # replayed messages whose values would not open
        self.reads = TableReads(self.table, self.partitioner, cache_bytes, sealer,
                                sealer.open_subjects if sealer is not None and sealer.protected else None)
        self.index_cache_bytes = index_cache_bytes or cache_bytes // 2
        self.unflushed = Unflushed()
        self.committer = FlushCommitter(layout, self.table, stream, stream_id, self.reads, sync_always=sync_always,
                                        sealer=sealer, fence_lease=self.fence_lease)
        self.snapshots = IndexSnapshots(layout, self.table, stream, stream_id, self.reads, self.partitioner,
                                        self.index_cache_bytes, sealer=sealer)
        self.message_reads = MessageReads(stream, self.buffer, self.reads, self.partitioner, self._unopened)
        self._tombstone_view = tombstones  # the account's tombstones read once (engine start); dropped after use
        self._loads = 0  # reads of messages through this store
        self._reads_at_commit = 0  # `_loads` and the index's `consulted` at the last commit

    def new_index(self) -> MessageIndex:
        """An empty index whose block details are read back from this table."""
        index = MessageIndex(cache_bytes=self.index_cache_bytes)
        index.loader = self.reads.index_rows
        index.time_seeker = self.reads.first_at_or_after
        return index

    @property
    def table_version(self) -> int | None:
        """The table's version as this store last committed or read it (None: no table yet)."""
        return self.committer.version

    @property
    def tombstone_lsn(self) -> int:
        """The stream's last committed tombstone's log sequence number (its app transaction)."""
        return self.committer.tombstone_lsn

    @property
    def commits(self) -> int:
        """Commits of messages to the stream's table by this store."""
        return self.committer.commits

    def create(self) -> None:
        """A new stream: its table and the tombstones table exist; nothing of an earlier namesake remains
        (a delete interrupted by a crash can leave its table or log behind). Under the table's commit
        lease, so a Spark job never rewrites a namesake's table halfway through its replacement.

        Raises TimeoutError when a job holds the lease past LIFECYCLE_LEASE_TIMEOUT; nothing changed then.
        """
        with commit_lease(self.layout.lease_file(self.table), timeout=LIFECYCLE_LEASE_TIMEOUT):
            self.wal.destroy()
            self.layout.objects.delete_prefix(self.table.key)
            schema = self.sealer.schema if self.sealer is not None else STREAM_SCHEMA
            ensure_table(self.table, schema, [PARTITION_COLUMN], STREAM_TABLE_PROPERTIES, self.sync_always)
        self.committer.version = latest_version(self.table)
        ensure_table(self.layout.tombstones, TOMBSTONE_SCHEMA, None, TOMBSTONE_TABLE_PROPERTIES, self.sync_always)

    # -- the write path -----------------------------------------------------------------------

    def append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        groups = [g for g in groups if len(g)]
        sealer = self.sealer
        entries: list[tuple[int, bytes | memoryview]] = [g.encode() if sealer is None else sealer.encode(g) for g in groups]
        if removals:
            entries.extend((KIND_REMOVE, encode_removal(r)) for r in removals)
        if not entries:
            return
        last_lsn = self.wal.append(entries)
        unflushed = self.unflushed
        for rows in groups:
            self.buffer.add(rows)
            unflushed.bytes += rows.nbytes
        if removals:
            first_lsn = last_lsn - len(removals) + 1
            unflushed.removals.extend((first_lsn + i, r) for i, r in enumerate(removals))
        unflushed.started()

    def pending_bytes(self) -> int:
        return self.unflushed.bytes

    def held_bytes(self) -> int:
        """Messages in memory not yet in the table: those waiting in the log and those under commit."""
        return self.unflushed.held_bytes()

    def wait_drained(self, timeout: float) -> None:
        """Returns once a commit has finished or failed, or after `timeout` seconds."""
        self.unflushed.wait_drained(timeout)

    def log_bytes(self) -> int:
        """Bytes of the stream's log not yet removed: what a restart would read."""
        return self.wal.size

    def refusal(self) -> str | None:
        """Why the stream takes no new messages now (its or the gateway's backlog is full); None if it does."""
        return self.backlog.refusal(self.wal.size)

    def unflushed_age(self, now: float | None = None) -> float:
        """Seconds since the oldest append not yet committed to the tables (0 when there is none)."""
        return self.unflushed.age(now)

    def has_pending(self) -> bool:
        return self.unflushed.has_pending()

    def seal(self, index: MessageIndex, dedup: DedupSource | None = None) -> FlushJob | None:
        """Cuts what is unflushed into a job; the log rolls to a new segment. `dedup` gives the stream's
        duplicate window for an index snapshot taken with the job."""
        unflushed = self.unflushed
        if not unflushed.has_pending():
            return None
        groups = self.buffer.unflushed()
        messages = None
        last_msg_seq = self.buffer.flushed_upto
        if groups:
            if self.sealer is not None:
                self.sealer.forget_upto(self.buffer.flushed_upto)
            table = self.sealer.table(groups) if self.sealer is not None else flush_table(groups)
            last_msg_seq = groups[-1].last_seq
            live = index.live_mask(table.column("seq").to_numpy())
            messages = table.filter(pa.array(live)) if not live.all() else table
            index.seal(last_msg_seq)
        job = FlushJob(
            messages=messages,
            last_msg_seq=last_msg_seq,
            removals=unflushed.removals,
            last_seq=index.last_seq,
            segments=self.wal.rotate(),
            buffered_upto=last_msg_seq,
            since=unflushed.oldest,
            rows=messages.num_rows if messages is not None else 0,
        )
        self.snapshots.count((messages.num_rows if messages is not None else 0) + len(unflushed.removals))
        if self.snapshots.due():
            job.snapshot = self.snapshots.capture(index, last_msg_seq, self.wal.next_lsn - 1, dedup)
        unflushed.sealed()
        return job

    def commit(self, job: FlushJob, lease_timeout: float | None = None) -> None:
        """Writes a sealed job to the tables under their commit leases, exactly once (see commits.py),
        then the index snapshot taken with it. Runs outside the stream's lock.

        Raises TimeoutError when a lease stays taken (a Spark job is committing) past `lease_timeout`.
        """
        self.committer.commit(job, lease_timeout)
        self.snapshots.write(job, self.committer.version)

    def requeue(self, job: FlushJob, index: MessageIndex) -> None:
        """A commit failed or waited: what it did not write stays pending; its segments are resealed next time.

        Messages already committed are marked flushed, so a retry never appends them twice.
        """
        unflushed = self.unflushed
        unflushed.removals = job.removals + unflushed.removals
        if job.snapshot is not None:
            self.snapshots.request()
            job.snapshot = None
        if job.messages_committed:
            self.buffer.mark_flushed(job.buffered_upto)
            index.mark_flushed(job.buffered_upto)
            self.reads.changed()
        elif job.messages is not None:
            unflushed.bytes += max(job.messages.nbytes, 1)
        unflushed.requeued(job.since)
        unflushed.release()

    def finish(self, job: FlushJob, index: MessageIndex) -> None:
        """After a commit: the buffered messages become a cache, the index may evict their details, and
        the sealed segments go (a segment that cannot be deleted now is retried at the next flush; it
        is never committed again)."""
        self.buffer.mark_flushed(job.buffered_upto)
        index.mark_flushed(job.buffered_upto)
        if not self._read_since_last_commit(index):
            self.shed_caches(index)
        self.reads.changed()
        self.unflushed.release()
        self.wal.remove(job.segments)

    def _read_since_last_commit(self, index: MessageIndex) -> bool:
        """Whether anything read this stream's messages, or the index's rows of what the table holds,
        since the previous commit. The copies a commit leaves (the messages the buffer keeps, the index's
        block details) serve readers that follow the stream closely; a stream only written to, as under a
        bulk load, drops them at once (a million distinct subjects: 40-60 MB less RSS while loading), and
        its first readers find those messages in the table (message_reads.py), as after a settle."""
        reads = self._loads + index.consulted
        fresh = reads != self._reads_at_commit
        self._reads_at_commit = reads
        return fresh

    def shed_caches(self, index: MessageIndex) -> int:
        """A write load ended: the copies of what the table now holds go (the recent messages the buffer
        kept, the index's block details); reads find them in the table. Returns the bytes dropped."""
        return self.buffer.drop_flushed() + index.drop_cached_details()

    # -- index snapshots ----------------------------------------------------------------------

    def snapshot_if_stale(self, index: MessageIndex, dedup: DedupSource | None = None) -> None:
        """Writes an index snapshot now if messages or removals were flushed since the last one and
        nothing is waiting (the engine's close: the next start then reads no table)."""
        if self.has_pending() or not self.snapshots.stale():
            return
        job = FlushJob(None, self.buffer.flushed_upto, [], index.last_seq, [], self.buffer.flushed_upto)
        job.snapshot = self.snapshots.capture(index, self.buffer.flushed_upto, self.wal.next_lsn - 1, dedup)
        self.snapshots.write(job, self.committer.version)

    def drop_snapshot(self) -> None:
        """Removes the index snapshot (an erasure: the next one is written without the erased subjects)."""
        self.snapshots.drop()

    # -- reads --------------------------------------------------------------------------------

    def load(self, seq: int, index: MessageIndex, subject: str | None = None) -> StoredMessage | None:
        """The live message `seq`, or None (message_reads.py)."""
        self._loads += 1
        return self.message_reads.load(seq, index, subject)

    def load_many(self, seqs: list[int], index: MessageIndex) -> dict[int, StoredMessage]:
        """Live messages among `seqs` (ascending), read a window ahead (message_reads.py)."""
        self._loads += 1
        return self.message_reads.load_many(seqs, index)

    def mark_table_changed(self) -> None:
        """A job rewrote the table: decoded row groups of replaced files go."""
        self.reads.forget()

    # -- recovery -----------------------------------------------------------------------------

    def recover(self, msg_id_since_ns: int) -> Recovered:
        """Rebuilds the index from its snapshot (or the table), the tombstones and the log (stream_recovery.py)."""
        return StreamRecovery(
            self.stream, self.stream_id, self.wal, self.buffer, self.partitioner, self.reads, self.snapshots,
            self.committer, self.unflushed, self.new_index, self._take_tombstones, self.sealer, self._unopened,
        ).recover(msg_id_since_ns)

    def _take_tombstones(self) -> TombstoneView:
        """The account's tombstones read at engine start serve one recovery; a later one reads the table."""
        view, self._tombstone_view = self._tombstone_view, None
        return view or TombstoneView(self.layout.tombstones)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        self.wal.forget()
        self.wal.close()

    def destroy(self) -> None:
        """Removes the stream's table and log, under the table's commit lease (a job rewriting the table
        finishes its command first). Its tombstone rows go with the next retention job. If a job holds
        the lease past LIFECYCLE_LEASE_TIMEOUT the folders stay, as after a crash mid-delete: a namesake's
        `create` removes them."""
        self.wal.forget()
        self.wal.close()
        self.buffer.clear()
        self.mark_table_changed()
        try:
            with commit_lease(self.layout.lease_file(self.table), timeout=LIFECYCLE_LEASE_TIMEOUT):
                self.layout.objects.delete_prefix(self.table.key)
                self.wal.destroy()
            delta_log.drop(self.table)
        except TimeoutError:
            log.error("stream %s deleted, but a job holds its table's lease: its table and log stay until a "
                      "namesake is created", self.stream)

    def forget(self, seqs: np.ndarray) -> None:
        """Erased messages leave the memory at once: blanked in the buffer (which is also the cache of
        recent messages), and every decoded row group of the table dropped (they are decoded again on
        the next read, from files that no longer hold them once the erase job has run)."""
        self.buffer.blank(seqs)
        self.mark_table_changed()
