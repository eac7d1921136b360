"""One account as the NATS door sees it: its own subject space, its engine and its JetStream API.

nats-server gives every account its own sublist: a subject published in one account reaches only
subscribers of that account, and `$JS.API.>` there is that account's JetStream. An `AccountSpace`
is that: the subscriptions of the account's connections, the account's engine (engine/accounts/
registry.py opens one per account with JetStream), and the JetStream API, pulls, pushes, acks and
writes bound to that engine. A publish goes to every matching subscriber of the account (one member
per queue group), to the JetStream API when it is `$JS.…` (to the operator's requests of api/nats/
system.py when a system-account user sends them), and to the account's stream that captures
its subject, if any; a request nobody answered gets the 503 no-responders status when the client
asked for it. An account without JetStream has core NATS only; its JetStream API requests are
answered with 10039 (JetStream not enabled for account), as nats-server answers them.
Counterpart: server/accounts.go (Account's `sl`), server/client.go (processInboundClientMsg,
deliverMsg) and server/jetstream_api.go (the not-enabled answers).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from api.nats import protocol as p
from api.nats import system
from api.nats.acks import PlainAckOf
from api.nats.errors import error_body
from api.nats.jsapi import API, TYPE, JetStreamApi, response_kind
from api.nats.subscriptions import EMPTY, Client, Sublist, Subscription
from engine.accounts.limits import not_enabled
from engine.subjects import is_valid_publish_subject

if TYPE_CHECKING:
    from api.nats.system import SystemRequests
    from api.waiters import Waiters
    from engine import JetStream


class AccountSpace:
    """The subjects, subscriptions and JetStream of one account (see the module docstring); the
    `Router` its JetStream API sends through, and what a connection's `Client` side is routed by."""

    def __init__(self, name: str, engine: JetStream | None, loop: asyncio.AbstractEventLoop, system_requests: SystemRequests) -> None:
        self.name = name
        self.engine = engine
        self.loop = loop
        self.system = system_requests  # the gateway's, answered here for a system-account user's publish
        self.sublist = Sublist()
        self.js = JetStreamApi(self, engine) if engine is not None else None
        self.writes = self.js.writes if self.js is not None else None

    def start(self, waiters: Waiters) -> None:
        if self.js is not None:
            self.js.start(waiters)

    async def stop(self) -> None:
        if self.js is not None:
            await self.js.stop()

    # -- interest -----------------------------------------------------------------------------

    def subscribe(self, sub: Subscription) -> None:
        self.sublist.insert(sub)
        if self.js is not None:
            self.js.interest_changed(sub.subject)

    def unsubscribe(self, sub: Subscription) -> None:
        self.sublist.remove(sub)

    def forget(self, conn: Client) -> None:
        """A closed connection: its subscriptions and queued writes leave the account."""
        for sub in conn.subs.values():
            self.sublist.remove(sub)
        conn.subs.clear()
        if self.writes is not None:
            self.writes.forget(conn)

    def after_read(self, conn: Client) -> None:
        if self.writes is not None:
            self.writes.submit(conn)

    def after_writes(self, conn: Client, callback: Callable[[], None]) -> bool:
        """`callback` once the JetStream writes `conn` sent so far are stored (api/nats/writes.py); False
        when none is waiting."""
        return self.writes is not None and self.writes.after_writes(conn, callback)

    # -- routing ------------------------------------------------------------------------------

    def publish(self, origin: Client, subject_b: bytes, subject: str, reply: bytes | None, hdr: bytes | None, payload: bytes) -> None:
        """A client's PUB/HPUB: subscribers, the JetStream API, the capturing stream; else no responders."""
        once = subject.startswith("$JS.ACK.")  # every ack subject is used once: not worth a cache entry
        delivered = self.route(origin, subject_b, subject, reply, hdr, payload, cache=not once)
        if subject[:1] == "$" and origin.principal is not None and origin.principal.system and system.handles(subject):
            delivered = self.system.handle(self, subject, reply, payload) or delivered
        elif subject.startswith("$JS."):
            if self.js is not None:
                delivered = self.js.handle(origin, subject, reply, hdr, payload) or delivered
            elif subject.startswith(API):
                delivered = self._not_enabled(subject[len(API) :].split("."), reply) or delivered
        elif self.engine is not None and is_valid_publish_subject(subject) and self.engine.stream_name_for_subject(subject) is not None:
            assert self.writes is not None
            self.writes.publish(origin, subject, reply, hdr, payload)
            delivered = True
        if not delivered and reply and origin.no_responders:
            self.no_responders(origin, subject, reply)

    def plain_ack_of(self, subject_b: bytes, payload: bytes) -> PlainAckOf | None:
        """The consumer and stream sequence of a reply-less plain ack that only JetStream hears (no
        subscription may match `$JS.ACK.…`); None: the message goes through `publish`."""
        if self.js is None or self.sublist.ack_interest:
            return None
        return self.js.acks.plain_of(subject_b, payload)

    def plain_acks(self, origin: Client, stream: str, consumer: str, seqs: list[int]) -> None:
        """Applies what `plain_ack_of` found, in order with the client's other writes."""
        assert self.writes is not None  # there is JetStream: plain_ack_of found the consumer
        self.writes.plain_acks(origin, stream, consumer, seqs)

    def _not_enabled(self, tokens: list[str], reply: bytes | None) -> bool:
        """An account without JetStream: API requests get 10039 in their response type, as
        nats-server's; pulls and direct gets have no responders, unknown requests no answer."""
        if tokens[:3] == ["CONSUMER", "MSG", "NEXT"] or tokens[:2] == ["DIRECT", "GET"]:
            return False
        kind = response_kind(tokens)
        if kind is not None and reply:
            self.reply(reply, orjson.dumps({"type": TYPE + kind, **error_body(kind, not_enabled())}))
        return True

    def route(
        self, origin: Client | None, subject_b: bytes, subject: str, reply: bytes | None, hdr: bytes | None,
        payload: bytes, cache: bool = True,
    ) -> bool:
        match = self.sublist.match(subject, cache)
        if match is EMPTY:
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

    def no_responders(self, origin: Client, subject: str, reply: bytes) -> None:
        """The 503 status to the publisher's own subscription on the reply subject (none: nothing)."""
        match = self.sublist.match(reply.decode("utf-8", "surrogateescape"))
        for sub in match.plain + tuple(s for g in match.groups for s in g):
            if sub.conn is origin:
                origin.deliver(sub, reply, None, p.no_responders(subject), b"")
                return
