"""What a file stream holds in memory that its tables do not yet: the bytes of the messages appended
since the last flush, the removals waiting for the tombstones table, since when, and the bytes of the
job under commit (still in memory until that commit lets go of them)."""

from __future__ import annotations

import threading
import time

from engine.store.base import Removal


class Unflushed:
    """The stream's unflushed backlog. The stream's lock serialises every call but `release` and `wait_drained`."""

    # one per stream beside its store (thousands of streams): no instance dict
    __slots__ = ("removals", "bytes", "committing", "oldest", "_drained")

    def __init__(self) -> None:
        self.removals: list[tuple[int, Removal]] = []  # (log sequence number, removal)
        self.bytes = 0
        self.committing = 0  # the bytes of the sealed job under commit: still in memory
        self.oldest: float | None = None  # monotonic time of the oldest append not yet committed
        self._drained = threading.Condition()  # notified when a commit lets go of its bytes

    def has_pending(self) -> bool:
        return self.bytes > 0 or bool(self.removals)

    def held_bytes(self) -> int:
        """Messages in memory not yet in the table: those waiting in the log and those under commit."""
        return self.bytes + self.committing

    def started(self) -> None:
        """Something was appended: the age of the backlog counts from the oldest append."""
        if self.oldest is None:
            self.oldest = time.monotonic()

    def age(self, now: float | None = None) -> float:
        """Seconds since the oldest append not yet committed to the tables (0 when there is none)."""
        if self.oldest is None:
            return 0.0
        return max((time.monotonic() if now is None else now) - self.oldest, 0.0)

    def sealed(self) -> None:
        """A flush job took everything pending (its removals, their age): its bytes are under commit now."""
        self.removals = []
        self.committing += self.bytes
        self.bytes = 0
        self.oldest = None

    def requeued(self, since: float | None) -> None:
        """A job whose commit failed or waited is pending again: the backlog is as old as its oldest append."""
        if since is not None:
            self.oldest = min(since, self.oldest or since)

    def wait_drained(self, timeout: float) -> None:
        """Returns once a commit has finished or failed, or after `timeout` seconds."""
        with self._drained:
            self._drained.wait(timeout)

    def release(self) -> None:
        """A commit finished or failed: its bytes are no longer held for it."""
        with self._drained:
            self.committing = 0
            self._drained.notify_all()
