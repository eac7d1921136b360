"""One client connection: the protocol parser, the connection's subscriptions and its outbound buffer.

An `asyncio.Protocol`, not streams: `data_received` parses every complete operation of a read in
one loop with at most one copy per payload, and what the connection sends in one loop iteration is
written with one `write` (the first send schedules the flush; what answers a read is written at
the read's end, as nats-server flushes its clients after each read). The outbound buffer is bounded: past
`MAX_PENDING` bytes, or with the socket not drained for `WRITE_DEADLINE` seconds, the client is a
slow consumer and is closed, as nats-server closes it (no -ERR). Errors close the connection where
nats-server's parser closes it, with its texts. The listener above it is seen through the narrow
`Door` Protocol, and the rooms below see a connection as subscriptions.py's `Client`.
Counterpart: server/client.go and server/parser.go.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from api.auth import Authenticator, AuthError, Principal
from api.nats import protocol as p
from api.nats.subscriptions import Subscription
from engine.subjects import is_valid_publish_subject, is_valid_subject

if TYPE_CHECKING:
    from api.nats.account import AccountSpace

log = logging.getLogger(__name__)

PING_INTERVAL = 120.0
MAX_PINGS_OUT = 2
AUTH_TIMEOUT = 2.0
WRITE_DEADLINE = 10.0
_CREDENTIALS = ("user", "pass", "auth_token", "nkey", "jwt", "sig")
_DEFAULTS = {"verbose": True, "pedantic": True, "echo": True, "headers": False, "no_responders": False}


class Door(Protocol):
    """What a connection needs of the listener that accepted it (api/nats/server.py's NatsServer)."""

    auth: Authenticator
    max_payload: int
    slow_consumers: int

    def info_for(self, conn: Connection) -> dict[str, Any]: ...

    def register(self, conn: Connection) -> bool: ...

    def unregister(self, conn: Connection) -> None: ...

    def pinged(self, conn: Connection) -> None: ...

    def after_read(self, conn: Connection) -> None: ...

    def space(self, name: str) -> AccountSpace | None: ...

    def global_space(self) -> AccountSpace: ...


class Connection(asyncio.Protocol):
    """A client of the NATS door."""

    def __init__(self, server: Door, cid: int) -> None:
        self.server = server
        self.cid = cid
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.subs: dict[bytes, Subscription] = {}
        # Without authentication every client is the anonymous principal from the start, as in nats-server.
        self.principal: Principal | None = None if server.auth.required else server.auth.authenticate()
        self.space: AccountSpace | None = None if self.principal is None else server.global_space()
        self.verbose = True
        self.pedantic = True
        self.echo = True
        self.headers = False
        self.no_responders = False
        self.connected = False
        self.protocol = 0
        self.info_confirmed = False  # the INFO with `connect_info` that follows the first PONG was sent
        self.name = ""
        self._buf = b""
        self._payload: tuple[bytes, str, bytes | None, int, int] | None = None  # (subject, str, reply, hdr, total)
        self._acc: bytearray | None = None
        self._out: list[bytes] = []
        self._out_size = 0
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop  # the one that accepted it (connection_made)
        self._pings_out = 0
        self._paused_at = 0.0
        self._timers: list[asyncio.TimerHandle] = []
        self._publish_cache: dict[str, bool] = {}
        self.nonce: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._loop = asyncio.get_running_loop()
        self.transport = transport  # type: ignore[assignment] # uvloop's transports are not asyncio.Transport subclasses
        transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        _no_delay(transport)
        info = self.server.info_for(self)
        if not self.server.register(self):
            transport.write(p.info_line(info) + p.err(p.MAX_CONNECTIONS))
            self.close()
            return
        transport.write(p.info_line(info))
        loop = self._loop
        if self.server.auth.required:
            self._timers.append(loop.call_later(AUTH_TIMEOUT, self._auth_timeout))
        self._timers.append(loop.call_later(PING_INTERVAL, self._ping_timer))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        self.server.unregister(self)
        self._out.clear()

    def close(self) -> None:
        """Sends what is queued, then closes."""
        if self.closed:
            return
        self._flush()
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def close_with_error(self, text: str) -> None:
        self.send(p.err(text))
        self.close()

    def abort(self) -> None:
        """Closes at once, dropping what is queued (a slow consumer)."""
        if self.closed:
            return
        self.closed = True
        self._out.clear()
        if self.transport is not None:
            self.transport.abort()

    def _auth_timeout(self) -> None:
        if not self.connected and not self.closed:
            self.close_with_error(p.AUTH_TIMEOUT)

    def _ping_timer(self) -> None:
        if self.closed:
            return
        if self._pings_out >= MAX_PINGS_OUT:
            self.close_with_error(p.STALE)
            return
        self._pings_out += 1
        self.send(p.PING)
        self._timers = [t for t in self._timers if not t.cancelled()]
        self._timers.append(asyncio.get_running_loop().call_later(PING_INTERVAL, self._ping_timer))

    # -- outbound -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Queues bytes for this loop iteration's write; a client that does not read is dropped."""
        if self.closed:
            return
        self._out.append(data)
        self._out_size += len(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        if self._out_size > p.MAX_PENDING:
            self._slow_consumer()

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out or self.transport is None or self.closed:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out = []
        self._out_size = 0
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > p.MAX_PENDING:
            self._slow_consumer()

    def pause_writing(self) -> None:
        self._paused_at = time.monotonic()
        self._timers.append(asyncio.get_running_loop().call_later(WRITE_DEADLINE, self._check_stalled))

    def resume_writing(self) -> None:
        self._paused_at = 0.0

    def _check_stalled(self) -> None:
        if self._paused_at and time.monotonic() - self._paused_at >= WRITE_DEADLINE:
            self._slow_consumer()

    def _slow_consumer(self) -> None:
        log.warning("slow consumer: closing client %d (%s)", self.cid, self.name or "unnamed")
        self.server.slow_consumers += 1
        self.abort()

    def pause_reading(self) -> None:
        """Stops reading the socket: the client's JetStream writes queue faster than the engine takes them."""
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    @property
    def writable(self) -> bool:
        """Whether the kernel takes our bytes: deliveries that can wait (push, pulls) hold back when not."""
        return not self._paused_at and not self.closed

    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr: bytes | None, payload: bytes) -> None:
        """A MSG (or HMSG, if the client takes headers) on `sub`; stops a subscription at its max."""
        if hdr is not None and self.headers:
            size = len(hdr)
            if reply:
                self.send(b"HMSG %b %b %b %d %d\r\n%b%b\r\n" % (subject, sub.sid, reply, size, size + len(payload), hdr, payload))
            else:
                self.send(b"HMSG %b %b %d %d\r\n%b%b\r\n" % (subject, sub.sid, size, size + len(payload), hdr, payload))
        elif reply:  # each message is formatted in one piece: no intermediate copies of the payload
            self.send(b"MSG %b %b %b %d\r\n%b\r\n" % (subject, sub.sid, reply, len(payload), payload))
        else:
            self.send(b"MSG %b %b %d\r\n%b\r\n" % (subject, sub.sid, len(payload), payload))
        sub.delivered += 1
        if sub.max and sub.delivered >= sub.max:
            self._unsubscribe(sub)

    # -- inbound ------------------------------------------------------------------------------

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
            self.send(p.PONG)
            self.server.pinged(self)
        elif op == b"PONG":
            self._pings_out = 0
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
        size = _size(size_text)
        if size < 0:
            self.close()
            return
        if size > self.server.max_payload:
            self.close_with_error(p.MAX_PAYLOAD)
            return
        self._payload = (subject, _text(subject), reply, -1, size)

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
        hdr, size = _size(hdr_text), _size(size_text)
        if not self.headers or hdr < 0 or size < 0 or hdr > size:
            self.close()
            return
        if size > self.server.max_payload:
            self.close_with_error(p.MAX_PAYLOAD)
            return
        self._payload = (subject, _text(subject), reply, hdr, size)

    def _on_message(self, pending: tuple[bytes, str, bytes | None, int, int], body: bytes) -> None:
        subject_b, subject, reply, hdr_size, _ = pending
        if self.verbose:
            self.send(p.OK)
        if self.pedantic and not is_valid_publish_subject(subject):
            self.send(p.err(p.INVALID_PUBLISH_SUBJECT))  # still routed, as nats-server does
        if not self._may_publish(subject):
            return
        space = self.space
        assert space is not None  # set with the principal
        if hdr_size >= 0:
            space.publish(self, subject_b, subject, reply, body[:hdr_size], body[hdr_size:])
        else:
            space.publish(self, subject_b, subject, reply, None, body)

    def _plain_acks(self, subject_b: bytes, body: bytes, data: bytes, after: int) -> int:
        """A client's plain ack (`+ACK`, no reply) without the general publish, and the plain acks of the
        same consumer right after it in `data`; where the parsing resumes, or -1 if not taken here.

        Only where the general way would do nothing more: no `+OK` (verbose), no subject check
        (pedantic), no subscriber of the ack subject. The permission check is the general way's
        (`_may_publish`, once per ack): a refused ack gets its -ERR and changes nothing. For a user
        without permissions the acks that follow are matched whole (`PlainAckOf.run`) and taken on
        the first one's grounds: with no other operation between them, none of those grounds changes."""
        if self.verbose or self.pedantic:
            return -1
        space = self.space
        assert space is not None  # set with the principal
        ack = space.plain_ack_of(subject_b, body)
        if ack is None:
            return -1
        principal = self.principal
        if principal is not None and principal.permissions is not None:
            if self._may_publish(_text(subject_b)):
                space.plain_acks(self, ack.stream, ack.consumer, [ack.seq])
            return after
        seqs = [ack.seq]
        match = ack.run.match
        found = match(data, after)
        while found is not None:
            end = found.end()
            if end - after > p.MAX_CONTROL_LINE:  # the general way refuses so long a line
                break
            seqs.append(int(found[1]))
            after = end
            found = match(data, after)
        space.plain_acks(self, ack.stream, ack.consumer, seqs)
        return after

    def _may_publish(self, subject: str) -> bool:
        principal = self.principal
        if principal is None or principal.permissions is None:
            return True
        allowed = self._publish_cache.get(subject)
        if allowed is None:
            allowed = principal.can_publish(subject)
            if len(self._publish_cache) > 1024:
                self._publish_cache.clear()
            self._publish_cache[subject] = allowed
        if not allowed:
            self.send(p.err(f'Permissions Violation for Publish to "{subject}"'))
        return allowed

    def _sub(self, parts: list[bytes]) -> None:
        if self._args_missing(parts):
            return
        if len(parts) == 3:
            subject_b, queue_b, sid = parts[1], None, parts[2]
        elif len(parts) == 4:
            subject_b, queue_b, sid = parts[1], parts[2], parts[3]
        else:
            self.close()
            return
        subject = _text(subject_b)
        queue = _text(queue_b) if queue_b is not None else None
        if not is_valid_subject(subject):
            self.send(p.err(p.INVALID_SUBJECT))
            return
        principal = self.principal
        if principal is not None and principal.permissions is not None and not principal.can_subscribe(subject, queue):
            using = f' using queue "{queue}"' if queue else ""
            self.send(p.err(f'Permissions Violation for Subscription to "{subject}"{using}'))
            return
        if self.verbose:
            self.send(p.OK)
        if sid in self.subs:
            return
        sub = Subscription(self, subject, queue, sid)
        self.subs[sid] = sub
        assert self.space is not None
        self.space.subscribe(sub)

    def _unsub(self, parts: list[bytes]) -> None:
        if self._args_missing(parts):
            return
        if len(parts) not in (2, 3):
            self.close()
            return
        maximum = _size(parts[2]) if len(parts) == 3 else 0
        if maximum < 0:
            self.close()
            return
        if self.verbose:
            self.send(p.OK)
        sub = self.subs.get(parts[1])
        if sub is None:
            return
        if maximum and sub.delivered < maximum:
            sub.max = maximum
        else:
            self._unsubscribe(sub)

    def _unsubscribe(self, sub: Subscription) -> None:
        if self.subs.pop(sub.sid, None) is not None and self.space is not None:
            self.space.unsubscribe(sub)

    def _peer_ip(self) -> str | None:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if peer else None

    def _connect(self, text: bytes) -> None:
        try:
            given = orjson.loads(text)
        except orjson.JSONDecodeError:
            self.close()
            return
        if not isinstance(given, dict):
            self.close()
            return
        opts: dict[str, Any] = {**_DEFAULTS, **given}
        if opts.get("protocol", 0) not in (0, 1):
            self.close_with_error(p.INVALID_PROTOCOL)
            return
        if opts["no_responders"] and not opts["headers"]:
            self.close_with_error(p.NO_RESPONDERS_NEEDS_HEADERS)
            return
        if "account" in opts or "new_account" in opts:
            self.close_with_error(p.AUTH_VIOLATION)
            return
        given_credentials = {key: opts.get(key) for key in _CREDENTIALS}
        try:
            if any(v is not None and not isinstance(v, str) for v in given_credentials.values()):
                raise AuthError("a credential that is not a string")
            principal = self.server.auth.authenticate(
                user=given_credentials["user"], password=given_credentials["pass"], token=given_credentials["auth_token"],
                nkey=given_credentials["nkey"], jwt=given_credentials["jwt"], signature=given_credentials["sig"],
                nonce=self.nonce, connection_type="STANDARD", client_ip=self._peer_ip(),
            )
        except AuthError as exc:
            self.principal = None
            if str(exc) != p.AUTH_VIOLATION:
                log.info("NATS client %d refused: %s", self.cid, exc)
            self.close_with_error(p.AUTH_VIOLATION)
            return
        space = self.server.space(principal.account)
        if space is None or (self.space is not None and self.space is not space and self.subs):
            # its account left the config in a reload, or a second CONNECT names another account
            # while subscriptions of the first are live
            self.principal = None
            self.close_with_error(p.AUTH_VIOLATION)
            return
        self.principal, self.space = principal, space
        if principal.expires:  # client.go: a user JWT's `exp` closes the connection when it comes
            delay = max(principal.expires - time.time(), 0.0)
            self._timers.append(asyncio.get_running_loop().call_later(delay, self.close_with_error, p.AUTH_EXPIRED))
        self._publish_cache.clear()
        self.verbose = bool(opts["verbose"])
        self.pedantic = bool(opts["pedantic"])
        self.echo = bool(opts["echo"])
        self.headers = bool(opts["headers"])
        self.no_responders = bool(opts["no_responders"])
        self.name = str(opts.get("name") or "")
        self.connected = True
        self.protocol = int(opts.get("protocol", 0))
        if self.verbose:
            self.send(p.OK)


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """No Nagle on the socket, as nats-server's (Go sets TCP_NODELAY on every TCP connection): a reply
    (a PubAck, a KV get's message) goes out in the write that answers its read, not after the client's
    delayed ack of the bytes before it. uvloop and asyncio set it too; it is set here so that the door
    does not depend on that."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _size(text: bytes) -> int:
    """A non-negative decimal byte count, or -1 (nats-server's parseSize)."""
    if not text.isdigit() or len(text) > 12:
        return -1
    return int(text)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")
