"""An index as named arrays, without its details (the table holds those): what an index snapshot stores
(engine/store/index_snapshots.py, index_file.py), so a restart reads the summaries, subjects and
removed ranges back instead of every row of the table."""

from __future__ import annotations

import numpy as np

from engine.block_summaries import BlockSummaries
from engine.seqset import SeqSet
from engine.subject_table import SubjectTable

# the index's scalars, in the order of the "scalars" array
SCALARS = ("block_size", "first_seq", "last_seq", "first_ts", "last_ts", "msgs", "bytes", "base", "flushed_upto")


def to_arrays(scalars: list[int], blocks: BlockSummaries, removed: SeqSet, subjects: SubjectTable) -> dict[str, np.ndarray]:
    """`scalars` in the order of SCALARS; the arrays' order is the snapshot's layout."""
    summaries = blocks.to_arrays()
    starts, ends = removed.to_arrays()
    return {
        "scalars": np.array(scalars, np.int64),
        **summaries,
        "removed_starts": starts,
        "removed_ends": ends,
        **subjects.to_arrays(),
    }


def from_arrays(arrays: dict[str, np.ndarray]) -> tuple[dict[str, int], BlockSummaries, SeqSet, SubjectTable]:
    """`to_arrays` read back: the scalars by name, and the parts."""
    scalars = dict(zip(SCALARS, arrays["scalars"].tolist(), strict=True))
    shift = scalars["block_size"].bit_length() - 1
    blocks = BlockSummaries.from_arrays(arrays, shift, scalars["base"])
    removed = SeqSet.from_arrays(arrays["removed_starts"], arrays["removed_ends"])
    return scalars, blocks, removed, SubjectTable.from_arrays(arrays)
