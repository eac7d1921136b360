"""What one group commit accepts: the columns of its messages and the removals they cause, handed to
the store as one append (engine/stream.py's `process`)."""

from __future__ import annotations

from engine.store.rows import RowGroup, Rows


class Accepted:
    """Columns of the messages a group commit accepts, and the removals it causes."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.subjects: list[str] = []
        self.ts: list[int] = []
        self.msg_ids: list[str | None] = []
        self.headers: list[dict[str, list[str]] | None] = []
        self.data: list[bytes] = []
        self.sizes: list[int] = []
        self.partitions: list[str] = []
        self.removed: dict[str, list[tuple[int, int]]] = {}  # reason -> inclusive sequence ranges
        self.groups: list[RowGroup] = []

    def add_run(self, run: RowGroup) -> None:
        """A columnar run: it follows the messages accepted so far, so they are closed into a group first."""
        self.close()
        self.groups.append(run)

    def close(self) -> None:
        """Turns the messages accepted one by one since the last run into a row group."""
        if self.seqs:
            self.groups.append(Rows(self.seqs[0], self.subjects, self.ts, self.msg_ids, self.headers, self.data, self.sizes, self.partitions))
            self.seqs, self.subjects, self.ts, self.msg_ids = [], [], [], []
            self.headers, self.data, self.sizes, self.partitions = [], [], [], []

    def remove(self, reason: str, ranges: list[tuple[int, int]]) -> None:
        if ranges:
            self.removed.setdefault(reason, []).extend(ranges)
