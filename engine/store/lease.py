"""Locks between processes: the warehouse owner lock and the per-table commit lease.

One gateway owns a warehouse's streams: a second one is refused, not left racing. And one committer
at a time per table: on a local filesystem Spark's Delta log store does not exclude other processes,
and a Spark DELETE conflicts with appends to the partitions it reads, so the gateway's flusher and
the Spark jobs take the table's lease around each commit. Both are `flock` locks, released by the
kernel when their process dies, so a kill -9 never leaves one behind.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class OwnerLockedError(RuntimeError):
    """Another process already owns this warehouse."""


class OwnerLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OwnerLockedError(
                f"another JetLake gateway (pid {holder}) already owns the warehouse at {self.path.parent.parent.parent}; "
                "stop it first or use another --warehouse"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@contextmanager
def commit_lease(path: Path, timeout: float | None = None, poll: float = 0.05) -> Iterator[None]:
    """Holds a table's commit lease; waits for it (up to `timeout` seconds, forever when None)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"commit lease {path} is held by another process") from None
                time.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
