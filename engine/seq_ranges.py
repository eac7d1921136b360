"""Sorted sequences as inclusive ranges: how removals, purges and erasures name what they cover."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_FEW = 8  # at most this many sequences: a Python loop, without numpy's per-array set-up


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


def merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive ranges sorted, with overlapping or adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _few_ranges(seqs: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for seq in seqs:
        if ranges and ranges[-1][1] + 1 == seq:
            ranges[-1] = (ranges[-1][0], seq)
        else:
            ranges.append((seq, seq))
    return ranges
