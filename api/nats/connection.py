"""One client connection: its lifecycle, its CONNECT, its subscriptions and what it publishes.

An `asyncio.Protocol` built in layers, one concept each, all on the one object (the hot path —
a read's parse, a publish, a delivery — stays plain method calls on it): the outbound buffer and the
slow-consumer checks (api/nats/outbound.py), the protocol parser above it (api/nats/parser.py), and
this class above both, which gives the parsed operations their meaning: CONNECT and authentication
(its options read by api/nats/connect.py), SUB/UNSUB and the MSGs delivered on them, a PUB's
permission check and routing into the account's space, and the keep-alive PINGs. The listener above
it is seen through the narrow `Door` Protocol, and the rooms below see a connection as
subscriptions.py's `Client`. Counterpart: server/client.go.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from typing import TYPE_CHECKING, Any, Protocol

from api.auth import Authenticator, AuthError, Principal
from api.nats import protocol as p
from api.nats.connect import log_in, read_connect
from api.nats.parser import Listener, Parser, Pending, as_text, parse_size
from api.nats.subscriptions import Subscription
from engine.subjects import is_valid_publish_subject, is_valid_subject

if TYPE_CHECKING:
    from api.nats.account import AccountSpace

log = logging.getLogger(__name__)

PING_INTERVAL = 120.0
MAX_PINGS_OUT = 2
AUTH_TIMEOUT = 2.0


class Door(Listener, Protocol):
    """What a connection needs of the listener that accepted it (api/nats/server.py's NatsServer)."""

    auth: Authenticator

    def info_for(self, conn: Connection) -> dict[str, Any]: ...

    def register(self, conn: Connection) -> bool: ...

    def unregister(self, conn: Connection) -> None: ...

    def pinged(self, conn: Connection) -> None: ...

    def after_read(self, conn: Connection) -> None: ...

    def space(self, name: str) -> AccountSpace | None: ...

    def global_space(self) -> AccountSpace: ...


class Connection(Parser):
    """A client of the NATS door."""

    server: Door

    def __init__(self, server: Door, cid: int) -> None:
        super().__init__()
        self.server = server
        self.cid = cid
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
        self._pings_out = 0
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

    def _on_ping(self) -> None:
        """PONG once the publishes this client sent before the PING are stored: a client's flush then
        means what it published is in the stream (nats-server's in-memory ingest queue drains in
        microseconds; a write that waits for a stream's lock here can take a flush's length)."""
        space = self.space
        if space is None or not space.after_writes(self, self._pong):
            self._pong()

    def _pong(self) -> None:
        if not self.closed:
            self.send(p.PONG)
            self.server.pinged(self)

    def _on_pong(self) -> None:
        self._pings_out = 0

    def pause_reading(self) -> None:
        """Stops reading the socket: the client's JetStream writes queue faster than the engine takes them."""
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # -- publishing ---------------------------------------------------------------------------

    def _on_message(self, pending: Pending, body: bytes) -> None:
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
            if self._may_publish(as_text(subject_b)):
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

    # -- subscriptions ------------------------------------------------------------------------

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
        subject = as_text(subject_b)
        queue = as_text(queue_b) if queue_b is not None else None
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
        maximum = parse_size(parts[2]) if len(parts) == 3 else 0
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

    # -- CONNECT ------------------------------------------------------------------------------

    def _peer_ip(self) -> str | None:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        return str(peer[0]) if peer else None

    def _connect(self, text: bytes) -> None:
        options = read_connect(text)
        if options is None:
            self.close()
            return
        if isinstance(options, str):
            self.close_with_error(options)
            return
        try:
            principal = log_in(self.server.auth, options, self.nonce, self._peer_ip())
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
        self.verbose = options.verbose
        self.pedantic = options.pedantic
        self.echo = options.echo
        self.headers = options.headers
        self.no_responders = options.no_responders
        self.name = options.name
        self.connected = True
        self.protocol = options.protocol
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
