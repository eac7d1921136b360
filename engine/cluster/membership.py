"""Cluster membership: each gateway announces itself with a heartbeat object in the warehouse.

A member's record (`_cluster/members/<hash of id>.json`: id, advertised HTTP and NATS addresses,
expiry) is written only by that member, with a plain `put` every third of its TTL; a member whose
record expired is gone (killed, partitioned, stopped). Readers list the folder: the object store is
the only shared medium, as for leases (engine/store/leases.py), so no gossip protocol and no extra
port. A clean stop deletes the record so the others re-spread its streams at once.
Counterpart: nats-server's route gossip and `$SYS` server pings (server/route.go, events.go);
here the heartbeat replaces both.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass

from engine.clock import Clock, SystemClock
from engine.store.objectstore import ObjectNotFoundError, ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

MEMBERS_PREFIX = "_cluster/members"
DEFAULT_MEMBER_TTL_NS = 6_000_000_000


@dataclass(frozen=True)
class Member:
    """A gateway as it announces itself: where clients and other gateways reach it."""

    id: str
    http: str  # "http://127.0.0.1:8222", what other gateways forward to
    nats: str = ""  # "nats://127.0.0.1:4222", empty without a NATS door
    expires_ns: int = 0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def member_key(member_id: str) -> str:
    """The member's heartbeat key; ids hold characters a key should not (`|`, host names)."""
    return f"{MEMBERS_PREFIX}/{hashlib.sha256(member_id.encode()).hexdigest()[:32]}.json"


class Membership:
    """This gateway's heartbeat and its view of the live members.

    Args:
        store: the warehouse's object store (shared by every gateway).
        me: this gateway's record (its `expires_ns` is set on each heartbeat).
        ttl_ns: how long a heartbeat counts; a member silent for longer is dead.
        clock: the wall clock written into and compared with `expires_ns`.
    """

    def __init__(self, store: ObjectStore, me: Member, ttl_ns: int = DEFAULT_MEMBER_TTL_NS,
                 clock: Clock | None = None) -> None:
        self.store = store
        self.me = me
        self.ttl_ns = ttl_ns
        self.clock: Clock = clock or SystemClock()

    @property
    def interval(self) -> float:
        """Seconds between heartbeats: two can be missed before the record expires."""
        return self.ttl_ns / 3e9

    def heartbeat(self) -> None:
        """Writes this member's record with a fresh expiry. Raises ObjectStoreError."""
        record = Member(self.me.id, self.me.http, self.me.nats, self.clock.now_ns() + self.ttl_ns)
        self.store.put(member_key(self.me.id), json.dumps(record.to_json(), sort_keys=True).encode())

    def leave(self) -> None:
        """Removes this member's record (a clean stop); a failure leaves it to expire."""
        try:
            self.store.delete(member_key(self.me.id))
        except ObjectStoreError as exc:
            log.warning("membership record of %s not removed (it expires): %s", self.me.id, exc)

    def members(self) -> list[Member]:
        """The live members (unexpired records), by id. Raises ObjectStoreError when the store cannot be listed."""
        now = self.clock.now_ns()
        found: list[Member] = []
        for meta in self.store.list(MEMBERS_PREFIX):
            try:
                member = Member(**json.loads(self.store.get(meta.key).data))
            except ObjectNotFoundError:
                continue  # left meanwhile
            except (ValueError, TypeError) as exc:
                log.warning("membership record %s unreadable (%s); ignored", meta.key, exc)
                continue
            if member.expires_ns > now:
                found.append(member)
        return sorted(found, key=lambda m: m.id)
