"""What a stream's table holds, live or not, found by subject: the rows an erasure must reach.

Deleted, purged, limit-removed (KV history past its limit), interest and work-queue removed rows stay
in the table's files until the retention job rewrites them, and a read never returns them; a GDPR
erasure must find them all the same. `scan` reads the `seq` and `subject` columns (and `data` when
asked) of the files whose partition may hold a matching subject, by the table's latest snapshot.
It is rare (an erasure request) and reads the table: callers run it off the event loop and outside
the stream's lock. Subject syntax stays with the caller, which passes two predicates; so do keys: an
encrypted stream's values are ciphertext here, and the caller passes the function that opens them
(`OpenRows`) when it needs the data, and the one that opens protected subjects (`open_subjects`)
before they are matched. Counterpart:
none (nats-server erases a message in place in its block).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.store.delta_log import TableNotFoundError, log_of
from engine.store.layout import PARTITION_COLUMN, TableLocation

SubjectMatch = Callable[[str], bool]
OpenRows = Callable[[pa.Table], pa.Table]  # rows (seq, subject, data) with `data` opened to plaintext


@dataclass
class StoredRows:
    """Rows of a table matching a subject predicate, and how far the scanned snapshot reaches."""

    rows: dict[int, bytes | None] = field(default_factory=dict)  # seq -> data (None unless asked for)
    flushed: int = 0  # the last sequence the scanned snapshot holds (the stream's app transaction)
    files_read: int = 0


def scan(
    table: TableLocation,
    stream_id: str,
    match: SubjectMatch,
    partition_match: SubjectMatch,
    above: int = 0,
    with_data: bool = False,
    open_rows: OpenRows | None = None,
    open_subjects: Callable[[pa.Table], pa.Table] | None = None,
) -> StoredRows:
    """The rows with `seq > above` whose subject satisfies `match`, in files whose partition value
    satisfies `partition_match` (a partition is a subject or its first tokens; the caller decides).
    With `with_data`, `open_rows` (when given) turns the stored values into plaintext first."""
    out = StoredRows()
    try:
        state = log_of(table).state()
    except TableNotFoundError:
        return out
    out.flushed = state.transaction_version(stream_id)
    columns = ["seq", "subject", "data"] if with_data else ["seq", "subject"]
    for add in list(state.files.values()):
        high = add.bounds("seq")[1]
        partition = add.partition_values.get(PARTITION_COLUMN) or ""
        if (high is not None and high <= above) or not partition_match(partition):
            continue
        rows = pq.read_table(table.file(add.path), columns=columns, filesystem=table.filesystem)
        out.files_read += 1
        if open_subjects is not None:
            rows = open_subjects(rows)
        _collect(rows, match, above, out.rows, open_rows)
    return out


def _collect(rows: pa.Table, match: SubjectMatch, above: int, into: dict[int, bytes | None],
             open_rows: OpenRows | None) -> None:
    subjects = rows.column("subject")
    wanted = [s for s in pc.unique(subjects).to_pylist() if match(s)]
    if not wanted:
        return
    mask = pc.and_(pc.is_in(subjects, pa.array(wanted, pa.string())), pc.greater(rows.column("seq"), above))
    picked = rows.filter(mask)
    if open_rows is not None and "data" in picked.column_names and picked.num_rows:
        picked = open_rows(picked)
    seqs = picked.column("seq").to_pylist()
    data = picked.column("data").to_pylist() if "data" in picked.column_names else [None] * len(seqs)
    into.update(zip(seqs, data, strict=True))
