"""What `/healthz` reports of one account's engine: whether it takes writes, failing flushes, the
flusher's lag, streams that failed, damaged logs. Only streams opened so far are looked at (a stream
not opened yet holds nothing unflushed: engine/catalog.py). Counterpart: server/monitor.go `Healthz`.
"""

from __future__ import annotations

import time
from typing import Any

from engine.consumers import Consumers
from engine.flusher import ACKS, Flusher
from engine.info import rfc3339
from engine.store.backlog import Backlog
from engine.store.delta import DeltaStore
from engine.stream import Stream


def health_report(streams: list[Stream], flusher: Flusher, consumers: Consumers, backlog: Backlog,
                  refusal: str | None) -> dict[str, Any]:
    """The answer of `/healthz`; `refusal` says why the gateway takes no writes (None: it does)."""
    now = time.monotonic()
    failing = flusher.failing()
    failed = [
        {"stream": s.name, "error": s.unavailable or s.failure, "reads": s.unavailable is None}
        for s in streams if s.failure is not None or s.unavailable is not None
    ]
    flushes = [
        {"table": name if name == ACKS else f"streams/{name}", "consecutive_failures": h.consecutive_failures,
         "last_error": h.last_error, "failing_since": rfc3339(h.failing_since_ns or 0)}
        for name, h in sorted(failing.items())
    ]
    damage = [
        {"stream": s.name, **d.to_json()}
        for s in streams if isinstance(s.store, DeltaStore) for d in s.store.wal.damage
    ]
    damage += [{"table": ACKS, **d.to_json()} for acks in consumers.ack_stores() for d in acks.wal.damage]
    status = "unavailable" if refusal else "degraded" if failed or flushes else "ok"
    answer: dict[str, Any] = {
        "status": status,
        "writes": refusal is None,
        "lag": {
            "oldest_unflushed_seconds": round(max((s.store.unflushed_age(now) for s in streams), default=0.0), 3),
            "unflushed_bytes": backlog.total,
            "max_unflushed_bytes": backlog.max_total_bytes,
        },
        "flush": {"failing": flushes, "failures_total": flusher.stats.failures},
    }
    if refusal:
        answer["error"] = refusal
    if failed:
        answer["streams_failed"] = failed
    if damage:
        answer["log_damage"] = damage
    return answer


def write_refusal(opened: bool, backlog: Backlog, consumers: Consumers) -> str | None:
    """Why the gateway as a whole takes no writes now; None when it does (a single stream may still refuse)."""
    if not opened:
        return "the engine is not open"
    if backlog.total >= backlog.max_total_bytes:
        return f"{backlog.total} unflushed bytes in the logs, the bound is {backlog.max_total_bytes}"
    for acks in consumers.ack_stores():
        if acks.wal.broken is not None:
            return f"the ack log refuses writes: {acks.wal.broken}"
    return None
