"""The NATS door: a listener on the gateway's event loop, core publish/subscribe, and JetStream over it.

Connections are accepted on the same loop as the HTTP door (uvloop under uvicorn) and share its
engine and its pull waiters. A publish goes to every matching subscriber (one member per queue
group), to the JetStream API when it is `$JS.…`, and to the stream that captures its subject, if
any, as in nats-server; a request nobody answered gets the 503 no-responders status when the client
asked for it. Counterpart: server/server.go (accept loop, INFO) and server/client.go
(processInboundClientMsg, deliverMsg).
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from typing import TYPE_CHECKING, Any

from api.auth import Authenticator
from api.nats import protocol as p
from api.nats.connection import Connection
from api.nats.jsapi import JetStreamApi
from api.nats.subscriptions import Sublist, Subscription
from api.nats.writes import Writes
from engine.accounts.config import GLOBAL_ACCOUNT
from engine.subjects import is_valid_publish_subject

if TYPE_CHECKING:
    from api.gate import Gate
    from engine.accounts.registry import Accounts

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 65536


class NatsServer:
    """The NATS client protocol over one engine: start it on a running loop, stop it before the engine closes."""

    def __init__(
        self,
        accounts: Accounts,
        host: str = "127.0.0.1",
        port: int = 4222,
        auth: Authenticator | None = None,
        max_payload: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        account: str = GLOBAL_ACCOUNT,
    ) -> None:
        self.accounts = accounts
        self.account = account  # the one account this door serves (see Connection._connect)
        found = accounts.get(account)
        if found is None:
            raise ValueError(f"no account {account!r} for the NATS door")
        self.engine = found.jetstream()
        self.host = host
        self.port = port
        self.auth = auth or Authenticator()
        self.max_payload = max_payload or self.engine.options.max_payload
        self.max_connections = max_connections
        self.sublist = Sublist()
        self.connections: dict[int, Connection] = {}
        self.server_id = p.server_id()
        self.slow_consumers = 0
        self._next_cid = 0
        self._server: asyncio.AbstractServer | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.writes = Writes(self)
        self.js = JetStreamApi(self)
        self._info: dict[str, Any] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, gate: Gate) -> None:
        """Listens, sharing the gate's pull waiters of the door's account (bound to this loop)."""
        self.loop = asyncio.get_running_loop()
        account = self.accounts.get(self.account)
        assert account is not None
        self.js.start(gate.waiters_of(account))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(1024)
        sock.setblocking(False)
        self._server = await self.loop.create_server(self._accept, sock=sock)
        self.port = sock.getsockname()[1]
        self._info = {
            "server_id": self.server_id,
            "server_name": self.server_id,
            "version": p.VERSION,
            "proto": p.PROTO,
            "go": "jetlake",
            "host": self.host,
            "port": self.port,
            "headers": True,
            "max_payload": self.max_payload,
            "jetstream": True,
        }
        if self.auth.required:
            self._info["auth_required"] = True
        log.info("NATS clients on nats://%s:%d (JetStream API on $JS.API.>)", self.host, self.port)

    async def stop(self) -> None:
        """Stops accepting, ends deliveries and closes every connection (queued bytes are sent)."""
        if self._server is not None:
            self._server.close()
        await self.js.stop()
        for conn in list(self.connections.values()):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accept(self) -> Connection:
        self._next_cid += 1
        return Connection(self, self._next_cid)

    def info_for(self, conn: Connection) -> dict[str, Any]:
        info = dict(self._info, client_id=conn.cid)
        peer = conn.transport.get_extra_info("peername") if conn.transport else None
        if peer:
            info["client_ip"] = peer[0]
        if getattr(self.auth, "nonce_required", False):
            conn.nonce = p.nonce()
            info["nonce"] = conn.nonce
        return info

    def register(self, conn: Connection) -> bool:
        if len(self.connections) >= self.max_connections:
            return False
        self.connections[conn.cid] = conn
        return True

    def unregister(self, conn: Connection) -> None:
        self.connections.pop(conn.cid, None)
        for sub in conn.subs.values():
            self.sublist.remove(sub)
        conn.subs.clear()
        self.writes.forget(conn)

    def pinged(self, conn: Connection) -> None:
        """After the first PONG of a connected client, nats-server sends INFO with `connect_info`."""
        if conn.connected and not conn.info_confirmed and conn.protocol >= 1:
            conn.info_confirmed = True
            info = self.info_for(conn) | {"connect_info": True, "remote_account": conn.principal.account if conn.principal else ""}
            info.pop("nonce", None)
            conn.send(p.info_line(info))

    # -- interest -----------------------------------------------------------------------------

    def subscribe(self, sub: Subscription) -> None:
        self.sublist.insert(sub)
        self.js.interest_changed(sub.subject)

    def unsubscribe(self, sub: Subscription) -> None:
        self.sublist.remove(sub)

    # -- routing ------------------------------------------------------------------------------

    def publish(self, origin: Connection, subject_b: bytes, subject: str, reply: bytes | None, hdr: bytes | None, payload: bytes) -> None:
        """A client's PUB/HPUB: subscribers, the JetStream API, the capturing stream; else no responders."""
        once = subject.startswith("$JS.ACK.")  # every ack subject is used once: not worth a cache entry
        delivered = self.route(origin, subject_b, subject, reply, hdr, payload, cache=not once)
        if subject.startswith("$JS."):
            delivered = self.js.handle(origin, subject, reply, hdr, payload) or delivered
        elif is_valid_publish_subject(subject) and self.engine.stream_for_subject(subject) is not None:
            self.writes.publish(origin, subject, reply, hdr, payload)
            delivered = True
        if not delivered and reply and origin.no_responders:
            self.no_responders(origin, subject, reply)

    def route(
        self, origin: Connection | None, subject_b: bytes, subject: str, reply: bytes | None, hdr: bytes | None,
        payload: bytes, cache: bool = True,
    ) -> bool:
        match = self.sublist.match(subject, cache)
        if not match:
            return False
        delivered = False
        skip = origin if origin is not None and not origin.echo else None
        for sub in match.plain:
            if sub.conn is not skip:
                sub.conn.deliver(sub, subject_b, reply, hdr, payload)
                delivered = True
        for group in match.groups:
            members = group if skip is None else [s for s in group if s.conn is not skip]
            if members:
                sub = members[random.randrange(len(members))] if len(members) > 1 else members[0]
                sub.conn.deliver(sub, subject_b, reply, hdr, payload)
                delivered = True
        return delivered

    def send(self, subject: str, payload: bytes, hdr: bytes | None = None, reply: str | None = None) -> bool:
        """A message from the server itself (API answers, PubAcks, advisories); False if nobody listens."""
        return self.route(None, subject.encode(), subject, reply.encode() if reply else None, hdr, payload)

    def reply(self, reply: bytes | None, payload: bytes, hdr: bytes | None = None) -> None:
        """An answer to a request's reply subject (kept as the client's bytes: no re-encoding)."""
        if reply:
            self.route(None, reply, reply.decode("utf-8", "surrogateescape"), None, hdr, payload)

    def no_responders(self, origin: Connection, subject: str, reply: bytes) -> None:
        """The 503 status to the publisher's own subscription on the reply subject (none: nothing)."""
        reply_text = reply.decode("utf-8", "surrogateescape")
        for sub in self.sublist.match(reply_text).plain + tuple(s for g in self.sublist.match(reply_text).groups for s in g):
            if sub.conn is origin:
                origin.deliver(sub, reply, None, p.no_responders(subject), b"")
                return

    def after_read(self, conn: Connection) -> None:
        self.writes.submit(conn)

