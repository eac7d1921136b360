"""JetStream's JSON answers: StreamInfo, StoredMessage, AccountInfo, and its time format."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import pybase64

from engine.store.base import StoredMessage

ZERO_TIME = "0001-01-01T00:00:00Z"


@lru_cache(maxsize=4096)
def _seconds(seconds: int) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")


def rfc3339(ns: int) -> str:
    """RFC 3339 UTC with the fraction JetStream prints (trailing zeros trimmed)."""
    if ns <= 0:
        return ZERO_TIME
    seconds, frac = divmod(ns, 1_000_000_000)
    base = _seconds(seconds)
    if frac:
        return f"{base}.{frac:09d}".rstrip("0") + "Z"
    return base + "Z"


def parse_rfc3339(value: str) -> int:
    """Nanoseconds since the epoch from an RFC 3339 time (fraction up to nanoseconds)."""
    text = value.strip().replace("z", "Z")
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    frac_ns = 0
    if "." in text:
        head, rest = text.split(".", 1)
        digits = ""
        while rest and rest[0].isdigit():
            digits, rest = digits + rest[0], rest[1:]
        frac_ns = int((digits + "000000000")[:9])
        text = head + rest
    dt = datetime.fromisoformat(text)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp()) * 1_000_000_000 + frac_ns


def state_json(state: dict[str, Any]) -> dict[str, Any]:
    out = dict(state)
    out["first_ts"] = rfc3339(state["first_ts"])
    out["last_ts"] = rfc3339(state["last_ts"])
    return out


def stored_message_json(msg: StoredMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq, "time": rfc3339(msg.ts)}
    if msg.headers:
        out["headers"] = msg.headers
    out["data"] = pybase64.b64encode(msg.data).decode()
    return out
