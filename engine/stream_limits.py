"""A stream's limits: discard old past `max_msgs`, `max_bytes` and `max_msgs_per_subject`, and
`max_age`; with the removal primitives every removal of the stream goes through (the index, the
consumers' pending messages, the tombstones). Counterpart: the limit handling of server/memstore.go.

The bottom layer of engine/stream.py's `Stream`: the layers above (the publish path, the reads, the
removals asked for) call these on the one object, so a publish past a limit costs no extra hop."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from engine.accepted import Accepted
from engine.config import StreamConfig
from engine.index import MessageIndex
from engine.seq_ranges import merge_ranges, seq_ranges
from engine.store.base import Removal
from engine.store.rows import RowGroup

if TYPE_CHECKING:
    from engine.consumer import Consumer


class StreamLimits:
    """Applies the limits under the stream's lock, which its caller holds."""

    config: StreamConfig
    index: MessageIndex
    consumers: dict[str, Consumer]
    failure: str | None  # set: writes are refused, so no removal can be logged

    def _enforce_limits(self, subject: str | None, acc: Accepted) -> None:
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

    def _enforce_subject_limits(self, subjects: list[str], acc: Accepted) -> None:
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

    def _expire(self, now: int, acc: Accepted | None = None) -> None:
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

    # -- the hook: the stream's one write to the store (engine/stream.py) ----------------------

    def _store_append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        raise NotImplementedError
