"""Message gets: `STREAM.MSG.GET`'s lookups and `DIRECT.GET`, answered with the stored message itself.

A direct get is served only on a stream with `allow_direct` (else nobody listens: the 503 status);
its answer is the message with its stored headers plus `Nats-Stream`, `Nats-Subject`,
`Nats-Sequence` and `Nats-Time-Stamp` (none with `no_hdr`); a batch ends with `204 EOB`; a bad
request is a `408` and a missing message a `404 Message Not Found` status.
Counterpart: server/stream.go (processDirectGetRequest, processDirectGetLastBySubjectRequest).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from api.nats import protocol as p
from engine import JetStreamError, errors
from engine.info import parse_rfc3339, rfc3339
from engine.store.base import StoredMessage

if TYPE_CHECKING:
    from api.nats.subscriptions import Router
    from engine import JetStream
    from engine.stream import Stream


class DirectGets:
    def __init__(self, server: Router, engine: JetStream) -> None:
        self.server = server
        self.engine = engine

    def direct_get(self, tokens: list[str], reply: bytes | None, payload: bytes) -> bool:
        """`DIRECT.GET.<stream>` with a JSON request, or `DIRECT.GET.<stream>.<subject>` (last on it)."""
        try:
            stream = self.engine.stream(tokens[2])
        except JetStreamError:
            return False
        if not stream.config.allow_direct:
            return False
        if not reply:
            return True
        if len(tokens) > 3 and not payload.strip():
            return self._last_by_subject(stream, ".".join(tokens[3:]), reply)
        if len(tokens) > 3:
            req: dict[str, Any] = {"last_by_subj": ".".join(tokens[3:])}
            if payload.strip():
                extra = loads_or_none(payload)
                if not isinstance(extra, dict) or set(extra) - {"no_hdr", "max_bytes"}:
                    self.server.reply(reply, b"", p.status_headers(408, "Bad Request"))
                    return True
                req |= extra
        else:
            if not payload.strip():
                self.server.reply(reply, b"", p.status_headers(408, "Empty Request"))
                return True
            req = loads_or_none(payload)
            if not isinstance(req, dict):
                self.server.reply(reply, b"", p.status_headers(408, "Malformed Request"))
                return True
        try:
            msgs = direct_lookup(stream, req)
        except JetStreamError as exc:
            self.server.reply(reply, b"", _failed_status(exc))
            return True
        batch = len(msgs) > 1 or "batch" in req
        for i, msg in enumerate(msgs):
            if req.get("no_hdr"):
                self.server.reply(reply, msg.data)
                continue
            position = (len(msgs) - i - 1, msgs[i - 1].seq if i else 0) if batch else None
            self.server.reply(reply, msg.data, direct_headers(stream.name, msg, position))
        if batch:
            last = msgs[-1].seq if msgs else 0
            self.server.reply(reply, b"", p.status_headers(204, "EOB", {"Nats-Num-Pending": "0", "Nats-Last-Sequence": str(last)}))
        return True


    def _last_by_subject(self, stream: Stream, subject: str, reply: bytes) -> bool:
        """`DIRECT.GET.<stream>.<subject>` without a body (a KV get): the last message on the subject, with
        the answers `lookup` gives that request, without building the request."""
        if not subject:
            self.server.reply(reply, b"", p.status_headers(408, "Bad Request"))
            return True
        try:
            msg = stream.last_by_subject(subject)
        except JetStreamError as exc:
            self.server.reply(reply, b"", _failed_status(exc))
            return True
        self.server.reply(reply, msg.data, direct_headers(stream.name, msg, None))
        return True


def _failed_status(exc: JetStreamError) -> bytes:
    """A direct get that found nothing (`404 Message Not Found`) or could not be asked (`408 Bad Request`)."""
    return p.status_headers(404, "Message Not Found") if exc.code == 404 else p.status_headers(408, "Bad Request")


_ADDED = frozenset({"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending", "Nats-Last-Sequence"})


def direct_headers(stream: str, msg: StoredMessage, position: tuple[int, int] | None) -> bytes:
    """The stored headers, then where the message comes from (and, in a batch, `position`: how many
    follow and the previous sequence), as one header block formatted at once: a KV get's hot path."""
    stored = msg.headers
    if stored and not _ADDED.isdisjoint(stored):  # a stored header of the same name takes the new value in place
        headers = dict(stored) | {"Nats-Stream": [stream], "Nats-Subject": [msg.subject], "Nats-Sequence": [str(msg.seq)],
                                  "Nats-Time-Stamp": [rfc3339(msg.ts)]}
        if position is not None:
            headers |= {"Nats-Num-Pending": [str(position[0])], "Nats-Last-Sequence": [str(position[1])]}
        return p.encode_headers(headers)
    if not stored and position is None:  # a KV get's message: the whole block in one format
        return b"%b\r\nNats-Stream: %b\r\nNats-Subject: %b\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %b\r\n\r\n" % (
            p.HEADER_LINE, stream.encode(), msg.subject.encode(), msg.seq, rfc3339(msg.ts).encode())
    block = p.encode_headers(stored)[:-2] if stored else p.HEADER_LINE + b"\r\n"
    block += b"Nats-Stream: %b\r\nNats-Subject: %b\r\nNats-Sequence: %d\r\nNats-Time-Stamp: %b\r\n" % (
        stream.encode(), msg.subject.encode(), msg.seq, rfc3339(msg.ts).encode())
    if position is not None:
        block += b"Nats-Num-Pending: %d\r\nNats-Last-Sequence: %d\r\n" % position
    return block + b"\r\n"


def loads_or_none(payload: bytes) -> Any:
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None


def is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def lookup(stream: Stream, req: dict[str, Any]) -> StoredMessage:
    """STREAM.MSG.GET's forms: by sequence, last on a subject, next on a subject from a sequence."""
    seq = req.get("seq", 0)
    if not is_count(seq):
        raise errors.bad_request()
    if req.get("last_by_subj"):
        if seq or req.get("next_by_subj"):
            raise errors.bad_request()
        return stream.last_by_subject(req["last_by_subj"])
    if req.get("start_time"):
        return stream.at_or_after_time(parse_rfc3339(req["start_time"]), req.get("next_by_subj") or None)
    if req.get("next_by_subj"):
        return stream.next_by_subject(req["next_by_subj"], seq)
    if seq:
        return stream.get(seq)
    raise errors.bad_request()


def direct_lookup(stream: Stream, req: dict[str, Any]) -> list[StoredMessage]:
    """DIRECT.GET: one message as MSG.GET finds it, or with `batch` up to that many from it on."""
    first = lookup(stream, req)
    batch = req.get("batch", 0)
    if not is_count(batch) or batch <= 1:
        return [first]
    subject = req.get("next_by_subj") or ">"
    msgs = [first]
    while len(msgs) < batch:
        try:
            msgs.append(stream.next_by_subject(subject, msgs[-1].seq + 1))
        except JetStreamError:
            break
    return msgs
