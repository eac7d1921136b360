"""The sparse index against a plain model: random appends, removals, flushes, evictions, table
rewrites and snapshots, with tiny blocks so every path crosses block boundaries."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from engine.index import MessageIndex
from engine.subjects import subject_matches

SUBJECTS = ["a.x", "a.y", "b.x", "b.y.z", "c"]
FILTERS = [None, ">", "a.*", "a.x", "b.>", "*.x", "c", "missing", ["a.x", "c"]]


class Model:
    """What the index must answer: every message ever appended, with its liveness."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, int, int]] = {}
        self.live: set[int] = set()
        self.last_seq = 0

    def live_sorted(self, filter_: str | list[str] | None = None, start: int = 0, stop: int | None = None) -> list[int]:
        filters = [filter_] if isinstance(filter_, str) else (filter_ or [">"])
        return [
            s for s in sorted(self.live)
            if s >= start and (stop is None or s < stop) and any(subject_matches(f, self.rows[s][0]) for f in filters)
        ]


class Table:
    """The rows a flush wrote (and a retention job has not yet removed)."""

    def __init__(self) -> None:
        self.rows: dict[int, tuple[str, int, int]] = {}
        self.reads = 0

    def load(self, lo: int, hi: int) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
        self.reads += 1
        seqs = sorted(s for s in self.rows if lo <= s <= hi)
        return (np.array(seqs, np.int64), [self.rows[s][0] for s in seqs],
                np.array([self.rows[s][1] for s in seqs], np.int64), np.array([self.rows[s][2] for s in seqs], np.int64))

    def first_at_or_after(self, lo: int, hi: int, since: int, alive: Callable[[np.ndarray], np.ndarray]) -> int:
        seqs, _, _, ts = self.load(lo, hi)
        seqs = seqs[ts >= since]
        seqs = seqs[alive(seqs)] if len(seqs) else seqs
        return int(seqs[0]) if len(seqs) else 0

    def holds(self, ix: MessageIndex, seq: int) -> bool:
        """Whether `seq` is live by the rule a table read uses (DeltaStore.load): the summaries say it
        would be live, and its row is in the block's detail when that is in memory, else in the table."""
        if not ix.may_be_live(seq):
            return False
        return ix.is_live(seq) if ix.holds_detail(seq) else seq in self.rows


def _check(ix: MessageIndex, model: Model, table: Table | None = None) -> None:
    live = sorted(model.live)
    if table is not None:
        probe = range(0, model.last_seq + 3)
        assert [table.holds(ix, s) for s in probe] == [s in model.live for s in probe]
    assert ix.msgs == len(live)
    assert ix.bytes == sum(model.rows[s][1] for s in live)
    assert ix.last_seq == model.last_seq
    if live:
        assert ix.first_seq == live[0]
        assert ix.first_ts == model.rows[live[0]][2]
    else:
        assert ix.first_seq == (model.last_seq + 1 if model.last_seq else 0)
    probe = np.arange(0, model.last_seq + 3, dtype=np.int64)
    assert ix.live_mask(probe).tolist() == [int(s) in model.live for s in probe]
    for f in FILTERS:
        expect = model.live_sorted(f)
        assert ix.live_seqs(f).tolist() == expect, f
        for start in (0, 1, model.last_seq // 3, model.last_seq // 2 + 1, model.last_seq + 1):
            assert ix.count_live(f, start) == len([s for s in expect if s >= start]), (f, start)
            assert ix.live_seqs(f, start=start, stop=start + 7).tolist() == model.live_sorted(f, start, start + 7)
    for subject in SUBJECTS + ["missing"]:
        seqs = model.live_sorted(subject)
        assert ix.subject_state(subject) == ((len(seqs), seqs[0], seqs[-1]) if seqs else (0, 0, 0)), subject
        assert ix.oldest_seqs(subject, 3).tolist() == seqs[:3]
        for start in (1, model.last_seq // 2, model.last_seq):
            nxt = [s for s in seqs if s >= start]
            assert ix.next_seq_for(subject, start) == (nxt[0] if nxt else 0)
    for f in ("a.*", "b.>", ">", "*.x"):
        per = {subj: model.live_sorted(subj) for subj in SUBJECTS if subject_matches(f, subj)}
        assert ix.subjects_state(f) == {k: len(v) for k, v in per.items() if v}
        assert ix.last_seq_for(f) == max((v[-1] for v in per.values() if v), default=0)
        assert ix.last_seqs(f).tolist() == sorted(v[-1] for v in per.values() if v)
    assert ix.num_subjects == len({model.rows[s][0] for s in live})
    for n in (1, 2, len(live)):
        assert ix.nth_live_seq(n) == (live[n - 1] if 0 < n <= len(live) else 0)
    for cutoff in (0, 5, model.rows[live[len(live) // 2]][2] if live else 0):
        before = [s for s in live if model.rows[s][2] < cutoff]
        assert ix.last_seq_before_time(cutoff) == (before[-1] if before else 0)
        at = [s for s in live if model.rows[s][2] >= cutoff]
        assert ix.seq_at_or_after_time(cutoff) == (at[0] if at else 0)
    for s in live[:: max(len(live) // 10, 1)]:
        assert ix.subject_of(s) == model.rows[s][0] and ix.size_of(s) == model.rows[s][1] and ix.ts_of(s) == model.rows[s][2]
    if live:
        total = sum(model.rows[s][1] for s in live)
        for amount in (1, total // 2, total):
            acc, expect_seq = 0, live[-1]
            for s in live:
                acc += model.rows[s][1]
                if acc >= amount:
                    expect_seq = s
                    break
            assert ix.seq_covering_bytes(amount) == expect_seq


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("durable", [True, False])
def test_index_matches_the_model(seed: int, durable: bool) -> None:
    rng = np.random.default_rng(seed)
    table = Table()
    ix = MessageIndex(block_size=8, cache_bytes=600)
    if durable:
        ix.loader, ix.time_seeker = table.load, table.first_at_or_after
    model = Model()
    ts = 0
    for step in range(260):
        op = rng.random()
        if op < 0.35:
            ts += int(rng.integers(0, 3))
            subject = SUBJECTS[int(rng.integers(len(SUBJECTS)))]
            seq = model.last_seq + 1
            size = int(rng.integers(1, 40))
            ix.append(seq, subject, size, ts)
            model.rows[seq] = (subject, size, ts)
            model.live.add(seq)
            model.last_seq = seq
        elif op < 0.5:
            ts += 1
            count = int(rng.integers(1, 12))
            subjects = [SUBJECTS[int(i)] for i in rng.integers(0, len(SUBJECTS), count)] if rng.random() < 0.6 else ["c"] * count
            sizes = rng.integers(1, 40, count)
            first = model.last_seq + 1
            ix.append_run(first, subjects, sizes, ts)
            for i, subject in enumerate(subjects):
                model.rows[first + i] = (subject, int(sizes[i]), ts)
                model.live.add(first + i)
            model.last_seq = first + count - 1
        elif op < 0.62 and model.last_seq:
            victims = np.unique(rng.integers(1, model.last_seq + 1, int(rng.integers(1, 5))))
            expect = len(set(victims.tolist()) & model.live)
            assert ix.remove_many(victims) == expect
            model.live -= set(victims.tolist())
        elif op < 0.68 and model.last_seq:
            a = int(rng.integers(1, model.last_seq + 1))
            b = min(a + int(rng.integers(0, 30)), model.last_seq)
            expect = len([s for s in model.live if a <= s <= b])
            assert ix.remove_range(a, b) == expect
            model.live -= set(range(a, b + 1))
        elif op < 0.70:
            jump = model.last_seq + 1 + int(rng.integers(0, 20))
            ix.skip_to(jump)
            model.last_seq = max(model.last_seq, jump - 1)
        elif op < 0.85 and durable:
            upto = model.last_seq
            ix.seal(upto)
            for s in range(ix.flushed_upto + 1, upto + 1):
                if s in model.live:
                    table.rows[s] = model.rows[s]
            ix.mark_flushed(upto)
        elif op < 0.9 and durable:
            for s in [s for s in table.rows if s not in model.live]:
                del table.rows[s]  # a retention job rewrote the files
            ix.details.cache.clear()
            ix.details.cache_used = 0
        elif op < 0.95 and durable and ix.flushed_upto == model.last_seq:
            arrays = ix.to_arrays()
            ix = MessageIndex.from_arrays(arrays, cache_bytes=600)
            ix.loader, ix.time_seeker = table.load, table.first_at_or_after
        if step % 13 == 0 or step == 259:
            _check(ix, model, table if durable else None)
    _check(ix, model, table if durable else None)
