"""The per-stream index of live messages: what a read, a limit or a purge needs, without the payloads.

Columnar arrays indexed by `seq - base` hold each message's subject id, size, timestamp and
liveness, and links to the previous and next message on the same subject, so a per-subject limit
finds a subject's next oldest message in O(1) and nothing scans the stream's data. Per subject it
keeps JetStream's `SimpleState` (msgs, first, last). About 40 bytes a message: 5M messages fit in
200 MB. Counterpart: the `fss`/`psim` subject trees of server/memstore.go and filestore.go.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from engine.subjects import is_literal, subject_matches

_MIN_CAPACITY = 1024
_FEW = 8


class MessageIndex:
    """Live sequences of one stream with JetStream's stream state (first/last seq and time, counts)."""

    def __init__(self) -> None:
        self.base = 1
        self._n = 0
        self._alloc(_MIN_CAPACITY)
        self.subjects: list[str] = []
        self._subject_ids: dict[str, int] = {}
        # subject id -> [msgs, first_seq, last_seq]
        self._per_subject: dict[int, list[int]] = {}
        self.num_subjects = 0
        self.first_seq = 0
        self.last_seq = 0
        self.first_ts = 0
        self.last_ts = 0
        self.msgs = 0
        self.bytes = 0

    def _alloc(self, capacity: int) -> None:
        self._sid = np.zeros(capacity, np.int32)
        self._size = np.zeros(capacity, np.int64)
        self._ts = np.zeros(capacity, np.int64)
        self._live = np.zeros(capacity, np.bool_)
        self._next = np.zeros(capacity, np.int64)
        self._prev = np.zeros(capacity, np.int64)

    def _grow(self, needed: int) -> None:
        capacity = len(self._sid)
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity * 2)
        old = (self._sid, self._size, self._ts, self._live, self._next, self._prev)
        self._alloc(new_capacity)
        for dst, src in zip((self._sid, self._size, self._ts, self._live, self._next, self._prev), old, strict=True):
            dst[: self._n] = src[: self._n]

    # -- writes -------------------------------------------------------------------------------

    def subject_id(self, subject: str) -> int:
        sid = self._subject_ids.get(subject)
        if sid is None:
            sid = len(self.subjects)
            self.subjects.append(subject)
            self._subject_ids[subject] = sid
        return sid

    def skip_to(self, next_seq: int) -> None:
        """Moves the next sequence to `next_seq` (purge past the end, `first_seq`); the gap holds no message."""
        if next_seq <= self.last_seq + 1:
            return
        if self.msgs == 0:
            self.base = next_seq
            self._n = 0
            self.first_seq = next_seq
            self.first_ts = 0
        else:
            self._grow(next_seq - self.base)
            self._live[self._n : next_seq - self.base] = False
            self._n = next_seq - self.base
        self.last_seq = next_seq - 1

    def append(self, seq: int, subject: str, size: int, ts: int) -> None:
        if seq <= self.last_seq:
            raise ValueError(f"sequence {seq} is not after the last sequence {self.last_seq}")
        if self.msgs == 0 and self._n == 0:
            self.base = seq
        elif seq > self.last_seq + 1:
            self.skip_to(seq)
        slot = seq - self.base
        self._grow(slot + 1)
        sid = self.subject_id(subject)
        self._sid[slot] = sid
        self._size[slot] = size
        self._ts[slot] = ts
        self._live[slot] = True
        self._next[slot] = 0
        state = self._per_subject.get(sid)
        if state is None or state[0] == 0:
            self._per_subject[sid] = [1, seq, seq]
            self._prev[slot] = 0
            self.num_subjects += 1
        else:
            last = state[2]
            self._next[last - self.base] = seq
            self._prev[slot] = last
            state[0] += 1
            state[2] = seq
        self._n = slot + 1
        self.msgs += 1
        self.bytes += size
        self.last_seq = seq
        self.last_ts = ts
        if self.msgs == 1:
            self.first_seq = seq
            self.first_ts = ts

    def append_run(self, first_seq: int, subjects: list[str], sizes: list[int] | np.ndarray, ts: int) -> None:
        """Appends consecutive sequences from `first_seq`, all stamped `ts`: `append` without the per-message numpy cost."""
        count = len(subjects)
        if count == 0:
            return
        if first_seq <= self.last_seq:
            raise ValueError(f"sequence {first_seq} is not after the last sequence {self.last_seq}")
        if self.msgs == 0 and self._n == 0:
            self.base = first_seq
        elif first_seq > self.last_seq + 1:
            self.skip_to(first_seq)
        lo = first_seq - self.base
        hi = lo + count
        self._grow(hi)
        if subjects.count(subjects[0]) == count:
            self._link_one_subject(first_seq, lo, hi, self.subject_id(subjects[0]))
        else:
            self._link_subjects(first_seq, lo, hi, subjects)
        self._size[lo:hi] = sizes
        self._ts[lo:hi] = ts
        self._live[lo:hi] = True
        self._n = hi
        self.msgs += count
        self.bytes += int(np.sum(sizes)) if isinstance(sizes, np.ndarray) else sum(sizes)
        if self.msgs == count:
            self.first_seq = first_seq
            self.first_ts = ts
        self.last_seq = first_seq + count - 1
        self.last_ts = ts

    def _link_one_subject(self, first_seq: int, lo: int, hi: int, sid: int) -> None:
        """A run on one subject (a producer's batch): its chain links are two aranges, no loop."""
        count = hi - lo
        last_seq = first_seq + count - 1
        state = self._per_subject.get(sid)
        if state is None or state[0] == 0:
            self._per_subject[sid] = [count, first_seq, last_seq]
            self.num_subjects += 1
            before = 0
        else:
            before = state[2]
            self._next[before - self.base] = first_seq
            state[0] += count
            state[2] = last_seq
        self._sid[lo:hi] = sid
        self._prev[lo] = before
        self._prev[lo + 1 : hi] = np.arange(first_seq, last_seq, dtype=np.int64)
        self._next[lo : hi - 1] = np.arange(first_seq + 1, last_seq + 1, dtype=np.int64)
        self._next[hi - 1] = 0

    def _link_subjects(self, first_seq: int, lo: int, hi: int, subjects: list[str]) -> None:
        count = hi - lo
        ids = self._subject_ids
        sids = [ids[s] if s in ids else self.subject_id(s) for s in subjects]
        prev = [0] * count
        link_from: list[int] = []
        link_to: list[int] = []
        per_subject = self._per_subject
        seq = first_seq
        for i, sid in enumerate(sids):
            state = per_subject.get(sid)
            if state is None or state[0] == 0:
                per_subject[sid] = [1, seq, seq]
                self.num_subjects += 1
            else:
                last = state[2]
                prev[i] = last
                if last >= first_seq:
                    link_from.append(last - first_seq)
                    link_to.append(seq)
                else:
                    self._next[last - self.base] = seq
                state[0] += 1
                state[2] = seq
            seq += 1
        self._sid[lo:hi] = sids
        self._next[lo:hi] = 0
        if link_from:
            self._next[lo + np.array(link_from, np.int64)] = link_to
        self._prev[lo:hi] = prev

    def remove(self, seq: int) -> bool:
        """Removes one live message; False if it is not live."""
        if not self.is_live(seq):
            return False
        self.remove_many(np.array([seq], np.int64))
        return True

    def remove_many(self, seqs: np.ndarray) -> int:
        """Removes the live messages among `seqs` (sorted, unique); returns how many were live."""
        if len(seqs) == 0:
            return 0
        if len(seqs) <= _FEW:
            return self._remove_few(seqs.tolist())
        seqs = seqs[(seqs >= self.base) & (seqs <= self.last_seq)]
        slots = seqs - self.base
        slots = slots[self._live[slots]]
        if len(slots) == 0:
            return 0
        self._live[slots] = False
        self.msgs -= len(slots)
        self.bytes -= int(self._size[slots].sum())
        sids, counts = np.unique(self._sid[slots], return_counts=True)
        for sid, count in zip(sids.tolist(), counts.tolist(), strict=True):
            state = self._per_subject[sid]
            state[0] -= count
            if state[0] == 0:
                state[1] = state[2] = 0
                self.num_subjects -= 1
                continue
            if not self._live[state[1] - self.base]:
                state[1] = self._walk(state[1], self._next)
            if not self._live[state[2] - self.base]:
                state[2] = self._walk(state[2], self._prev)
        self._fix_first()
        return len(slots)

    def _remove_few(self, seqs: list[int]) -> int:
        """`remove_many` for a handful of sequences (a KV update drops one): plain Python beats numpy's setup."""
        removed = 0
        for seq in seqs:
            slot = seq - self.base
            if not (0 <= slot < self._n and self._live[slot]):
                continue
            self._live[slot] = False
            removed += 1
            self.msgs -= 1
            self.bytes -= int(self._size[slot])
            state = self._per_subject[int(self._sid[slot])]
            state[0] -= 1
            if state[0] == 0:
                state[1] = state[2] = 0
                self.num_subjects -= 1
                continue
            if state[1] == seq:
                state[1] = self._walk(seq, self._next)
            if state[2] == seq:
                state[2] = self._walk(seq, self._prev)
        if removed:
            self._fix_first()
        return removed

    def _walk(self, seq: int, links: np.ndarray) -> int:
        base, live = self.base, self._live
        while True:
            seq = int(links[seq - base])
            if seq < base:
                raise AssertionError("subject chain broken")
            if live[seq - base]:
                return seq

    def _fix_first(self) -> None:
        if self.msgs == 0:
            self.first_seq = self.last_seq + 1
            self.first_ts = 0
            self.base = self.first_seq
            self._n = 0
            return
        slot = self.first_seq - self.base
        if slot >= 0 and self._live[slot]:
            return
        start = max(slot, 0)
        near = self._live[start : start + 64]  # the next live message is usually close: skip the long scan
        slot = start + int(np.argmax(near)) if near.any() else start + int(np.argmax(self._live[start : self._n]))
        self.first_seq = self.base + slot
        self.first_ts = int(self._ts[slot])
        self._maybe_rebase()

    def _maybe_rebase(self) -> None:
        drop = self.first_seq - self.base
        if drop < 65536 or drop < self._n // 2:
            return
        keep = self._n - drop
        for arr in (self._sid, self._size, self._ts, self._live, self._next, self._prev):
            arr[:keep] = arr[drop : self._n]
        self.base = self.first_seq
        self._n = keep

    # -- reads --------------------------------------------------------------------------------

    def is_live(self, seq: int) -> bool:
        slot = seq - self.base
        return 0 <= slot < self._n and bool(self._live[slot])

    def subject_of(self, seq: int) -> str:
        return self.subjects[int(self._sid[seq - self.base])]

    def subjects_among(self, seqs: np.ndarray) -> list[str]:
        """The distinct subjects of live `seqs`, vectorised (a read window's partitions)."""
        if not len(seqs):
            return []
        return [self.subjects[int(sid)] for sid in np.unique(self._sid[seqs - self.base])]

    def ts_of(self, seq: int) -> int:
        return int(self._ts[seq - self.base])

    def size_of(self, seq: int) -> int:
        return int(self._size[seq - self.base])

    def subject_state(self, subject: str) -> tuple[int, int, int]:
        """(msgs, first_seq, last_seq) of a literal subject; zeros if it has none."""
        sid = self._subject_ids.get(subject)
        if sid is None:
            return 0, 0, 0
        msgs, first, last = self._per_subject.get(sid, (0, 0, 0))
        return msgs, first, last

    def matching_subject_ids(self, filter_: str) -> list[int]:
        if is_literal(filter_):
            sid = self._subject_ids.get(filter_)
            return [sid] if sid is not None and self._per_subject.get(sid, (0,))[0] else []
        return [sid for sid, st in self._per_subject.items() if st[0] and subject_matches(filter_, self.subjects[sid])]

    def subjects_state(self, filter_: str) -> dict[str, int]:
        return {self.subjects[sid]: self._per_subject[sid][0] for sid in self.matching_subject_ids(filter_)}

    def live_seqs(
        self, filter_: str | list[str] | None = None, start: int = 0, stop: int | None = None
    ) -> np.ndarray:
        """Sorted live sequences in [start, stop) whose subject matches `filter_` (one or several; all when None)."""
        mask, lo = self._live_mask_range(filter_, start, stop)
        return np.flatnonzero(mask).astype(np.int64) + lo + self.base

    def count_live(self, filter_: str | list[str] | None = None, start: int = 0) -> int:
        mask, _ = self._live_mask_range(filter_, start, None)
        return int(np.count_nonzero(mask))

    def _live_mask_range(self, filter_: str | list[str] | None, start: int, stop: int | None) -> tuple[np.ndarray, int]:
        lo = max(start, self.first_seq, self.base) - self.base
        hi = self._n if stop is None else min(stop - self.base, self._n)
        if hi <= lo or self.msgs == 0:
            return np.zeros(0, np.bool_), 0
        filters = [filter_] if isinstance(filter_, str) else (filter_ or [])
        if not filters or ">" in filters:
            return self._live[lo:hi], lo
        sids = sorted({sid for f in filters for sid in self.matching_subject_ids(f)})
        if not sids:
            return np.zeros(0, np.bool_), 0
        return self._live[lo:hi] & np.isin(self._sid[lo:hi], np.array(sids, np.int32)), lo

    def last_seq_for(self, filter_: str) -> int:
        sids = self.matching_subject_ids(filter_)
        return max((self._per_subject[sid][2] for sid in sids), default=0)

    def last_seqs(self, filter_: str) -> np.ndarray:
        """The last live sequence of every subject matching `filter_`, ascending: JetStream's last-per-subject."""
        seqs = [self._per_subject[sid][2] for sid in self.matching_subject_ids(filter_)]
        return np.sort(np.array(seqs, np.int64))

    def next_seq_for(self, filter_: str, start: int) -> int:
        """First live sequence ≥ start on `filter_`; 0 if none."""
        sids = self.matching_subject_ids(filter_)
        if not sids:
            return 0
        firsts = [self._per_subject[sid][1] for sid in sids]
        if min(firsts) >= start:
            return min(firsts)
        lo = max(start, self.first_seq) - self.base
        if lo >= self._n:
            return 0
        sid_arr = self._sid[lo : self._n]
        mask = self._live[lo : self._n] & (sid_arr == sids[0] if len(sids) == 1 else np.isin(sid_arr, sids))
        hit = int(np.argmax(mask))
        return self.base + lo + hit if mask[hit] else 0

    def oldest_seqs(self, subject: str, count: int) -> np.ndarray:
        """The `count` oldest live sequences of a literal subject, along its chain: O(count), not O(stream)."""
        sid = self._subject_ids.get(subject)
        state = self._per_subject.get(sid) if sid is not None else None
        if state is None or state[0] == 0 or count <= 0:
            return np.zeros(0, np.int64)
        out = [state[1]]
        while len(out) < min(count, state[0]):
            out.append(self._walk(out[-1], self._next))
        return np.array(out, np.int64)

    def oldest_in_subject(self, subject: str) -> int:
        return self.subject_state(subject)[1]

    def seq_at_or_after_time(self, ts: int) -> int:
        """First live sequence published at or after `ts` (timestamps never go back)."""
        lo = max(self.first_seq - self.base, 0)
        slot = lo + int(np.searchsorted(self._ts[lo : self._n], ts, side="left"))
        while slot < self._n and not self._live[slot]:
            slot += 1
        return self.base + slot if slot < self._n else 0

    def seqs_before_time(self, ts: int) -> np.ndarray:
        lo = max(self.first_seq - self.base, 0)
        hi = lo + int(np.searchsorted(self._ts[lo : self._n], ts, side="left"))
        return self.live_seqs(start=self.base + lo, stop=self.base + hi)

    def iter_subject_states(self) -> Iterator[tuple[str, int, int, int]]:
        for sid, (msgs, first, last) in self._per_subject.items():
            if msgs:
                yield self.subjects[sid], msgs, first, last

    def live_mask(self, seqs: np.ndarray) -> np.ndarray:
        """Which of `seqs` are live, vectorised."""
        slots = seqs - self.base
        inside = (slots >= 0) & (slots < self._n)
        out = np.zeros(len(seqs), np.bool_)
        out[inside] = self._live[slots[inside]]
        return out

    def sizes_of(self, seqs: np.ndarray) -> np.ndarray:
        return self._size[seqs - self.base]

    @property
    def num_deleted(self) -> int:
        if self.msgs == 0 or self.first_seq == 0:
            return 0
        return self.last_seq - self.first_seq + 1 - self.msgs


def seq_ranges(seqs: Iterable[int] | np.ndarray) -> list[tuple[int, int]]:
    """Collapses sorted sequences into inclusive ranges."""
    if not isinstance(seqs, np.ndarray):
        seqs = list(seqs)
    if len(seqs) <= _FEW:
        return _few_ranges([int(s) for s in seqs])
    arr = np.asarray(seqs, dtype=np.int64)
    breaks = np.flatnonzero(np.diff(arr) != 1)
    starts = np.concatenate(([arr[0]], arr[breaks + 1]))
    ends = np.concatenate((arr[breaks], [arr[-1]]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _few_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and ranges[-1][1] + 1 == seq:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges
