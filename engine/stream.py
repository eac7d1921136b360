"""A stream: JetStream's publish checks, limits, retention of messages, purge, get and delete.

The state machine is synchronous and deterministic, driven by an injected clock; the stream's lock
serialises it. `process` takes the messages of one group commit, checks each in JetStream's order
(sealed, expected stream, duplicate window, expected last sequence / subject sequence / msg id,
rollup, size, limits with discard new), assigns sequences to the accepted ones, applies limits with
discard old and rollups, and hands the store one append of messages and removals, so a refused
publish takes no sequence and a PubAck always follows the log write. Counterpart: server/stream.go
(processJetStreamMsg, purge, removeMsg) and the limit handling of server/memstore.go.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import errors, headers as hdr
from engine.accounts.limits import account_resources_exceeded
from engine.clock import Clock
from engine.config import StreamConfig
from engine.errors import JetStreamError
from engine.index import MessageIndex, merge_ranges, seq_ranges
from engine.messages import (
    DEFAULT_MAX_PAYLOAD,
    STORE_OVERHEAD,
    AckRun,
    InboundMessage,
    PlainBatch,
    PubAck,
    PublishAnswer,
    PublishRequest,
    PublishResult,
    message_size,
)
from engine.store.rows import RowGroup, Rows, plain_rows
from engine.store.base import Removal, StoredMessage, StreamStore
from engine.subjects import FWC, is_valid_subject

if TYPE_CHECKING:
    from engine.consumer import Consumer


class Quota(Protocol):
    """The account's storage limit, as a publish sees it (the engine sums the account's streams)."""

    def exceeds(self, storage: str, size: int) -> bool: ...


SUBJECTS_PAGE = 100_000  # nats-server's JSMaxSubjectDetails


class _Accepted:
    """Columns of the messages a group commit accepts, and the removals it causes."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.subjects: list[str] = []
        self.ts: list[int] = []
        self.msg_ids: list[str | None] = []
        self.headers: list[dict[str, list[str]] | None] = []
        self.data: list[bytes] = []
        self.sizes: list[int] = []
        self.partitions: list[str] = []
        self.removed: dict[str, list[tuple[int, int]]] = {}  # reason -> inclusive sequence ranges
        self.groups: list[RowGroup] = []

    def add_run(self, run: RowGroup) -> None:
        """A columnar run: it follows the messages accepted so far, so they are closed into a group first."""
        self.close()
        self.groups.append(run)

    def close(self) -> None:
        """Turns the messages accepted one by one since the last run into a row group."""
        if self.seqs:
            self.groups.append(Rows(self.seqs[0], self.subjects, self.ts, self.msg_ids, self.headers, self.data, self.sizes, self.partitions))
            self.seqs, self.subjects, self.ts, self.msg_ids = [], [], [], []
            self.headers, self.data, self.sizes, self.partitions = [], [], [], []

    def remove(self, reason: str, ranges: list[tuple[int, int]]) -> None:
        if ranges:
            self.removed.setdefault(reason, []).extend(ranges)


