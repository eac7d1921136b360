"""The subjects of one stream: interned ids and JetStream's per-subject state, in compact arrays.

A stream of a million distinct subjects (`orders.<id>`, `$KV.<bucket>.<key>`) must not cost a Python
object per subject: a dict of a million strings is ~140 MB here, more than nats-server's whole
process for the same stream. Names live in one byte arena (an offset per subject), the name -> id map
is an open-addressing table of ids (int32, at most half full) probed by each id's hash (the low 32 bits
of its xxh3, kept per id, verified against the arena on a hit; the offsets are uint32 while the arena
holds under 4 GiB of names), and each subject's `SimpleState` (msgs, first,
last) is three columns indexed by id, int32 while the stream's sequences fit in 31 bits (a stream of
fewer than 2.1 billion messages: `fit` widens them to int64 before a larger sequence is written; a
subject never has more messages than the stream's last sequence): about 36 bytes a subject plus its
name. A small dict in front keeps the ids of recently used subjects, so a stream of
a few hot subjects pays one dict lookup per message. Ids are never reused: a subject whose last
message goes keeps its id (and state zeros), as nats-server's subject tree keeps a node until
compaction. Counterpart: the `fss`/`psim` subject trees of server/memstore.go and filestore.go.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from engine.subjects import FWC, filter_regex, is_literal

_EMPTY = -1  # a slot never used
_GONE = -2  # a forgotten subject's slot: lookups probe past it
_EMPTY_HASH, _GONE_HASH = np.uint64(0), np.uint64(1)  # the same two in an index snapshot's `subject_slots`
_HASH_BITS = 0xFFFFFFFF  # a slot position never needs more: 2**32 slots would be 16 GiB of table
_NARROW_OFFSET_MAX = np.iinfo(np.uint32).max  # the largest arena offset the uint32 offsets hold
_FRONT = 16384  # ids of recently used subjects kept in a plain dict (~120 B each)
_MIN_SLOTS = 64
_NARROW_MAX = np.iinfo(np.int32).max  # the largest sequence the int32 state columns hold


def _hash(name: bytes) -> int:
    """A 32-bit hash above 1 (0 marks an empty slot, 1 a forgotten one)."""
    h = xxhash.xxh3_64_intdigest(name) & _HASH_BITS
    return h if h > 1 else h + 2


class SubjectTable:
    """Subject ids and per-subject (msgs, first_seq, last_seq)."""

    def __init__(self) -> None:
        self._slot_ids = np.full(_MIN_SLOTS, _EMPTY, np.int32)  # id per slot, or _EMPTY / _GONE
        self._hashes = np.zeros(0, np.uint32)  # hash of id i (slots hold ids only: 4 bytes a slot, not 8)
        self._arena = bytearray()
        self._offsets = np.zeros(1, np.uint32)  # name of id i = arena[offsets[i]:offsets[i+1]]; int64 past 4 GiB
        self.msgs = np.zeros(0, np.int32)  # int32 until `fit` sees a sequence past _NARROW_MAX
        self.first = np.zeros(0, np.int32)
        self.last = np.zeros(0, np.int32)
        self.count = 0  # subjects ever seen
        self.live = 0  # subjects with messages
        self.forgotten = 0  # ids whose names were forgotten (their arena bytes are zeros)
        self._occupied = 0  # slots not empty (live or forgotten)
        self._front: dict[str, int] = {}

    # -- ids ----------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.count

    def find(self, subject: str) -> int:
        """The id of `subject`, or -1 if the stream never had it."""
        sid = self._front.get(subject)
        if sid is not None:
            return sid
        raw = subject.encode()
        h = _hash(raw)
        mask = len(self._slot_ids) - 1
        slot = h & mask
        while True:
            sid = int(self._slot_ids[slot])
            if sid == _EMPTY:
                return -1
            if sid >= 0 and int(self._hashes[sid]) == h and self.name_bytes(sid) == raw:
                self._remember(subject, sid)
                return sid
            slot = (slot + 1) & mask

    def id(self, subject: str) -> int:
        """The id of `subject`, interned on first sight."""
        sid = self._front.get(subject)
        if sid is not None:
            return sid
        sid = self.find(subject)
        return sid if sid >= 0 else self._add(subject)

    def ids(self, subjects: list[str]) -> np.ndarray:
        """Ids of many subjects (interning new ones): each distinct subject is looked up once, and the
        ones the front dict misses are probed and added as arrays, not one by one."""
        front = self._front
        if len(subjects) <= 16:
            return np.fromiter((front[s] if s in front else self.id(s) for s in subjects), np.int32, len(subjects))
        known: dict[str, int] = {}
        misses: list[str] = []
        for s in dict.fromkeys(subjects):
            sid = front.get(s)
            if sid is None:
                misses.append(s)
            else:
                known[s] = sid
        if misses:  # the lookup may clear the front dict (it is bounded): ids are taken from `known` only
            known.update(zip(misses, self._lookup_many(misses).tolist(), strict=True))
        return np.fromiter((known[s] for s in subjects), np.int32, len(subjects))

    def _lookup_many(self, subjects: list[str]) -> np.ndarray:
        raws = [s.encode() for s in subjects]
        hashes = np.fromiter(map(_hash, raws), np.uint32, len(raws))
        sids = self._probe(hashes)
        for i in np.flatnonzero(sids >= 0).tolist():  # a hash hit: confirm the name
            if self.name_bytes(int(sids[i])) != raws[i]:
                sids[i] = self.id(subjects[i])
        new = np.flatnonzero(sids < 0)
        if len(new):
            sids[new] = self._add_many([raws[i] for i in new.tolist()], hashes[new])
        if len(subjects) <= _FRONT:  # one bulk update: per-name calls cost ~2 µs each
            if len(self._front) + len(subjects) > _FRONT:
                self._front.clear()
            self._front.update(zip(subjects, sids.tolist(), strict=True))
        return sids

    def _probe(self, hashes: np.ndarray) -> np.ndarray:
        """Ids of the hashes in the table (-1 where absent), vectorised linear probing."""
        mask = np.uint64(len(self._slot_ids) - 1)
        out = np.full(len(hashes), -1, np.int64)
        if not self.count:
            return out
        position = hashes & mask
        pending = np.arange(len(hashes))
        while len(pending):
            ids = self._slot_ids[position[pending].astype(np.int64)]
            hit = (ids >= 0) & (self._hashes[np.maximum(ids, 0)] == hashes[pending])
            out[pending[hit]] = ids[hit]
            pending = pending[~hit & (ids != _EMPTY)]
            position[pending] = (position[pending] + np.uint64(1)) & mask
        return out

    def _add_many(self, raws: list[bytes], hashes: np.ndarray) -> np.ndarray:
        """Interns distinct new names at once: one arena append, one vectorised placement."""
        first, n = self.count, len(raws)
        self._reserve(first + n)
        self._hashes[first : first + n] = hashes
        size = len(self._slot_ids)
        while (self._occupied + n + 1) * 2 > size:
            size *= 2
        if size != len(self._slot_ids):
            self._rehash(size)
        sids = np.arange(first, first + n, dtype=np.int64)
        _place_many(self._slot_ids, hashes, sids.astype(np.int32))
        self._occupied += n
        base = len(self._arena)
        self._arena += b"".join(raws)
        self._fit_offsets(len(self._arena))
        self._offsets[first + 1 : first + n + 1] = base + np.cumsum(np.fromiter(map(len, raws), np.int64, n))
        self.count += n
        return sids

    def ids_of_array(self, subjects: object) -> np.ndarray:
        """`ids` of an Arrow string column: each distinct value decoded once (a detail read back)."""
        import pyarrow as pa  # noqa: PLC0415 - local: the common path takes lists

        encoded = pc.dictionary_encode(subjects)
        if isinstance(encoded, pa.ChunkedArray):
            encoded = encoded.combine_chunks()
        ids = self.ids(encoded.dictionary.to_pylist())
        return ids[encoded.indices.to_numpy(zero_copy_only=False)] if len(ids) else np.zeros(0, np.int32)

    def forget(self, sids: np.ndarray) -> int:
        """Forgets subjects that have no message left (after an erasure, or before a snapshot): their
        names leave the arena and the lookup table, so no erased subject outlives its messages in memory
        or in an index snapshot. A forgotten subject seen again gets a new id (a forgotten id is marked
        by `last == -1`). Returns how many went."""
        sids = np.asarray(sids, np.int64)
        gone = sids[(self.msgs[sids] == 0) & (self.last[sids] != -1)]
        if not len(gone):
            return 0
        used = np.flatnonzero(self._slot_ids >= 0)
        self._slot_ids[used[np.isin(self._slot_ids[used], gone)]] = _GONE
        for sid in gone.tolist():
            start, end = int(self._offsets[sid]), int(self._offsets[sid + 1])
            self._arena[start:end] = bytes(end - start)
        self.last[gone] = -1
        dead = set(gone.tolist())
        self._front = {k: v for k, v in self._front.items() if v not in dead}
        self.forgotten += len(gone)
        return len(gone)

    def name(self, sid: int) -> str:
        return self.name_bytes(sid).decode()

    def name_bytes(self, sid: int) -> bytes:
        return bytes(self._arena[int(self._offsets[sid]) : int(self._offsets[sid + 1])])

    def names(self, sids: Iterable[int]) -> list[str]:
        return [self.name(int(s)) for s in sids]

    def _remember(self, subject: str, sid: int) -> None:
        if len(self._front) >= _FRONT:
            self._front.clear()
        self._front[subject] = sid

    def _add(self, subject: str) -> int:
        """`_add_many` of one name in scalars (a KV put of a new key): numpy's vectorised placement
        costs tens of microseconds of set-up for one entry."""
        raw = subject.encode()
        h, sid = _hash(raw), self.count
        self._reserve(sid + 1)
        self._hashes[sid] = h
        if (self._occupied + 2) * 2 > len(self._slot_ids):
            self._rehash(2 * len(self._slot_ids))
        slot_ids = self._slot_ids
        mask = len(slot_ids) - 1
        position = h & mask
        while slot_ids[position] != _EMPTY:  # the first never-used slot of its probe sequence, as _place_many
            position = (position + 1) & mask
        slot_ids[position] = sid
        self._occupied += 1
        base = len(self._arena)
        self._arena += raw
        self._fit_offsets(base + len(raw))
        self._offsets[sid + 1] = base + len(raw)
        self.count += 1
        self._remember(subject, sid)
        return sid

    def _reserve(self, count: int) -> None:
        """Room in the per-id columns (offsets, state, hashes) for `count` subjects."""
        if count + 1 > len(self._offsets):
            self._offsets = _grown(self._offsets, count + 1)
        if count > len(self.msgs):  # grown apart from the offsets: their lengths differ by one, then more
            self.msgs, self.first, self.last, self._hashes = (
                _grown(a, count) for a in (self.msgs, self.first, self.last, self._hashes))

    def _fit_offsets(self, end: int) -> None:
        """Makes the offsets hold `end` (numpy's assignment would wrap it into uint32 silently)."""
        if end > _NARROW_OFFSET_MAX and self._offsets.dtype != np.int64:
            self._offsets = self._offsets.astype(np.int64)

    def _rehash(self, size: int) -> None:
        ids = self._slot_ids[self._slot_ids >= 0]
        self._slot_ids = np.full(size, _EMPTY, np.int32)
        _place_many(self._slot_ids, self._hashes[ids], ids)
        self._occupied = len(ids)

    # -- per-subject state --------------------------------------------------------------------

    def fit(self, seq: int) -> None:
        """Makes the state columns hold `seq` (called before a sequence is written): numpy's array
        assignment would wrap an int64 into int32 silently. `msgs` widens with them: a subject's count
        is at most the stream's last sequence."""
        if seq > _NARROW_MAX and self.last.dtype != np.int64:
            self.msgs, self.first, self.last = (a.astype(np.int64) for a in (self.msgs, self.first, self.last))

    def state(self, subject: str) -> tuple[int, int, int]:
        """(msgs, first_seq, last_seq) of a literal subject; zeros if it has none."""
        sid = self.find(subject)
        if sid < 0 or self.msgs[sid] == 0:
            return 0, 0, 0
        return int(self.msgs[sid]), int(self.first[sid]), int(self.last[sid])

    def matching(self, filter_: str | None) -> np.ndarray:
        """Ids of the subjects with messages that `filter_` matches (all when None or `>`), ascending."""
        if filter_ is None or filter_ == FWC:
            return np.flatnonzero(self.msgs[: self.count] > 0).astype(np.int32)
        if is_literal(filter_):
            sid = self.find(filter_)
            return np.array([sid], np.int32) if sid >= 0 and self.msgs[sid] > 0 else np.zeros(0, np.int32)
        mask = self.match_mask(filter_) & (self.msgs[: self.count] > 0)
        return np.flatnonzero(mask).astype(np.int32)

    def match_mask(self, filter_: str, upto: int = 0) -> np.ndarray:
        """Which ids in [upto, count) `filter_` matches, vectorised over the arena (no Python loop)."""
        start = int(self._offsets[upto])
        offsets = (self._offsets[upto : self.count + 1] - start).astype(np.int32)
        names = pa.StringArray.from_buffers(
            self.count - upto, pa.py_buffer(offsets), pa.py_buffer(bytes(self._arena[start:]))
        )
        return np.asarray(pc.match_substring_regex(names, filter_regex(filter_)).to_numpy(zero_copy_only=False), np.bool_)

    def iter_states(self, sids: np.ndarray | None = None) -> Iterator[tuple[str, int, int, int]]:
        """(subject, msgs, first, last) of the given ids (default: every subject with messages)."""
        for sid in (self.matching(None) if sids is None else sids).tolist():
            yield self.name(sid), int(self.msgs[sid]), int(self.first[sid]), int(self.last[sid])

    @property
    def nbytes(self) -> int:
        return int(self._slot_ids.nbytes + self._hashes.nbytes + len(self._arena) + self._offsets.nbytes
                   + 3 * self.msgs.nbytes) + 120 * len(self._front)

    # -- persistence --------------------------------------------------------------------------

    def to_arrays(self) -> dict[str, np.ndarray]:
        n = self.count
        return {
            "subject_offsets": self._offsets[: n + 1].astype(np.int64),  # the snapshot's layout stays int64
            "subject_arena": np.frombuffer(bytes(self._arena), np.uint8),
            "subject_msgs": self.msgs[:n].astype(np.int64),  # the snapshot's layout stays int64
            "subject_first": self.first[:n].astype(np.int64),
            "subject_last": self.last[:n].astype(np.int64),
            **self._snapshot_slots(),
            "subject_forgotten": np.array([self.forgotten], np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> SubjectTable:
        table = cls()
        offsets = arrays["subject_offsets"]
        n = len(offsets) - 1
        offsets = offsets.astype(np.uint32 if int(offsets[-1]) <= _NARROW_OFFSET_MAX else np.int64)
        table._arena = bytearray(arrays["subject_arena"].tobytes())
        table._offsets = offsets
        last = arrays["subject_last"]
        state = np.int32 if not len(last) or int(last.max()) <= _NARROW_MAX else np.int64
        table.msgs = arrays["subject_msgs"].astype(state)
        table.first = arrays["subject_first"].astype(state)
        table.last = last.astype(state)
        table.count = n
        table.live = int(np.count_nonzero(table.msgs > 0))
        table._load_slots(arrays["subject_slots"],
                          arrays["subject_slot_ids"].astype(np.int32, copy=False))
        table.forgotten = int(arrays["subject_forgotten"][0]) if "subject_forgotten" in arrays else 0
        return table

    def _snapshot_slots(self) -> dict[str, np.ndarray]:
        """The snapshot's layout of the lookup table (unchanged since it held hashes in its slots): a
        hash per slot (0 empty, 1 forgotten) and an id per slot. The hashes are 32-bit (the slots were
        uint64 when they were 64-bit: `_load_slots` reads both)."""
        used = self._slot_ids >= 0
        slots = np.zeros(len(self._slot_ids), np.uint32)
        slots[used] = self._hashes[self._slot_ids[used]]
        slots[self._slot_ids == _GONE] = _GONE_HASH
        return {"subject_slots": slots, "subject_slot_ids": np.where(used, self._slot_ids, 0).astype(np.int32)}

    def _load_slots(self, slots: np.ndarray, slot_ids: np.ndarray) -> None:
        used = slots > _GONE_HASH
        if len(slots) and int(slots.max()) > _HASH_BITS:  # a snapshot of 64-bit hashes: narrowed, placed anew
            self._load_wide_slots(slots[used], slot_ids[used], len(slots))
            return
        self._hashes = np.zeros(self.count, np.uint32)
        self._hashes[slot_ids[used]] = slots[used]
        self._slot_ids = np.where(used, slot_ids, np.where(slots == _GONE_HASH, _GONE, _EMPTY)).astype(np.int32)
        self._occupied = int(np.count_nonzero(slots != _EMPTY_HASH))

    def _load_wide_slots(self, hashes: np.ndarray, ids: np.ndarray, size: int) -> None:
        """Slots written with 64-bit hashes: an id's slot follows its hash's low bits, which a narrowed hash
        of 0 or 1 (moved to 2 or 3) no longer gives, so the live ids are placed again (forgotten ones go)."""
        narrow = hashes & np.uint64(_HASH_BITS)
        narrow[narrow <= _GONE_HASH] += np.uint64(2)
        self._hashes = np.zeros(self.count, np.uint32)
        self._hashes[ids] = narrow.astype(np.uint32)
        self._slot_ids = np.full(size, _EMPTY, np.int32)
        _place_many(self._slot_ids, self._hashes[ids], ids.astype(np.int32))
        self._occupied = len(ids)


def _place_many(slot_ids: np.ndarray, hashes: np.ndarray, ids: np.ndarray) -> None:
    """Linear-probing inserts of many (hash, id), vectorised: each round places, per free slot, the
    first entry probing it; the others move one slot on. Every entry ends at the first slot of its
    probe sequence that was free when it got there, as one-by-one inserts would leave it findable."""
    mask = np.uint64(len(slot_ids) - 1)
    position = hashes & mask
    pending = np.arange(len(hashes))
    while len(pending):
        at = position[pending].astype(np.int64)
        free = slot_ids[at] == _EMPTY
        taken_slots, first = np.unique(at[free], return_index=True)
        winners = pending[free][first]
        slot_ids[taken_slots] = ids[winners]
        placed = np.zeros(len(hashes), np.bool_)
        placed[winners] = True
        pending = pending[~placed[pending]]
        position[pending] = (position[pending] + np.uint64(1)) & mask


def _grown(array: np.ndarray, needed: int) -> np.ndarray:
    out = np.zeros(max(needed, 2 * len(array), 16), array.dtype)
    out[: len(array)] = array
    return out
