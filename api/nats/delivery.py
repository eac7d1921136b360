"""How a consumer's delivery travels: the message's own subject, its `$JS.ACK` reply, its headers.

A delivered message keeps the subject it was stored under; its reply subject is the v1 ack subject
`$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<ts ns>.<pending>`, from which
clients read the sequences and the pending count (a KV watch ends its initial values at pending 0).
It goes to whoever subscribes to the pull's inbox or the push consumer's deliver subject, one member
of each queue group. Counterpart: server/consumer.go (deliverMsg, ackReply).
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from api.nats import protocol as p
from engine.consumer import Delivery

if TYPE_CHECKING:
    from api.nats.subscriptions import Match, Router, Subscription


def ack_prefix(stream: str, consumer: str) -> bytes:
    return f"$JS.ACK.{stream}.{consumer}.".encode()


def frames(
    deliveries: list[Delivery], prefix: bytes, headers_only: bool, extra: dict[str, list[str]] | None = None
) -> list[tuple[bytes, bytes, bytes | None, bytes]]:
    """(subject, ack reply, header block or None, payload) per delivery; `extra` headers (a pin id) on each."""
    out = []
    for d in deliveries:
        msg = d.msg
        reply = prefix + b"%d.%d.%d.%d.%d" % (d.num_delivered, msg.seq, d.consumer_seq, msg.ts, d.num_pending)
        if headers_only:
            headers = dict(msg.headers or {})
            headers["Nats-Msg-Size"] = [str(len(msg.data))]
            out.append((msg.subject.encode(), reply, p.encode_headers(headers | (extra or {})), b""))
        else:
            stored = msg.headers if not extra else (msg.headers or {}) | extra
            hdr = p.encode_headers(stored) if stored else None
            out.append((msg.subject.encode(), reply, hdr, msg.data))
    return out


def receivers(match: Match) -> list[Subscription]:
    """Every plain subscriber and one member of each queue group."""
    subs = list(match.plain)
    for group in match.groups:
        subs.append(group[random.randrange(len(group))] if len(group) > 1 else group[0])
    return subs


def send_frames(server: Router, target: str, framed: list[tuple[bytes, bytes, bytes | None, bytes]]) -> bool:
    """Sends deliveries to the subscribers of `target`; False if nobody subscribes to it.

    The usual case — one subscriber without a delivery limit (a pull's inbox, a push consumer's
    deliver subject) — is written as one chunk for the whole batch."""
    match = server.sublist.match(target)
    if not match:
        return False
    if len(match.plain) == 1 and not match.groups and not match.plain[0].max:
        sub = match.plain[0]
        sub.conn.send(b"".join(_messages(framed, sub.sid, sub.conn.headers)))
        sub.delivered += len(framed)
        return True
    for subject, reply, hdr, payload in framed:
        for sub in receivers(match):
            sub.conn.deliver(sub, subject, reply, hdr, payload)
    return True


def send_deliveries(
    server: Router, target: str, deliveries: list[Delivery], prefix: bytes, headers_only: bool,
    extra: dict[str, list[str]] | None = None,
) -> bool:
    """`send_frames(server, target, frames(...))` in one pass for a pull's usual case — one subscriber
    without a delivery limit, whole messages — with the same bytes; False if nobody subscribes."""
    match = server.sublist.match(target)
    if not match:
        return False
    if headers_only or match.groups or len(match.plain) != 1 or match.plain[0].max:
        return send_frames(server, target, frames(deliveries, prefix, headers_only, extra))
    sub = match.plain[0]
    sid, takes_headers = sub.sid, sub.conn.headers
    parts: list[bytes] = []
    add = parts.append
    heads: dict[str, bytes] = {}  # `MSG <subject> <sid> <ack prefix>` per subject: a batch has few
    for d in deliveries:
        msg = d.msg
        stored = msg.headers if not extra else (msg.headers or {}) | extra
        if not stored:
            head = heads.get(msg.subject)
            if head is None:
                head = heads[msg.subject] = b"MSG %b %b %b" % (msg.subject.encode(), sid, prefix)
            add(b"%b%d.%d.%d.%d.%d %d\r\n" % (
                head, d.num_delivered, msg.seq, d.consumer_seq, msg.ts, d.num_pending, len(msg.data)))
        elif takes_headers:
            hdr = p.encode_headers(stored)
            size = len(hdr)
            add(b"HMSG %b %b %b%d.%d.%d.%d.%d %d %d\r\n" % (
                msg.subject.encode(), sid, prefix, d.num_delivered, msg.seq, d.consumer_seq, msg.ts, d.num_pending,
                size, size + len(msg.data)))
            add(hdr)
        else:
            add(b"MSG %b %b %b%d.%d.%d.%d.%d %d\r\n" % (
                msg.subject.encode(), sid, prefix, d.num_delivered, msg.seq, d.consumer_seq, msg.ts, d.num_pending,
                len(msg.data)))
        add(msg.data)
        add(b"\r\n")
    sub.conn.send(b"".join(parts))
    sub.delivered += len(deliveries)
    return True


def _messages(framed: list[tuple[bytes, bytes, bytes | None, bytes]], sid: bytes, headers: bool) -> list[bytes]:
    """MSG/HMSG lines and bodies of a batch, as Connection.deliver writes them one by one."""
    parts: list[bytes] = []
    add = parts.append
    for subject, reply, hdr, payload in framed:
        if hdr is not None and headers:
            size = len(hdr)
            add(b"HMSG %b %b %b %d %d\r\n" % (subject, sid, reply, size, size + len(payload)))
            add(hdr)
        else:
            add(b"MSG %b %b %b %d\r\n" % (subject, sid, reply, len(payload)))
        add(payload)
        add(b"\r\n")
    return parts


def send_status(server: Router, target: str, hdr: bytes, reply: str | None = None) -> bool:
    """A header-only status message (`404 No Messages`, `100 Idle Heartbeat`, ...) to `target`."""
    return server.send(target, b"", hdr, reply)
