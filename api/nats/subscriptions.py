"""Core NATS interest: subscriptions and the sublist that matches a subject to them.

Literal subscriptions (inboxes, deliver subjects: most of them) sit in a dict; wildcard ones in a
token trie. A match result — the plain subscribers and the queue groups — is cached per literal
subject, and a change of interest drops only the cached subjects it can affect, so a publish to a
hot subject is one dict lookup. Reply subjects are each used once: while every wildcard
subscription is of the `<literal>.*` kind (the clients' reply inboxes), they are matched by their
prefix in a dict instead of a walk of the trie. The subscriptions that may match an ack subject
(`$JS.ACK.…`) are counted, so that the acks' fast path knows without a match that nobody listens.

The two sides a subscription joins are Protocols here, so that the rooms below a connection and an
account (deliveries, writes, the JetStream API) never name the classes above them: a `Client`
receives (api/nats/connection.py's Connection), a `Router` is an account's subject space sending as
the server (api/nats/account.py's AccountSpace). Counterpart: server/sublist.go.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from engine.subjects import FWC, PWC, is_literal, match_tokens

if TYPE_CHECKING:
    from api.auth import Principal

CACHE_SIZE = 4096
FORGET_WHOLE = 256


class Client(Protocol):
    """What the rooms below a connection need of it: its options, its subscriptions, its outbound side."""

    cid: int
    closed: bool
    principal: Principal | None  # who logged in (a system-account user may send the system requests)
    echo: bool
    headers: bool
    no_responders: bool
    subs: dict[bytes, Subscription]

    @property
    def writable(self) -> bool: ...

    def send(self, data: bytes) -> None: ...

    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr: bytes | None, payload: bytes) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Router(Protocol):
    """An account's subject space as the JetStream rooms see it: who listens, and sending as the server."""

    name: str  # the account's
    sublist: Sublist
    loop: asyncio.AbstractEventLoop

    def send(self, subject: str, payload: bytes, hdr: bytes | None = None, reply: str | None = None) -> bool: ...

    def reply(self, reply: bytes | None, payload: bytes, hdr: bytes | None = None) -> None: ...


class Subscription:
    """One SUB of one connection; `max` is UNSUB's auto-unsubscribe count (0: none)."""

    __slots__ = ("conn", "subject", "queue", "sid", "max", "delivered", "alone")

    def __init__(self, conn: Client, subject: str, queue: str | None, sid: bytes) -> None:
        self.conn = conn
        self.subject = subject
        self.queue = queue
        self.sid = sid
        self.max = 0
        self.delivered = 0
        self.alone = Match((self,), ())  # the match of a subject only this subscription wants


@dataclass(slots=True)
class Match:
    """Who receives a message on one subject: every plain subscriber, one member of each queue group."""

    plain: tuple[Subscription, ...] = ()
    groups: tuple[tuple[Subscription, ...], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.plain or self.groups)


@dataclass(slots=True)
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    subs: list[Subscription] = field(default_factory=list)


EMPTY = Match()  # every empty answer of `Sublist.match` is this one: `is EMPTY` tests it without a call