class Stream:
    """One stream's state. Every public method takes the stream's lock."""

    def __init__(
        self,
        config: StreamConfig,
        created_ns: int,
        stream_id: str,
        store: StreamStore,
        clock: Clock,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
    ) -> None:
        self.config = config
        self.created_ns = created_ns
        self.stream_id = stream_id
        self.store = store
        self.clock = clock
        self.max_payload = max_payload
        self.index: MessageIndex = store.new_index()
        self.lock = threading.RLock()
        self._msg_ids: dict[str, tuple[int, int]] = {}
        self._msg_id_order: deque[tuple[int, str]] = deque()
        self.last_msg_id: str | None = None
        self.consumers: dict[str, Consumer] = {}
        self.deleted = False
        self.failure: str | None = None  # set: writes are refused (503)
        self.unavailable: str | None = None  # set: every request is refused (503): memory is not what the disk holds
        self.recovered = True  # False: its recovery failed at start; only a restart loads it
        self.quota: Quota | None = None  # set when the account limits its bytes: publishes are then checked one by one

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> None:
        with self.lock:
            since = self.clock.now_ns() - self.config.duplicate_window
            recovered = self.store.recover(since)
            assert recovered.index is not None
            self.index = recovered.index
            for msg_id, seq, ts in recovered.msg_ids:
                self._remember_msg_id(msg_id, seq, ts)
            self.last_msg_id = recovered.last_msg_id
            if self.config.first_seq and self.index.last_seq == 0:
                self.index.skip_to(self.config.first_seq)
            self._expire(self.clock.now_ns())

    def reload(self, store: StreamStore) -> None:
        """Forgets the in-memory state and rebuilds it from the disk through a fresh `store`: after a
        failed log write, whose messages and removals memory had already applied. Writes stay refused
        (`failure`) until the flusher finds the log writable again."""
        with self.lock:
            old, self.store = self.store, store
            try:
                old.close()
            except OSError:
                pass  # its segment is re-read from disk below; a failed close loses nothing acknowledged
            self.index = store.new_index()
            self._msg_ids = {}
            self._msg_id_order = deque()
            self.last_msg_id = None
            self.recover()
            self.unavailable = None

    def start_at_first_seq(self) -> None:
        """A new stream with `first_seq`: its first message gets that sequence, durably."""
        with self.lock:
            if self.config.first_seq and self.config.first_seq > 1:
                self.index.skip_to(self.config.first_seq)
                self._store_append([], [Removal([], "first_seq", last_seq=self.index.last_seq, ts=self.clock.now_ns())])

    # -- publish ------------------------------------------------------------------------------

    def process(self, groups: list[PublishRequest]) -> list[PublishAnswer]:
        """Checks and stores the messages of one group commit; one store append for all of them."""
        with self.lock:
            self._check_writable()
            refusal = self.store.refusal()
            if refusal is not None:
                raise errors.UnavailableError(f"insufficient resources: stream {self.name} is not flushed ({refusal})")
            now = self.clock.now_ns()
            accepted = _Accepted()
            self._expire(now, accepted)
            plain = self._plain_path_allowed()
            results = [self._process_group(group, plain, now, accepted) for group in groups]
            self._append(accepted, now)
            if self.config.storage == "memory":
                self.store.forget_below(self.index.first_seq)  # type: ignore[attr-defined]
            return results

    def _process_group(self, group: PublishRequest, plain: bool, now: int, acc: _Accepted) -> PublishAnswer:
        if type(group) is list and len(group) == 1:
            msg = group[0]
            if msg.headers is None and (plain or self._fits_whole(1, len(msg.data) + len(msg.subject))):
                return [self._store_lone(msg, now, acc)]
            return [self._publish_one(msg, now, acc)]
        if isinstance(group, PlainBatch):
            if plain or self._fits_whole(len(group), int(group.lengths().sum()) + sum(map(len, group.subjects))):
                return self._store_columns(group, now, acc)
            group = group.messages()
        if all(m.headers is None for m in group) and (
            plain or self._fits_whole(len(group), sum(len(m.data) + len(m.subject) for m in group))
        ):
            return self._store_plain(group, now, acc)
        return [self._publish_one(m, now, acc) for m in group]

    def _fits_whole(self, count: int, nbytes: int) -> bool:
        """Discard new with max_msgs/max_bytes: a run without headers that fits whole is stored as one
        run (each message fits after the ones before it, so one by one would accept them all too)."""
        c, ix = self.config, self.index
        if c.sealed or c.retention == "interest" or c.discard != "new" or c.discard_new_per_subject:
            return False
        if c.max_msgs > 0 and ix.msgs + count > c.max_msgs:
            return False
        return c.max_bytes <= 0 or ix.bytes + nbytes + count * STORE_OVERHEAD <= c.max_bytes

    def _check_writable(self) -> None:
        if self.deleted:
            raise errors.StreamNotFoundError()
        if self.unavailable is not None:
            raise errors.UnavailableError(f"stream {self.name} is unavailable: {self.unavailable}")
        if self.failure is not None:
            raise errors.store_failed(f"stream {self.name} refuses writes: {self.failure}")

    def _store_append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        """Every write to the store. A failed log write leaves the log as it was (wal.py) but memory
        ahead of it: the stream refuses everything until the flusher has re-read it (`reload`)."""
        if self.deleted:
            raise errors.StreamNotFoundError()
        cause: OSError | None = None
        if self.failure is None:
            try:
                self.store.append(groups, removals)
                return
            except OSError as exc:
                cause = exc
                self.failure = f"write-ahead log write failed: {exc}"
        self.unavailable = self.failure
        raise errors.store_failed(f"stream {self.name} refuses writes: {self.failure}") from cause

    def _plain_path_allowed(self) -> bool:
        """Whether messages without headers can skip the per-message checks: only size can refuse them."""
        c = self.config
        return self.quota is None and not c.sealed and c.retention != "interest" and (c.discard == "old" or (c.max_msgs < 0 and c.max_bytes < 0 and not c.discard_new_per_subject))

    def _store_plain(self, group: list[InboundMessage], now: int, acc: _Accepted) -> list[PublishResult]:
        """Messages without headers, stored as one run: the same outcome as one by one, in bulk."""
        c, ix = self.config, self.index
        limit = self.max_payload if c.max_msg_size < 0 else min(self.max_payload, c.max_msg_size)
        ts = max(now, ix.last_ts)
        name = c.name
        subjects = [m.subject for m in group]
        data = [m.data for m in group]
        results: list[PublishResult]
        if max(map(len, data), default=0) > limit:
            subjects, data, results = self._without_too_large(subjects, data, limit)
        else:
            first = ix.last_seq + 1
            results = [PubAck(name, seq) for seq in range(first, first + len(subjects))]  # type: ignore[misc]
        sizes = [len(s) + len(d) + STORE_OVERHEAD for s, d in zip(subjects, data)]
        if not subjects:
            return results
        first = ix.last_seq + 1
        ix.append_run(first, subjects, sizes, ts)
        count = len(subjects)
        acc.seqs.extend(range(first, first + count))
        acc.subjects.extend(subjects)
        acc.ts.extend([ts] * count)
        acc.msg_ids.extend([None] * count)
        acc.headers.extend([None] * count)
        acc.data.extend(data)
        acc.sizes.extend(sizes)
        partition_of = self.store.partitioner
        partitions = {s: partition_of(s) for s in set(subjects)}
        acc.partitions.extend([partitions[s] for s in subjects])
        self.last_msg_id = None
        if c.max_msgs_per_subject > 0:
            for subject in set(subjects):
                self._enforce_limits(subject, acc)
        else:
            self._enforce_limits(subjects[-1], acc)
        return results

    def _store_lone(self, msg: InboundMessage, now: int, acc: _Accepted) -> PublishResult:
        """`_store_plain` of one message (a sync publisher's): the same checks and outcome, without the
        columns and comprehensions a run needs."""
        c, ix = self.config, self.index
        data, subject = msg.data, msg.subject
        if len(data) > (self.max_payload if c.max_msg_size < 0 else min(self.max_payload, c.max_msg_size)):
            return errors.message_too_large()
        seq = ix.last_seq + 1
        ts = max(now, ix.last_ts)
        size = len(subject) + len(data) + STORE_OVERHEAD
        ix.append(seq, subject, size, ts)
        acc.seqs.append(seq)
        acc.subjects.append(subject)
        acc.ts.append(ts)
        acc.msg_ids.append(None)
        acc.headers.append(None)
        acc.data.append(data)
        acc.sizes.append(size)
        acc.partitions.append(self.store.partitioner(subject))
        self.last_msg_id = None
        self._enforce_limits(subject, acc)
        return PubAck(c.name, seq)

    def _without_too_large(
        self, subjects: list[str], data: list[bytes], limit: int
    ) -> tuple[list[str], list[bytes], list[PublishResult]]:
        """A run with some payloads over the limit: those are refused and take no sequence."""
        kept_subjects: list[str] = []
        kept_data: list[bytes] = []
        results: list[PublishResult] = []
        seq = self.index.last_seq
        for subject, payload in zip(subjects, data):
            if len(payload) > limit:
                results.append(errors.message_too_large())
                continue
            seq += 1
            kept_subjects.append(subject)
            kept_data.append(payload)
            results.append(PubAck(self.config.name, seq))
        return kept_subjects, kept_data, results

    def _store_columns(self, batch: PlainBatch, now: int, acc: _Accepted) -> PublishAnswer:
        """`_store_plain` for a columnar batch: the same checks and outcome, and the payload array
        becomes the stored column (and the log record) without a Python object per message."""
        c, ix = self.config, self.index
        limit = self.max_payload if c.max_msg_size < 0 else min(self.max_payload, c.max_msg_size)
        subjects, data, lengths = batch.subjects, batch.data, batch.lengths()
        refused: list[PublishResult] | None = None
        if len(lengths) and int(lengths.max()) > limit:
            keep = lengths <= limit
            refused = self._refuse_too_large(keep)
            subjects = [s for s, k in zip(subjects, keep.tolist()) if k]
            data, lengths = data.filter(pa.array(keep)), lengths[keep]
        count = len(subjects)
        first = ix.last_seq + 1
        if count:
            ts = max(now, ix.last_ts)
            distinct = set(subjects)
            if len(distinct) == 1:
                subject = subjects[0]
                sizes = lengths + (len(subject) + STORE_OVERHEAD)
                subject_column = pa.repeat(pa.scalar(subject, pa.string()), count)
                partition_column = pa.repeat(pa.scalar(self.store.partitioner(subject), pa.string()), count)
            else:  # as columns: a batch of a thousand new subjects makes no Python object per subject here
                subject_column = batch.subject_column() if refused is None else pa.array(subjects, pa.string())
                sizes = lengths + pc.utf8_length(subject_column).to_numpy(zero_copy_only=False) + STORE_OVERHEAD
                partition_column = self.store.partitioner.column(subject_column)
            ix.append_run(first, subjects, sizes, ts)
            acc.add_run(plain_rows(first, subject_column, ts, data, sizes, partition_column))
            self.last_msg_id = None
            if c.max_msgs_per_subject > 0 and len(distinct) > 1:
                self._enforce_subject_limits(list(distinct), acc)
            self._enforce_limits(subjects[-1], acc)
        return refused if refused is not None else AckRun(c.name, first, count)

    def _refuse_too_large(self, keep: np.ndarray) -> list[PublishResult]:
        """The answers of a run some of whose payloads are over the limit: those take no sequence."""
        seq = self.index.last_seq
        results: list[PublishResult] = []
        for kept in keep.tolist():
            if kept:
                seq += 1
                results.append(PubAck(self.config.name, seq))
            else:
                results.append(errors.message_too_large())
        return results

    def _publish_one(self, msg: InboundMessage, now: int, acc: _Accepted) -> PublishResult:
        try:
            return self._check_and_store(msg, now, acc)
        except JetStreamError as exc:
            return exc

    def _check_and_store(self, msg: InboundMessage, now: int, acc: _Accepted) -> PubAck:
        c = self.config
        h = msg.headers
        if c.sealed:
            raise errors.sealed()
        if h:
            expected_stream = hdr.first(h, hdr.EXPECTED_STREAM)
            if expected_stream is not None and expected_stream != c.name:
                raise errors.stream_not_match()
        if h:
            self._check_expected_sequences(msg.subject, h)
        msg_id = hdr.first(h, hdr.MSG_ID) if h else None
        if msg_id:
            self._expire_msg_ids(now)
            seen = self._msg_ids.get(msg_id)
            if seen is not None:
                return PubAck(c.name, seen[0], duplicate=True)
        if h:
            expected_msg_id = hdr.first(h, hdr.EXPECTED_LAST_MSG_ID)
            if expected_msg_id is not None and expected_msg_id != (self.last_msg_id or ""):
                raise errors.wrong_last_msg_id(self.last_msg_id or "")
        if h and hdr.TTL in h:
            if not hdr.valid_ttl(hdr.first(h, hdr.TTL) or ""):
                raise errors.ttl_invalid()
            # `allow_msg_ttl` is accepted (nats.py sets it on every KV bucket) but no TTL is honoured yet.
            raise errors.ttl_not_supported() if c.allow_msg_ttl else errors.ttl_disabled()
        rollup = self._rollup(h) if h else None
        headers_size = hdr.wire_size(h)
        if headers_size > hdr.MAX_HEADERS_SIZE:
            raise errors.header_too_large()
        payload_size = headers_size + len(msg.data)
        if payload_size > self.max_payload or (c.max_msg_size >= 0 and payload_size > c.max_msg_size):
            raise errors.message_too_large()
        size = message_size(msg.subject, headers_size, len(msg.data))
        if self.quota is not None and self.quota.exceeds(c.storage, size):
            raise account_resources_exceeded()
        self._check_discard_new(msg.subject, size, rollup)

        seq = self.index.last_seq + 1
        ts = max(now, self.index.last_ts)
        self.index.append(seq, msg.subject, size, ts)
        acc.seqs.append(seq)
        acc.subjects.append(msg.subject)
        acc.ts.append(ts)
        acc.msg_ids.append(msg_id)
        acc.headers.append(h)
        acc.data.append(msg.data)
        acc.sizes.append(size)
        acc.partitions.append(self.store.partitioner(msg.subject))
        self.last_msg_id = msg_id
        if msg_id:
            self._remember_msg_id(msg_id, seq, ts)
        if rollup == hdr.ROLLUP_SUBJECT:
            acc.remove("rollup", self._remove(self.index.live_seqs(msg.subject, stop=seq)))
        elif rollup == hdr.ROLLUP_ALL:
            acc.remove("rollup", self._remove_through(seq - 1)[1])
        self._enforce_limits(msg.subject, acc)
        if c.retention == "interest" and not any(x.matches(msg.subject) for x in self.consumers.values()):
            acc.remove("interest", self._remove(np.array([seq], np.int64)))
        return PubAck(c.name, seq)

    def _check_expected_sequences(self, subject: str, h: dict[str, list[str]]) -> None:
        expected_last = hdr.first(h, hdr.EXPECTED_LAST_SEQ)
        if expected_last is not None:
            if _parse_seq(expected_last) != self.index.last_seq:
                raise errors.WrongLastSequenceError(self.index.last_seq)
        expected_subject_seq = hdr.first(h, hdr.EXPECTED_LAST_SUBJECT_SEQ)
        check_subject = hdr.first(h, hdr.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT)
        if expected_subject_seq is not None:
            target = check_subject or subject
            if not is_valid_subject(target):
                raise errors.bad_request(f"invalid {hdr.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT}")
            last = self.index.last_seq_for(target)
            if _parse_seq(expected_subject_seq) != last:
                raise errors.WrongLastSequenceError(last)
        elif check_subject is not None:
            raise errors.expected_subject_alone()

    def _rollup(self, h: dict[str, list[str]]) -> str | None:
        value = hdr.first(h, hdr.ROLLUP)
        if value is None:
            return None
        if not self.config.allow_rollup_hdrs or self.config.deny_purge:
            raise errors.rollup_failed("rollup not permitted")
        if value not in (hdr.ROLLUP_SUBJECT, hdr.ROLLUP_ALL):
            raise errors.rollup_failed(f'rollup value invalid: "{value}"')
        return value

    def _check_discard_new(self, subject: str, size: int, rollup: str | None) -> None:
        c, ix = self.config, self.index
        if c.discard != "new":
            return
        if c.max_msgs > 0 and ix.msgs + 1 > c.max_msgs:
            raise errors.store_failed("maximum messages exceeded")
        if c.max_bytes > 0 and ix.bytes + size > c.max_bytes:
            raise errors.store_failed("maximum bytes exceeded")
        if c.discard_new_per_subject and c.max_msgs_per_subject > 0 and rollup is None:
            if ix.subject_state(subject)[0] + 1 > c.max_msgs_per_subject:
                raise errors.store_failed("maximum messages per subject exceeded")

    def _enforce_limits(self, subject: str | None, acc: _Accepted) -> None:
        """Discard old: drop the oldest messages past the limits (per subject always, as JetStream)."""
        c, ix = self.config, self.index
        if c.max_msgs_per_subject > 0:
            subjects = [subject] if subject is not None else [s for s, *_ in ix.iter_subject_states()]
            for subj in subjects:
                msgs, first, _ = ix.subject_state(subj)
                excess = msgs - c.max_msgs_per_subject
                if excess == 1:  # a KV put over its history: the subject's first message goes
                    acc.remove("limits", self._remove(np.array([first], np.int64)))
                elif excess > 0:
                    acc.remove("limits", self._remove(ix.oldest_seqs(subj, excess)))
        if c.discard == "new" and subject is not None:
            return
        if c.max_msgs > 0 and ix.msgs > c.max_msgs:
            acc.remove("limits", self._remove_through(ix.nth_live_seq(ix.msgs - c.max_msgs))[1])
        if c.max_bytes > 0 and ix.bytes > c.max_bytes:
            acc.remove("limits", self._remove_through(ix.seq_covering_bytes(ix.bytes - c.max_bytes))[1])

    def _enforce_subject_limits(self, subjects: list[str], acc: _Accepted) -> None:
        """`max_msgs_per_subject` for the many subjects of a columnar run at once: a subject one over the
        limit (a run usually adds one message per subject) loses its first message, and those go in
        one removal; a subject further over goes through `_enforce_limits` alone."""
        table, limit = self.index.subjects, self.config.max_msgs_per_subject
        sids = table.ids(subjects)
        excess = table.msgs[sids].astype(np.int64) - limit  # int32 counts: a limit may exceed 2**31
        if not (excess > 0).any():
            return
        acc.remove("limits", self._remove(np.unique(table.first[sids[excess == 1]]).astype(np.int64)))
        for i in np.flatnonzero(excess > 1).tolist():
            self._enforce_limits(subjects[i], acc)

    def _expire(self, now: int, acc: _Accepted | None = None) -> None:
        """`max_age`: messages older than it leave every read at once (not while writes are refused:
        the removal could not be logged)."""
        max_age = self.config.max_age
        if not max_age or self.index.msgs == 0 or self.index.first_ts >= now - max_age or self.failure is not None:
            return
        _, ranges = self._remove_through(self.index.last_seq_before_time(now - max_age))
        if acc is not None:
            acc.remove("max_age", ranges)
        else:
            self._record_removals({"max_age": ranges}, now)

    def _remove(self, seqs: np.ndarray) -> list[tuple[int, int]]:
        """Removes live messages (sorted, unique); returns them as ranges for the tombstones."""
        if not len(seqs):
            return []
        self.index.remove_many(seqs)
        for consumer in self.consumers.values():
            consumer.drop_removed(seqs)
        return seq_ranges(seqs)

    def _remove_through(self, last: int) -> tuple[int, list[tuple[int, int]]]:
        """Removes every live message up to `last` (expiry, limits, purges): settled block by block by
        the index, without listing the sequences. Returns how many went, and the range to record."""
        first = self.index.first_seq
        if last < first:
            return 0, []
        removed = self.index.remove_range(first, last)
        if not removed:
            return 0, []
        for consumer in self.consumers.values():
            consumer.drop_removed_range(first, last)
        return removed, [(first, last)]

    def _append(self, acc: _Accepted, now: int) -> None:
        acc.close()
        self._store_append(acc.groups, self._removals(acc.removed, now))

    def _removals(self, removed: dict[str, list[tuple[int, int]]], now: int, erase: bool = False) -> list[Removal]:
        return [
            Removal(merge_ranges(ranges), reason, erase, self.index.last_seq, now)
            for reason, ranges in removed.items()
            if ranges
        ]

    def _record_removals(self, removed: dict[str, list[tuple[int, int]]], now: int, erase: bool = False) -> None:
        removals = self._removals(removed, now, erase)
        if removals:
            self._store_append([], removals)

    def _remember_msg_id(self, msg_id: str, seq: int, ts: int) -> None:
        self._msg_ids[msg_id] = (seq, ts)
        self._msg_id_order.append((ts, msg_id))

    def dedup_window(self) -> tuple[list[tuple[str, int, int]], str | None]:
        """The duplicate window's (msg_id, seq, ts) in sequence order and the last msg id: what an index
        snapshot keeps so that a restart finds them without reading the table."""
        ids = sorted(((msg_id, seq, ts) for msg_id, (seq, ts) in self._msg_ids.items()), key=lambda e: e[1])
        return ids, self.last_msg_id

    def _expire_msg_ids(self, now: int) -> None:
        cutoff = now - self.config.duplicate_window
        order = self._msg_id_order
        while order and order[0][0] < cutoff:
            ts, msg_id = order.popleft()
            seen = self._msg_ids.get(msg_id)
            if seen is not None and seen[1] == ts:
                del self._msg_ids[msg_id]

    # -- config -------------------------------------------------------------------------------

    def apply_config(self, config: StreamConfig) -> None:
        """An update: lower limits take effect at once, as in JetStream."""
        with self.lock:
            self.config = config
            if self.failure is not None:
                return  # the lower limits apply after the stream is writable again, at its next publish
            acc = _Accepted()
            now = self.clock.now_ns()
            self._expire(now, acc)
            self._enforce_limits(None, acc)
            self._record_removals(acc.removed, now)
            if self.config.duplicate_window:
                self._expire_msg_ids(now)

    # -- reads --------------------------------------------------------------------------------

    def tick(self) -> None:
        with self.lock:
            self._expire(self.clock.now_ns())

    def expire_now(self) -> None:
        """`max_age` before a read (the caller holds the lock)."""
        self._expire(self.clock.now_ns())

    def remove_seqs(self, seqs: np.ndarray, reason: str) -> int:
        """Removes live messages for a retention policy (interest, workqueue); recorded as tombstones."""
        with self.lock:
            seqs = seqs[self.index.live_mask(seqs)] if len(seqs) else seqs
            if not len(seqs):
                return 0
            self._check_writable()
            self._record_removals({reason: self._remove(seqs)}, self.clock.now_ns())
            return len(seqs)

    def erase_seqs(self, seqs: np.ndarray) -> int:
        """GDPR erasure: the live messages among `seqs` leave every read at once, recorded as tombstones
        with reason "erase" and erase=True for the erase job. Not refused by `sealed` or `deny_delete`."""
        with self.lock:
            seqs = np.unique(np.asarray(seqs, np.int64))
            seqs = seqs[self.index.live_mask(seqs)] if len(seqs) else seqs
            if not len(seqs):
                return 0
            self._check_writable()
            self._record_removals({"erase": self._remove(seqs)}, self.clock.now_ns(), erase=True)
            self.index.forget_dead_subjects()  # an erased subject's name leaves memory, and the snapshot
            self.store.drop_snapshot()
            return len(seqs)

    def forget_erased(self, seqs: np.ndarray) -> None:
        """GDPR erasure, in memory: the erased messages' ids leave the duplicate window (a re-publish
        of an erased message is a new message) and the store drops its in-memory copies. The caller
        holds the lock; `seqs` may include messages removed earlier (purged, deleted, limits)."""
        erased = {int(s) for s in seqs}
        for msg_id in [m for m, (seq, _) in self._msg_ids.items() if seq in erased]:
            del self._msg_ids[msg_id]
        if self.index.last_seq in erased:
            self.last_msg_id = None
        self.store.forget(np.asarray(sorted(erased), np.int64))

    def get(self, seq: int) -> StoredMessage:
        if seq <= 0:
            raise errors.bad_request("a message sequence must be a positive integer")
        with self.lock:
            self._expire(self.clock.now_ns())
            msg = self.store.load(seq, self.index) if seq > 0 else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def last_by_subject(self, subject: str) -> StoredMessage:
        _check_filter(subject)
        with self.lock:
            self._expire(self.clock.now_ns())
            seq = self.index.last_seq_for(subject)
            literal = "*" not in subject and ">" not in subject
            msg = self.store.load(seq, self.index, subject if literal else None) if seq else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def next_by_subject(self, subject: str, start: int) -> StoredMessage:
        _check_filter(subject)
        with self.lock:
            self._expire(self.clock.now_ns())
            seq = self.index.next_seq_for(subject, max(start, 1))
            msg = self.store.load(seq, self.index) if seq else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def at_or_after_time(self, ts: int, subject: str | None = None) -> StoredMessage:
        """The first message published at or after `ts` (on `subject` when given): MSG.GET's `start_time`."""
        if subject is not None:
            _check_filter(subject)
        with self.lock:
            self._expire(self.clock.now_ns())
            seq = self.index.seq_at_or_after_time(ts)
            if seq and subject is not None:
                seq = self.index.next_seq_for(subject, seq)
            msg = self.store.load(seq, self.index) if seq else None
        if msg is None:
            raise errors.NoMessageFoundError()
        return msg

    def load_many(self, seqs: list[int] | np.ndarray) -> list[StoredMessage]:
        """The live messages among `seqs`, in the order given (removed ones are left out)."""
        wanted = [int(s) for s in seqs]
        with self.lock:
            found = self.store.load_many(sorted(wanted), self.index)
        return [found[s] for s in wanted if s in found]

    def last_seqs(self, filter_: str) -> np.ndarray:
        """The last live sequence per subject matching `filter_`, ascending, after `max_age`."""
        _check_filter(filter_)
        with self.lock:
            self._expire(self.clock.now_ns())
            return self.index.last_seqs(filter_)

    def live_seqs(self, filter_: str | None = None, start: int = 0) -> np.ndarray:
        """Live sequences ≥ `start` on `filter_`, ascending, after `max_age`."""
        if filter_ is not None:
            _check_filter(filter_)
        with self.lock:
            self._expire(self.clock.now_ns())
            return self.index.live_seqs(filter_, start=start)

    def state(self, subjects_filter: str | None = None, offset: int = 0) -> dict[str, Any]:
        """JetStream's StreamState; with `subjects_filter`, a page of the matching subjects' counts
        (sorted by name, from `offset`, at most SUBJECTS_PAGE) and `subjects_total`, as nats-server's
        STREAM.INFO pages them."""
        with self.lock:
            self._expire(self.clock.now_ns())
            ix = self.index
            state: dict[str, Any] = {
                "messages": ix.msgs,
                "bytes": ix.bytes,
                "first_seq": ix.first_seq,
                "first_ts": ix.first_ts,
                "last_seq": ix.last_seq,
                "last_ts": ix.last_ts,
                "num_subjects": ix.num_subjects,
                "num_deleted": ix.num_deleted,
                "consumer_count": self.consumer_count,
            }
            if subjects_filter:
                subjects, total = ix.subjects_page(subjects_filter, offset, SUBJECTS_PAGE)
                state["subjects_total"] = total
                if subjects:
                    state["subjects"] = subjects
            return state

    # -- removal ------------------------------------------------------------------------------

    def delete_message(self, seq: int, erase: bool) -> None:
        with self.lock:
            if self.config.sealed:
                raise errors.sealed()
            if self.config.deny_delete:
                raise errors.msg_delete_failed("message delete not permitted")
            self._expire(self.clock.now_ns())
            if seq <= 0:
                raise errors.msg_delete_failed("no message found")  # nats-server's answer to a delete of 0
            if seq > self.index.last_seq:
                raise errors.msg_delete_failed("stream store EOF")
            if not self.index.is_live(seq):
                raise errors.sequence_not_found(seq)
            self._check_writable()
            self._record_removals({"erase" if erase else "delete": self._remove(np.array([seq], np.int64))},
                                  self.clock.now_ns(), erase)

    def purge(self, filter_: str | None = None, seq: int = 0, keep: int = 0) -> int:
        """JetStream's PurgeEx: all, by filter (wildcards), keeping the newest `keep`, or below `seq`."""
        if seq < 0 or keep < 0:
            raise errors.bad_request("purge sequence and keep must not be negative")
        if seq and keep:
            raise errors.bad_request("purge sequence and keep are mutually exclusive")
        if filter_:
            _check_filter(filter_)
        with self.lock:
            if self.config.sealed:
                raise errors.sealed()
            if self.config.deny_purge:
                raise errors.purge_failed("stream purge not permitted")
            self._check_writable()
            now = self.clock.now_ns()
            self._expire(now)
            ix = self.index
            last_before = ix.last_seq
            if not filter_ or filter_ == FWC:
                if seq == 1:
                    return 0
                if seq > 1:
                    purged, ranges = self._remove_through(seq - 1)
                    if seq > ix.last_seq + 1:
                        ix.skip_to(seq)
                elif keep > 0:
                    if keep >= ix.msgs:
                        return 0
                    purged, ranges = self._remove_through(ix.last_seq - keep)
                else:
                    purged, ranges = self._remove_through(ix.last_seq)
            else:
                seqs = ix.live_seqs(filter_, stop=seq if seq > 1 else None)
                if keep > 0:
                    seqs = seqs[: max(len(seqs) - keep, 0)]
                purged, ranges = len(seqs), self._remove(seqs)
            if purged or ix.last_seq != last_before:
                self._record_removals({"purge": ranges} if purged else {}, now)
                if not purged:
                    self._store_append([], [Removal([], "purge", False, ix.last_seq, now)])
            return purged


def _parse_seq(value: str) -> int:
    """An expected sequence from a header; -1, which no sequence equals, when it is not a decimal number:
    nats-server's parseInt64 gives -1 too, so such a publish is refused as a wrong last sequence (10071)."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else -1


def _check_filter(subject: str) -> None:
    if not is_valid_subject(subject):
        raise errors.bad_request(f"invalid subject filter {subject!r}")
