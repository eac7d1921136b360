"""Time, injected: the stream and consumer state machines read it only through a `Clock`.

Timestamps are integer nanoseconds since the epoch, rounded to microseconds because the Delta
tables store microseconds and a message must read back exactly as it was acknowledged.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ns(self) -> int: ...


class SystemClock:
    def now_ns(self) -> int:
        return time.time_ns() // 1000 * 1000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ns: int = 1_700_000_000_000_000_000) -> None:
        self._now = start_ns

    def now_ns(self) -> int:
        return self._now

    def advance(self, ns: int) -> None:
        self._now += ns
