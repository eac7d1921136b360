"""Each subject's JetStream `SimpleState` (live messages, first and last sequence) kept as the index
gains and loses messages, in the SubjectTable's columns (engine/subject_table.py).

Counts change by arithmetic; a subject whose first or last message goes while others remain walks the
blocks to its next or previous one (`BlockRows.next_of` / `prev_of`). STREAM.INFO reads the counts of
the subjects a filter matches.
"""

from __future__ import annotations

import numpy as np

from engine.block_rows import BlockRows
from engine.subject_table import SubjectTable


def count_appended(table: SubjectTable, sids: np.ndarray, seqs: np.ndarray) -> None:
    """Counts appended rows of subjects `sids` at ascending sequences `seqs`."""
    table.fit(int(seqs[-1]))
    if len(sids) == 1 or sids[0] == sids[-1] and (sids == sids[0]).all():
        sid = int(sids[0])
        if table.msgs[sid] == 0:
            table.first[sid] = seqs[0]
            table.live += 1
        table.msgs[sid] += len(sids)
        table.last[sid] = seqs[-1]
        return
    unique, first_at, counts = np.unique(sids, return_index=True, return_counts=True)
    last_at = len(sids) - 1 - np.unique(sids[::-1], return_index=True)[1]
    fresh = table.msgs[unique] == 0
    table.first[unique[fresh]] = seqs[first_at[fresh]]
    table.live += int(fresh.sum())
    table.msgs[unique] += counts
    table.last[unique] = seqs[last_at]


def uncount_one(table: SubjectTable, sid: int, seq: int, rows: BlockRows) -> None:
    """`uncount` of one removed message `seq` of subject `sid`, in scalars."""
    table.msgs[sid] -= 1
    if table.msgs[sid] == 0:
        table.first[sid] = table.last[sid] = 0
        table.live -= 1
        return
    first, last = int(table.first[sid]), int(table.last[sid])
    if table.msgs[sid] == 1 and (first == seq) != (last == seq):
        table.first[sid] = table.last[sid] = last if first == seq else first
        return
    if first == seq:
        table.first[sid] = rows.next_of(sid, seq)
    if last == seq:
        table.last[sid] = rows.prev_of(sid, seq)


def uncount(
    table: SubjectTable, sids: np.ndarray, counts: np.ndarray, lo: int, hi: int, rows: BlockRows,
    seqs: np.ndarray | None = None,
) -> None:
    """Subject states after removing `counts` messages of `sids`: every live one in [lo, hi], or the
    sorted `seqs` when given. Vectorised, but for subjects whose first or last message went while
    others remain (those walk to the next one)."""
    table.msgs[sids] -= counts
    left = table.msgs[sids]
    gone = sids[left == 0]
    table.first[gone] = table.last[gone] = 0
    table.live -= len(gone)
    rest = sids[left > 0]
    if seqs is None:
        first_in = (table.first[rest] >= lo) & (table.first[rest] <= hi)
        last_in = (table.last[rest] >= lo) & (table.last[rest] <= hi)
    else:
        first_in = np.isin(table.first[rest], seqs)
        last_in = np.isin(table.last[rest], seqs)
    single = (table.msgs[rest] == 1) & (first_in != last_in)
    keep = np.where(first_in, table.last[rest], table.first[rest])[single]
    table.first[rest[single]] = table.last[rest[single]] = keep
    walk = ~single & (first_in | last_in)
    for sid, f, l in zip(rest[walk].tolist(), first_in[walk].tolist(), last_in[walk].tolist(), strict=True):
        if f:
            table.first[sid] = rows.next_of(sid, int(table.first[sid]))
        if l:
            table.last[sid] = rows.prev_of(sid, int(table.last[sid]))


def counts_matching(table: SubjectTable, filter_: str) -> dict[str, int]:
    """{subject: live messages} of the subjects matching `filter_`."""
    sids = table.matching(filter_)
    return {table.name(sid): int(table.msgs[sid]) for sid in sids.tolist()}


def counts_page(table: SubjectTable, filter_: str, offset: int, limit: int) -> tuple[dict[str, int], int]:
    """({subject: msgs} of the matching subjects sorted by name, from `offset`, at most `limit`), and
    how many match in all: STREAM.INFO's subject paging."""
    sids = table.matching(filter_)
    total = len(sids)
    if offset == 0 and total <= limit:
        return {table.name(sid): int(table.msgs[sid]) for sid in sids.tolist()}, total
    names = sorted(zip(table.names(sids), sids.tolist(), strict=True))[offset : offset + limit]
    return {name: int(table.msgs[sid]) for name, sid in names}, total
