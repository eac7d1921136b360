"""A group commit's publish path: messages without headers skip JetStream's per-message checks when
only their size could refuse them (`_plain_path_allowed`, `_fits_whole`) and are stored as one run,
with the same outcome as one by one; the rest go through the checks (engine/publish_checks.py).

A layer of engine/stream.py's `Stream`, whose `process` holds the lock and hands the store one
append for the whole group commit. This is the benchmarks' hot path (a lone message takes
`_process_group` then `_store_lone`), so it stays plain method calls on the one object."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine import errors
from engine.accepted import Accepted
from engine.messages import (
    STORE_OVERHEAD,
    AckRun,
    InboundMessage,
    PlainBatch,
    PubAck,
    PublishAnswer,
    PublishRequest,
    PublishResult,
)
from engine.publish_checks import PublishChecks
from engine.store.rows import plain_rows


class Publisher(PublishChecks):
    """Stores the groups of a group commit under the stream's lock, which its caller holds."""

    def _process_group(self, group: PublishRequest, plain: bool, now: int, acc: Accepted) -> PublishAnswer:
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

    def _plain_path_allowed(self) -> bool:
        """Whether messages without headers can skip the per-message checks: only size can refuse them."""
        c = self.config
        return self.quota is None and not c.sealed and c.retention != "interest" and (c.discard == "old" or (c.max_msgs < 0 and c.max_bytes < 0 and not c.discard_new_per_subject))

    def _store_plain(self, group: list[InboundMessage], now: int, acc: Accepted) -> list[PublishResult]:
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

    def _store_lone(self, msg: InboundMessage, now: int, acc: Accepted) -> PublishResult:
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

    def _store_columns(self, batch: PlainBatch, now: int, acc: Accepted) -> PublishAnswer:
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
