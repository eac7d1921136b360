"""The unflushed backlog: bytes in write-ahead logs not yet committed to the tables, and its bounds.

Publishes and acks are answered from the log and committed to Delta later; when commits keep failing
(a full disk, a lease held for long) the logs and the memory holding their unflushed records would
grow without end, and a restart would load all of it. So each log (a stream's, the ack log) and the
gateway as a whole have a bound; past it, new publishes and acks are refused (503) until the flusher
catches up. A restart loads at most what the bounds let through. Counterpart: the `max_bytes`
account limits of server/jetstream.go (JetStream refuses with "insufficient resources").
"""

from __future__ import annotations

import threading

DEFAULT_MAX_LOG_BYTES = 512 * 1024 * 1024
DEFAULT_MAX_TOTAL_BYTES = 1024 * 1024 * 1024


class Backlog:
    """The gateway's total of unflushed log bytes (every log adds to it) and the bounds new writes must fit."""

    def __init__(
        self, max_log_bytes: int = DEFAULT_MAX_LOG_BYTES, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    ) -> None:
        self.max_log_bytes = max_log_bytes
        self.max_total_bytes = max_total_bytes
        self.total = 0
        self._lock = threading.Lock()

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.total += nbytes

    def refusal(self, log_bytes: int) -> str | None:
        """Why a log holding `log_bytes` unflushed bytes may not take more now; None when it may."""
        if log_bytes >= self.max_log_bytes:
            return f"{log_bytes} unflushed bytes in its log, the bound is {self.max_log_bytes}"
        if self.total >= self.max_total_bytes:
            return f"{self.total} unflushed bytes in the gateway's logs, the bound is {self.max_total_bytes}"
        return None
