"""The NATS client protocol's bytes: INFO, the header block, status messages, and the server's texts.

What a connection parses and writes and nothing else: the error texts nats-server sends (word for
word, single-quoted in `-ERR`), the header block (`NATS/1.0[ status[ description]]\\r\\nKey: value
\\r\\n...\\r\\n`), the status messages JetStream sends as header-only messages (`100 Idle Heartbeat`,
`404 No Messages`, ...), and the recognition of an operation from the first bytes of a control line.
Counterpart: server/parser.go, the framing parts of server/client.go (msgHeader, genHeader, errProto).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import orjson

MAX_CONTROL_LINE = 4096
MAX_PENDING = 64 * 1024 * 1024
VERSION = "2.11.0"
PROTO = 1
HEADER_LINE = b"NATS/1.0"
EMPTY_HEADERS = b"NATS/1.0\r\n\r\n"

PING = b"PING\r\n"
PONG = b"PONG\r\n"
OK = b"+OK\r\n"

# -ERR texts that close the connection, and those that do not (server/client.go, errors.go).
UNKNOWN_OP = "Unknown Protocol Operation"
AUTH_VIOLATION = "Authorization Violation"
AUTH_TIMEOUT = "Authentication Timeout"
AUTH_EXPIRED = "User Authentication Expired"
MAX_PAYLOAD = "Maximum Payload Violation"
MAX_CONTROL_LINE_TEXT = "maximum control line exceeded"
MAX_CONNECTIONS = "maximum connections exceeded"
INVALID_PROTOCOL = "invalid client protocol"
NO_RESPONDERS_NEEDS_HEADERS = "no responders requires headers support"
STALE = "Stale Connection"
INVALID_SUBJECT = "Invalid Subject"
INVALID_PUBLISH_SUBJECT = "Invalid Publish Subject"
MAX_SUBSCRIPTIONS = "maximum subscriptions exceeded"

# The operations a client may send, upper-cased, each with what may follow its name.
_OPS = (b"PUB", b"HPUB", b"SUB", b"UNSUB", b"PING", b"PONG", b"CONNECT", b"INFO", b"+OK", b"-ERR", b"MSG", b"HMSG")


def err(text: str) -> bytes:
    return b"-ERR '" + text.encode() + b"'\r\n"


def could_be_op(partial: bytes) -> bool:
    """Whether the start of a control line (no newline yet) can still become a known operation, as
    nats-server's state machine sees it: a wrong letter fails at once, not at the line's end."""
    head = partial[:8].upper()
    for op in _OPS:
        if len(head) <= len(op):
            if op.startswith(head):
                return True
        elif head.startswith(op) and head[len(op)] in b" \t\r":
            return True
    return False


def server_id() -> str:
    """A public server nkey's shape: `N` and 55 base32 characters."""
    return "N" + base64.b32encode(secrets.token_bytes(35)).decode()[:55]


def nonce() -> str:
    """11 random bytes, base64 RawURL: the 15 characters a client signs (server/nkey.go)."""
    return base64.urlsafe_b64encode(secrets.token_bytes(11)).decode().rstrip("=")


def info_line(info: dict[str, Any]) -> bytes:
    return b"INFO " + orjson.dumps(info) + b" \r\n"


# -- headers ------------------------------------------------------------------------------------


def encode_headers(headers: dict[str, list[str]] | None, status: bytes = b"") -> bytes:
    """A header block; `status` like b"404 No Messages" goes on the first line."""
    parts = [HEADER_LINE + (b" " + status if status else b"") + b"\r\n"]
    for name, values in (headers or {}).items():
        key = name.encode()
        for value in values:
            parts.append(key + b": " + value.encode() + b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def decode_headers(block: bytes) -> tuple[str | None, dict[str, list[str]] | None]:
    """(status line remainder or None, headers or None) of a header block; the status is never a header.

    Raises ValueError when the block does not start with `NATS/1.0`."""
    text = block.decode("utf-8", "surrogateescape")
    lines = text.split("\r\n")
    first = lines[0]
    if not first.startswith("NATS/1.0"):
        raise ValueError("header block must start with NATS/1.0")
    status = first[8:].strip() or None
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            continue
        headers.setdefault(name.strip(), []).append(value.strip())
    return status, headers or None


def status_headers(code: int, description: str = "", extra: dict[str, str] | None = None) -> bytes:
    """A status message's header block, e.g. `NATS/1.0 408 Request Timeout\\r\\nNats-Pending-...`."""
    line = f"NATS/1.0 {code}" + (f" {description}" if description else "") + "\r\n"
    for name, value in (extra or {}).items():
        line += f"{name}: {value}\r\n"
    return (line + "\r\n").encode()


def pending_status(code: int, description: str, messages: int, nbytes: int) -> bytes:
    """408/409 statuses that tell a pull what was left of its batch (`Nats-Pending-*`)."""
    return status_headers(code, description, {"Nats-Pending-Messages": str(messages), "Nats-Pending-Bytes": str(nbytes)})


NO_MESSAGES = status_headers(404, "No Messages")
CONSUMER_DELETED = status_headers(409, "Consumer Deleted")
PUSH_BASED = status_headers(409, "Consumer is push based")
EXCEEDED_MAX_WAITING = status_headers(409, "Exceeded MaxWaiting")
FLOW_CONTROL_REQUEST = status_headers(100, "FlowControl Request")


def idle_heartbeat(last_consumer: int, last_stream: int, stalled: str | None = None) -> bytes:
    extra = {"Nats-Last-Consumer": str(last_consumer), "Nats-Last-Stream": str(last_stream)}
    if stalled:
        extra["Nats-Consumer-Stalled"] = stalled
    return status_headers(100, "Idle Heartbeat", extra)


def no_responders(subject: str) -> bytes:
    return b"NATS/1.0 503\r\nNats-Subject: " + subject.encode() + b"\r\n\r\n"
