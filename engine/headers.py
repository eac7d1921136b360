"""JetStream's control headers: canonical names, and the size of a header block on the wire.

Headers travel as a map of lists (`{"Name": ["v1", "v2"]}`). A header whose name matches a
control header case-insensitively is stored under the canonical spelling, so `nats-msg-id` and
`Nats-Msg-Id` mean the same thing. Counterpart: server/stream.go (JSMsgId, JSExpectedStream, ...).
"""

from __future__ import annotations

from collections.abc import Mapping

MSG_ID = "Nats-Msg-Id"
EXPECTED_STREAM = "Nats-Expected-Stream"
EXPECTED_LAST_SEQ = "Nats-Expected-Last-Sequence"
EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECTED_LAST_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
ROLLUP = "Nats-Rollup"
TTL = "Nats-TTL"
ROLLUP_SUBJECT = "sub"
ROLLUP_ALL = "all"
MAX_HEADERS_SIZE = 64 * 1024

CONTROL_HEADERS = (
    MSG_ID,
    EXPECTED_STREAM,
    EXPECTED_LAST_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    EXPECTED_LAST_MSG_ID,
    ROLLUP,
    TTL,
)
_CANONICAL = {name.lower(): name for name in CONTROL_HEADERS}

Headers = dict[str, list[str]]


def canonical_name(name: str) -> str:
    return _CANONICAL.get(name.lower(), name)


def normalize(raw: Mapping[str, list[str] | str] | None) -> Headers | None:
    """Canonical names, list values; None when there are no headers."""
    if not raw:
        return None
    out: Headers = {}
    for name, values in raw.items():
        key = canonical_name(name)
        vals = [values] if isinstance(values, str) else list(values)
        out.setdefault(key, []).extend(vals)
    return out


def first(headers: Headers | None, name: str) -> str | None:
    if not headers:
        return None
    values = headers.get(name)
    return values[0] if values else None


def wire_size(headers: Headers | None) -> int:
    """Bytes of the NATS header block (`NATS/1.0\\r\\nName: value\\r\\n...\\r\\n`)."""
    if not headers:
        return 0
    size = 12
    for name, values in headers.items():
        for value in values:
            size += len(name.encode()) + len(value.encode()) + 4
    return size


def is_valid_name(name: str) -> bool:
    return bool(name) and all(33 <= ord(ch) <= 126 and ch != ":" for ch in name)


def is_valid_value(value: str) -> bool:
    return "\r" not in value and "\n" not in value


def valid_ttl(value: str) -> bool:
    """`Nats-TTL`: seconds, a duration like `5s`/`1h`, or `never`; at least one second (ADR-43)."""
    text = value.strip()
    if text == "never":
        return True
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
    try:
        seconds = float(text) if text.replace(".", "", 1).isdigit() else _go_duration(text, units)
    except ValueError:
        return False
    return seconds >= 1


def _go_duration(text: str, units: dict[str, float]) -> float:
    total, number = 0.0, ""
    i = 0
    while i < len(text):
        if text[i].isdigit() or text[i] == ".":
            number += text[i]
            i += 1
            continue
        unit = next((u for u in ("ns", "us", "ms", "s", "m", "h") if text.startswith(u, i)), None)
        if unit is None or not number:
            raise ValueError(text)
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    if number or not text:
        raise ValueError(text)
    return total