class Sublist:
    def __init__(self) -> None:
        self._literal: dict[str, list[Subscription]] = {}
        self._root = _Node()
        self._wildcards = 0
        self._tails: dict[str, list[Subscription]] = {}  # `<literal prefix>.*` subscriptions by prefix
        self._tail_count = 0
        self._cache: dict[str, Match] = {}
        self.count = 0
        self.ack_interest = 0  # subscriptions that may match a `$JS.ACK.…` subject

    def insert(self, sub: Subscription) -> None:
        self.count += 1
        if _may_match_acks(sub.subject):
            self.ack_interest += 1
        if is_literal(sub.subject):
            self._literal.setdefault(sub.subject, []).append(sub)
            self._cache.pop(sub.subject, None)
            return
        node = self._root
        for token in sub.subject.split("."):
            node = node.children.setdefault(token, _Node())
        node.subs.append(sub)
        self._wildcards += 1
        prefix = _tail_prefix(sub.subject)
        if prefix is not None:
            self._tails.setdefault(prefix, []).append(sub)
            self._tail_count += 1
        self._forget_matching(sub.subject)

    def remove(self, sub: Subscription) -> None:
        if is_literal(sub.subject):
            subs = self._literal.get(sub.subject)
            if subs is None or sub not in subs:
                return
            subs.remove(sub)
            if not subs:
                del self._literal[sub.subject]
            self._cache.pop(sub.subject, None)
            self._removed(sub)
            return
        path = [self._root]
        for token in sub.subject.split("."):
            child = path[-1].children.get(token)
            if child is None:
                return
            path.append(child)
        if sub not in path[-1].subs:
            return
        path[-1].subs.remove(sub)
        self._removed(sub)
        self._wildcards -= 1
        prefix = _tail_prefix(sub.subject)
        if prefix is not None:
            tails = self._tails[prefix]
            tails.remove(sub)
            if not tails:
                del self._tails[prefix]
            self._tail_count -= 1
        tokens = sub.subject.split(".")
        for depth in range(len(tokens), 0, -1):  # prune empty branches
            node = path[depth]
            if node.subs or node.children:
                break
            del path[depth - 1].children[tokens[depth - 1]]
        self._forget_matching(sub.subject)

    def _removed(self, sub: Subscription) -> None:
        self.count -= 1
        if _may_match_acks(sub.subject):
            self.ack_interest -= 1

    def _forget_matching(self, pattern: str) -> None:
        """Drops the cached matches a wildcard interest changes; past FORGET_WHOLE entries the cache
        goes whole (testing thousands of cached subjects cost a wildcard SUB milliseconds)."""
        if len(self._cache) > FORGET_WHOLE:
            self._cache.clear()
            return
        tokens = pattern.split(".")
        for subject in [s for s in self._cache if match_tokens(tokens, s.split("."))]:
            del self._cache[subject]

    def match(self, subject: str, cache: bool = True) -> Match:
        found = self._cache.get(subject)
        if found is not None:
            return found
        literal = self._literal.get(subject)
        subs = list(literal) if literal else []
        if self._wildcards == self._tail_count:
            tails = self._tails.get(subject.rpartition(".")[0]) if self._wildcards else None
            if tails:
                subs.extend(tails)
        else:
            _collect(self._root, subject.split("."), 0, subs)
        if not literal and len(subs) == 1 and subs[0].queue is None:
            # One wildcard subscriber (a reply inbox `_INBOX.<id>.*`, an ack subject's monitor): such
            # subjects are mostly used once, so they are answered without filling the cache.
            return subs[0].alone
        found = _group(subs) if subs else EMPTY
        if not cache:
            return found
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        self._cache[subject] = found
        return found

    def has_interest(self, subject: str) -> bool:
        return bool(self.match(subject))


def _may_match_acks(pattern: str) -> bool:
    """Whether a subscription may receive some `$JS.ACK.…` publish (its first two tokens allow it);
    ack subjects have 9 tokens or more, so a two-token `$JS.ACK` never does."""
    first, _, rest = pattern.partition(".")
    if first == FWC:
        return True
    if first not in ("$JS", PWC) or not rest:
        return False
    second, dot, _ = rest.partition(".")
    return second == FWC or (second in ("ACK", PWC) and bool(dot))


def _tail_prefix(pattern: str) -> str | None:
    """`a.b` of `a.b.*` (only the last token a wildcard); None for any other pattern."""
    prefix, dot, last = pattern.rpartition(".")
    return prefix if dot and last == PWC and prefix and is_literal(prefix) else None


def _collect(node: _Node, tokens: list[str], i: int, out: list[Subscription]) -> None:
    if i == len(tokens):
        out.extend(node.subs)
        return
    fwc = node.children.get(FWC)
    if fwc is not None:
        out.extend(fwc.subs)
    token = tokens[i]
    if token != PWC and token != FWC:  # a published `*` or `>` is a literal token that only wildcards match
        child = node.children.get(token)
        if child is not None:
            _collect(child, tokens, i + 1, out)
    pwc = node.children.get(PWC)
    if pwc is not None:
        _collect(pwc, tokens, i + 1, out)


def _group(subs: list[Subscription]) -> Match:
    plain = tuple(s for s in subs if s.queue is None)
    queues: dict[str, list[Subscription]] = {}
    for s in subs:
        if s.queue is not None:
            queues.setdefault(s.queue, []).append(s)
    return Match(plain, tuple(tuple(members) for members in queues.values()))
