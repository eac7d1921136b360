"""A user's publish and subscribe permissions, checked exactly as nats-server checks them.

`publish` and `subscribe` each have an allow list and a deny list of subjects with wildcards. The
subject being checked is read token by token *literally*: a pattern's `*` matches any one token and
its `>` any rest, while a `*` or `>` inside the checked subject is just a token (so an allow of
`foo.*` admits a subscription to `foo.>`, nats-server's quirk, and a placeholder token `*` in a
checked subject stands for "any name" that only a wildcard grant covers).

Publish (client.go `pubAllowedFullCheck`): no lists allow everything; an allow list, even an empty
one, must match; then a deny match refuses: deny wins. Results are cached per subject, as
nats-server's per-client cache. Subscribe (client.go `canSubscribeInternal`): a non-empty allow
list must match; a subscription with a queue group is allowed by a queue grant only for that queue
(`"subject queue"` entries); a deny match refuses (a queue deny only that queue). Delivery of a
message to a wildcard or queue subscription is checked against the deny list (`checkDenySub`).
`allow_responses` (ResponsePermission) lets a user answer requests it received (max replies within
expires); the NATS door tracks replies with `Replies`. Counterpart: server/client.go and the
permission parts of server/opts.go.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.subjects import FWC, PWC, is_subset_match, is_valid_subject

DEFAULT_RESPONSE_MAX = 1
DEFAULT_RESPONSE_EXPIRES = 120.0  # seconds, nats-server's DEFAULT_ALLOW_RESPONSE_EXPIRATION
MAX_CACHE = 1024  # nats-server's maxPermCacheSize is 128; HTTP routes name more subjects per user


def pattern_matches(pattern: str, subject: str) -> bool:
    """nats-server's sublist match of one entry: the subject's tokens taken literally."""
    if pattern == FWC or pattern == subject:
        return True
    pt, st = pattern.split("."), subject.split(".")
    for i, p in enumerate(pt):
        if p == FWC:
            return len(st) > i
        if i >= len(st):
            return False
        if p != PWC and p != st[i]:
            return False
    return len(pt) == len(st)


@dataclass(frozen=True)
class SubjectRule:
    """One list entry: a subject pattern and, for subscribe entries, an optional queue group."""

    subject: str
    queue: str | None = None

    @classmethod
    def parse(cls, text: str, allow_queue: bool) -> SubjectRule:
        """`"subject"` or, where queues are allowed, `"subject queue"`; ValueError names what is wrong."""
        if is_valid_subject(text):
            return cls(text)
        parts = text.split()
        if not allow_queue or len(parts) != 2:
            raise ValueError(f"subject {text!r} is not a valid subject")
        if not is_valid_subject(parts[0]):
            raise ValueError(f"subject {parts[0]!r} is not a valid subject")
        if not is_valid_subject(parts[1]):
            raise ValueError(f"queue {parts[1]!r} is not a valid queue")
        return cls(parts[0], parts[1])


@dataclass(frozen=True)
class SubjectPermission:
    """`{allow, deny}`; None is "no list", which is not the same as an empty allow list."""

    allow: tuple[SubjectRule, ...] | None = None
    deny: tuple[SubjectRule, ...] | None = None


@dataclass(frozen=True)
class ResponsePermission:
    """`allow_responses`: up to `max_msgs` replies (negative: unlimited) within `expires` seconds
    (negative: forever) to each request the user received."""

    max_msgs: int = DEFAULT_RESPONSE_MAX
    expires: float = DEFAULT_RESPONSE_EXPIRES


@dataclass(eq=False)
class Permissions:
    """A user's permissions, with nats-server's publish cache. Immutable once made, but for its cache."""

    publish: SubjectPermission | None = None
    subscribe: SubjectPermission | None = None
    response: ResponsePermission | None = None
    _pub_cache: dict[str, bool] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.response is not None:
            # nats-server: allow_responses without a publish allow list turns the blanket allow off.
            if self.publish is None:
                self.publish = SubjectPermission(allow=())
            elif self.publish.allow is None:
                self.publish = SubjectPermission(allow=(), deny=self.publish.deny)

    def can_publish(self, subject: str) -> bool:
        """Whether a publish to `subject` is allowed by the lists (replies tracked apart: `Replies`)."""
        found = self._pub_cache.get(subject)
        if found is not None:
            return found
        allowed = self._publish_allowed(subject)
        with self._lock:
            if len(self._pub_cache) >= MAX_CACHE:
                self._pub_cache.clear()
            self._pub_cache[subject] = allowed
        return allowed

    def _publish_allowed(self, subject: str) -> bool:
        pub = self.publish
        if pub is None:
            return True
        if pub.allow is not None and not any(pattern_matches(r.subject, subject) for r in pub.allow):
            return False
        return not (pub.deny and any(pattern_matches(r.subject, subject) for r in pub.deny))

    def can_subscribe(self, subject: str, queue: str | None = None) -> bool:
        sub = self.subscribe
        if sub is None:
            return True
        allowed = True
        if sub.allow:
            plain, queues = _matches(sub.allow, subject)
            allowed = bool(plain)
            if queue and queues:
                allowed = _queue_matches(queue, queues)
        if allowed and sub.deny:
            plain, queues = _matches(sub.deny, subject)
            allowed = not plain
            if allowed and queue and queues:
                allowed = not _queue_matches(queue, queues)
        return allowed

    def can_receive(self, subject: str, queue: str | None = None) -> bool:
        """Delivery-time filter of a wildcard or queue subscription that overlaps a deny entry."""
        sub = self.subscribe
        if sub is None or not sub.deny:
            return True
        plain, queues = _matches(sub.deny, subject)
        return not plain and not (queue and queues and _queue_matches(queue, queues))


def _matches(rules: Iterable[SubjectRule], subject: str) -> tuple[list[SubjectRule], list[SubjectRule]]:
    plain, queues = [], []
    for rule in rules:
        if pattern_matches(rule.subject, subject):
            (queues if rule.queue else plain).append(rule)
    return plain, queues


def _queue_matches(queue: str, rules: list[SubjectRule]) -> bool:
    """nats-server's queueMatches: the literal queue name, or a wildcard queue covering it."""
    for rule in rules:
        name = rule.queue or ""
        if queue == name or ((PWC in name.split(".") or FWC in name.split(".")) and is_subset_match(queue, name)):
            return True
    return False


class Replies:
    """The replies a connection may still publish under `allow_responses` (client.go `replies`)."""

    def __init__(self, permission: ResponsePermission) -> None:
        self.permission = permission
        self._open: dict[str, tuple[int, float]] = {}

    def delivered(self, reply_subject: str) -> None:
        """A request carrying this reply subject was delivered to the connection."""
        self._open[reply_subject] = (0, time.monotonic())

    def allow(self, subject: str) -> bool:
        """Whether a publish to `subject` answers an open request; counts the answer."""
        entry = self._open.get(subject)
        if entry is None:
            return False
        count, since = entry[0] + 1, entry[1]
        p = self.permission
        if (p.max_msgs > 0 and count > p.max_msgs) or (p.expires > 0 and time.monotonic() - since > p.expires):
            del self._open[subject]
            return False
        self._open[subject] = (count, since)
        return True
