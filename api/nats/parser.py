"""A connection's inbound side: the client protocol's parser.

`data_received` parses every complete operation of a read in one loop with at most one copy per
payload; a large payload arriving in pieces is gathered in a bytearray, a partial line is kept for the
next read. A well-formed PUB whose payload is already here skips the general dispatch (the hot path
of a publisher), and so does a run of plain acks. Errors close the connection where nats-server's
parser closes it, with its texts. What each operation means (CONNECT, SUB, a message, PING) is the
connection's (api/nats/connection.py), reached through the hooks below; answers go out through the
outbound side (api/nats/outbound.py) at the read's end. Counterpart: server/parser.go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from api.nats import protocol as p
from api.nats.outbound import Counters, Outbound

if TYPE_CHECKING:
    from api.auth import Principal

Pending = tuple[bytes, str, bytes | None, int, int]  # a PUB/HPUB's (subject, its text, reply, header size or -1, total size)


class Listener(Counters, Protocol):
    """What the parser needs of the listener (api/nats/connection.py's Door)."""

    max_payload: int

    def after_read(self, conn: Any) -> None: ...  # the whole connection, which this layer does not name


class Parser(Outbound):
    """Operations out of the bytes read; the connection above implements the hooks they call."""

    server: Listener
    principal: Principal | None  # None until CONNECT authenticates: only CONNECT is taken then
    headers: bool  # HPUB is taken only from a client that said it takes headers

    def __init__(self) -> None:
        super().__init__()
        self._buf = b""
        self._payload: Pending | None = None
        self._acc: bytearray | None = None

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._acc is not None:  # a large payload arriving in pieces: gathered without re-copying
            self._acc += data
            assert self._payload is not None
            if len(self._acc) < self._payload[4] + 2:
                return
            data, self._acc = bytes(self._acc), None
        elif self._buf:
            data = self._buf + data
            self._buf = b""
        self._flush_scheduled = True  # what this read answers (PubAcks, gets) is written at its end, below
        try:
            self._parse(data)
        finally:
            self.server.after_read(self)
            self._flush()

    def _parse(self, data: bytes) -> None:
        pos, end = 0, len(data)
        while pos < end and not self.closed:
            pending = self._payload
            if pending is not None:
                total = pending[4]
                stop = pos + total
                if stop + 2 > end:
                    if stop < end and data[stop] != 13:  # the byte after the payload must start its CRLF
                        self.close_with_error(p.UNKNOWN_OP)
                        return
                    self._keep(data, pos, total)
                    return
                if data[stop : stop + 2] != b"\r\n":
                    self.close_with_error(p.UNKNOWN_OP)
                    return
                self._payload = None
                self._on_message(pending, data[pos:stop])
                pos = stop + 2
                continue
            nl = data.find(b"\n", pos)
            if nl < 0:
                self._keep_line(data, pos)
                return
            if nl - pos > p.MAX_CONTROL_LINE:
                self.close_with_error(p.MAX_CONTROL_LINE_TEXT)
                return
            line = data[pos : nl - 1] if nl > pos and data[nl - 1] == 13 else data[pos:nl]
            pos = nl + 1
            if line[:4] == b"PUB " and self.principal is not None:
                # The hot path: a well-formed PUB whose payload is already here, without the general
                # dispatch; anything unusual goes the general way and gets its answer there.
                parts = line.split()
                size_b = parts[-1]
                if 3 <= len(parts) <= 4 and size_b.isdigit() and len(size_b) < 9:
                    stop = pos + int(size_b)
                    if stop + 2 <= end and data[stop : stop + 2] == b"\r\n" and stop - pos <= self.server.max_payload:
                        subject_b = parts[1]
                        if len(parts) == 3 and subject_b[:8] == b"$JS.ACK.":
                            after = self._plain_acks(subject_b, data[pos:stop], data, stop + 2)
                            if after >= 0:
                                pos = after
                                continue
                        pending = (subject_b, subject_b.decode("utf-8", "surrogateescape"), parts[2] if len(parts) == 4 else None, -1, stop - pos)
                        self._on_message(pending, data[pos:stop])
                        pos = stop + 2
                        continue
            self._operation(line)

    def _keep(self, data: bytes, pos: int, total: int) -> None:
        rest = data[pos:]
        if total > 65536:
            self._acc = bytearray(rest)
        else:
            self._buf = rest

    def _keep_line(self, data: bytes, pos: int) -> None:
        rest = data[pos:]
        if not p.could_be_op(rest):
            self.close_with_error(p.UNKNOWN_OP)
        elif len(rest) > p.MAX_CONTROL_LINE:
            self.close_with_error(p.MAX_CONTROL_LINE_TEXT)
        else:
            self._buf = rest

    def _operation(self, line: bytes) -> None:
        parts = line.split()
        if not parts:
            self.close_with_error(p.UNKNOWN_OP)
            return
        op = parts[0].upper()
        if self.principal is None and op != b"CONNECT":
            self.close_with_error(p.AUTH_VIOLATION)
            return
        if op == b"PUB":
            self._pub(parts)
        elif op == b"HPUB":
            self._hpub(parts)
        elif op == b"PING":
            self._on_ping()
        elif op == b"PONG":
            self._on_pong()
        elif op == b"SUB":
            self._sub(parts)
        elif op == b"UNSUB":
            self._unsub(parts)
        elif op == b"CONNECT":
            self._connect(line[len(parts[0]) :].strip())
        elif op in (b"INFO", b"+OK"):
            pass
        elif op == b"-ERR":
            self.close()
        else:
            self.close_with_error(p.UNKNOWN_OP)

    def _args_missing(self, parts: list[bytes]) -> bool:
        if len(parts) == 1:  # `PUB\r\n`: the parser wanted a space after the operation
            self.close_with_error(p.UNKNOWN_OP)
            return True
        return False

    def _pub(self, parts: list[bytes]) -> None:
        if self._args_missing(parts):
            return
        if len(parts) == 3:
            subject, reply, size_text = parts[1], None, parts[2]
        elif len(parts) == 4:
            subject, reply, size_text = parts[1], parts[2], parts[3]
        else:
            self.close()
            return
        size = parse_size(size_text)
        if size < 0:
            self.close()
            return
        if size > self.server.max_payload:
            self.close_with_error(p.MAX_PAYLOAD)
            return
        self._payload = (subject, as_text(subject), reply, -1, size)

    def _hpub(self, parts: list[bytes]) -> None:
        if self._args_missing(parts):
            return
        if len(parts) == 4:
            subject, reply, hdr_text, size_text = parts[1], None, parts[2], parts[3]
        elif len(parts) == 5:
            subject, reply, hdr_text, size_text = parts[1], parts[2], parts[3], parts[4]
        else:
            self.close()
            return
        hdr, size = parse_size(hdr_text), parse_size(size_text)
        if not self.headers or hdr < 0 or size < 0 or hdr > size:
            self.close()
            return
        if size > self.server.max_payload:
            self.close_with_error(p.MAX_PAYLOAD)
            return
        self._payload = (subject, as_text(subject), reply, hdr, size)

    # -- the hooks: what the operations mean is the connection's ------------------------------------

    def _on_message(self, pending: Pending, body: bytes) -> None:
        """A PUB or HPUB with its whole payload (headers and body)."""
        raise NotImplementedError

    def _plain_acks(self, subject_b: bytes, body: bytes, data: bytes, after: int) -> int:
        """A reply-less PUB to `$JS.ACK.…`, taken with the plain acks after it in `data`: where the
        parsing resumes, or -1 to have it go the general way (`_on_message`)."""
        raise NotImplementedError

    def _on_ping(self) -> None:
        raise NotImplementedError

    def _on_pong(self) -> None:
        raise NotImplementedError

    def _sub(self, parts: list[bytes]) -> None:
        raise NotImplementedError

    def _unsub(self, parts: list[bytes]) -> None:
        raise NotImplementedError

    def _connect(self, text: bytes) -> None:
        """CONNECT's JSON (the line after the operation)."""
        raise NotImplementedError


def parse_size(text: bytes) -> int:
    """A non-negative decimal byte count, or -1 (nats-server's parseSize)."""
    if not text.isdigit() or len(text) > 12:
        return -1
    return int(text)


def as_text(raw: bytes) -> str:
    """A subject or queue name as the engine takes it; bytes that are not UTF-8 survive the round trip."""
    return raw.decode("utf-8", "surrogateescape")
