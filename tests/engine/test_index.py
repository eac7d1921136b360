from __future__ import annotations

import numpy as np

from engine.index import MessageIndex
from engine.seq_ranges import seq_ranges


def _index(subjects: list[str]) -> MessageIndex:
    ix = MessageIndex()
    for i, s in enumerate(subjects, start=1):
        ix.append(i, s, 10, i * 1000)
    return ix


def test_append_tracks_stream_and_subject_state() -> None:
    ix = _index(["a", "b", "a", "c", "a"])
    assert (ix.msgs, ix.bytes, ix.first_seq, ix.last_seq, ix.num_subjects) == (5, 50, 1, 5, 3)
    assert ix.subject_state("a") == (3, 1, 5)
    assert ix.subjects_state("*") == {"a": 3, "b": 1, "c": 1}


def test_removing_a_subjects_first_and_last_walks_its_chain() -> None:
    ix = _index(["a", "b", "a", "b", "a", "a"])
    assert ix.remove(1)
    assert ix.subject_state("a") == (3, 3, 6)
    assert ix.remove(6)
    assert ix.subject_state("a") == (2, 3, 5)
    assert ix.first_seq == 2 and ix.last_seq == 6 and ix.num_deleted == 1
    ix.append(7, "a", 10, 7000)
    assert ix.subject_state("a") == (3, 3, 7)
    assert not ix.remove(6)


def test_removing_everything_moves_first_past_last() -> None:
    ix = _index(["a", "b"])
    ix.remove_many(np.array([1, 2]))
    assert (ix.msgs, ix.first_seq, ix.last_seq, ix.num_subjects, ix.num_deleted) == (0, 3, 2, 0, 0)
    ix.append(3, "a", 10, 5000)
    assert (ix.first_seq, ix.last_seq, ix.msgs) == (3, 3, 1)


def test_skip_to_leaves_a_gap_without_messages() -> None:
    ix = _index(["a"])
    ix.skip_to(10)
    assert ix.last_seq == 9 and ix.msgs == 1
    ix.append(10, "a", 10, 9000)
    assert ix.num_deleted == 8 and ix.subject_state("a") == (2, 1, 10)


def test_lookups_by_subject_and_time() -> None:
    ix = _index(["x.1", "x.2", "y", "x.1"])
    assert ix.last_seq_for("x.*") == 4
    assert ix.next_seq_for("x.2", 1) == 2
    assert ix.next_seq_for("x.1", 2) == 4
    assert ix.next_seq_for("z", 1) == 0
    assert ix.seq_at_or_after_time(2500) == 3
    assert ix.live_seqs("x.>").tolist() == [1, 2, 4]
    assert ix.live_mask(np.array([0, 1, 3, 9])).tolist() == [False, True, True, False]


def test_rebase_keeps_lookups_right_after_many_removals() -> None:
    ix = MessageIndex()
    for seq in range(1, 200_001):
        ix.append(seq, "a" if seq % 2 else "b", 1, seq)
    ix.remove_many(np.arange(1, 150_001, dtype=np.int64))
    assert ix.memory_bytes < 4_000_000  # the removed blocks' summaries and details are gone
    assert ix.first_seq == 150_001 and ix.msgs == 50_000
    assert ix.subject_state("a") == (25_000, 150_001, 199_999)
    assert ix.next_seq_for("b", 1) == 150_002


def test_seq_ranges() -> None:
    assert seq_ranges([1, 2, 3, 5, 7, 8]) == [(1, 3), (5, 5), (7, 8)]
    assert seq_ranges([]) == []


def test_oldest_seqs_walks_the_subject_chain_past_removed_messages() -> None:
    rng = np.random.default_rng(7)
    ix = MessageIndex()
    subjects = ["a", "b", "c"]
    seq = 0
    for _ in range(400):
        seq += 1
        ix.append(seq, subjects[int(rng.integers(3))], 10, seq)
        if rng.random() < 0.4:
            ix.remove(int(rng.integers(1, seq + 1)))
    ix.append_run(seq + 1, ["a", "b", "a"], [10, 10, 10], seq + 1)
    for subject in subjects:
        live = ix.live_seqs(subject)
        for count in (0, 1, 2, 5, len(live), len(live) + 3):
            assert ix.oldest_seqs(subject, count).tolist() == live[:count].tolist()
    assert ix.oldest_seqs("missing", 3).tolist() == []


def test_one_subject_runs_link_as_messages_appended_one_by_one() -> None:
    """`append_run` on one subject (no per-message loop) leaves the index `append` would."""
    rng = np.random.default_rng(11)
    runs, singles = MessageIndex(), MessageIndex()
    seq = 0
    for _ in range(60):
        subject = "abc"[int(rng.integers(3))]
        count = int(rng.integers(1, 6))
        sizes = rng.integers(1, 50, count)
        runs.append_run(seq + 1, [subject] * count, sizes, seq + 1)
        for k in range(count):
            singles.append(seq + 1 + k, subject, int(sizes[k]), seq + 1)
        seq += count
        if rng.random() < 0.3:
            victim = int(rng.integers(1, seq + 1))
            runs.remove(victim)
            singles.remove(victim)
    assert (runs.msgs, runs.bytes, runs.num_subjects, runs.last_seq) == (singles.msgs, singles.bytes, singles.num_subjects, singles.last_seq)
    for subject in "abcd":
        assert runs.live_seqs(subject).tolist() == singles.live_seqs(subject).tolist()
        assert runs.subject_state(subject) == singles.subject_state(subject)
        assert runs.last_seq_for(subject) == singles.last_seq_for(subject)
        assert runs.oldest_seqs(subject, 4).tolist() == singles.oldest_seqs(subject, 4).tolist()
        assert [runs.next_seq_for(subject, s) for s in range(1, seq + 2, 7)] == [singles.next_seq_for(subject, s) for s in range(1, seq + 2, 7)]


def test_only_the_written_blocks_histogram_is_a_dict() -> None:
    """Batches straddling block boundaries leave every earlier block's histogram as sorted arrays (a
    dict per block cost ~90 B a message with distinct subjects), and the counts stay exact."""
    ix = MessageIndex(block_size=64)
    seq = 1
    for batch in range(40):
        subjects = [f"s.{(batch * 7 + k) % 90}" for k in range(23)]
        ix.append_run(seq, subjects, np.full(len(subjects), 5, np.int64), 1000 + batch)
        seq += len(subjects)
    ix.append(seq, "s.1", 5, 5000)
    assert all(h.open is None for h in ix.blocks.hists[:-1]) and ix.blocks.hists[-1].open is not None
    everything = [f"s.{(b * 7 + k) % 90}" for b in range(40) for k in range(23)] + ["s.1"]
    for slot, hist in enumerate(ix.blocks.hists):
        lo = (ix.blocks.base + slot) * 64
        block = [s for q, s in enumerate(everything, start=1) if lo <= q < lo + 64]
        expected = {ix.subjects.find(s): block.count(s) for s in set(block)}
        sids, counts = hist.arrays()
        assert dict(zip(sids.tolist(), counts.tolist(), strict=True)) == expected
    assert ix.count_live("s.1") == everything.count("s.1")
    ix.remove_range(1, 100)
    assert ix.count_live(">") == len(everything) - 100


def test_runs_of_a_thousand_fill_a_block_without_room_past_its_rows() -> None:
    """A block's detail doubles as runs arrive but stops at the block's rows: runs of a thousand took a
    block of 8,192 rows to arrays of 16,256 (28 bytes a message of slack while unflushed)."""
    ix = MessageIndex(block_size=8192)
    for start in range(1, 3 * 8192, 1000):
        ix.append_run(start, [f"k.{start + i}" for i in range(1000)], [100] * 1000, start)
    full = [ix.details.pinned[b] for b in (1, 2)]  # block 0 starts at sequence 1: 8,191 rows
    assert [d.n for d in full] == [8192, 8192] and [len(d.seqs) for d in full] == [8192, 8192]
    assert ix.details.nbytes <= 28 * 4 * 8192 + 4 * 64
    assert ix.subject_of(8192 + 5) == "k.8197" and ix.subject_of(3 * 8192 - 1000) == f"k.{3 * 8192 - 1000}"
