"""Rendezvous (highest-random-weight) hashing: which live gateway should own a stream.

Every gateway computes the same answer from the same list of members, with no coordination: the
owner of a key is the member whose hash of (member, key) is highest. When a member joins, it takes
only the keys it now wins (about 1/n of them); when one leaves, only its keys move, each to the
member that was second for it. Counterpart: none in nats-server (its meta-leader places streams on
peers by Raft); this is the placement of the object-store streamers that have no consensus layer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def weight(member: str, key: str) -> int:
    """The member's weight for the key: 64 bits of a keyed hash, stable across processes and versions."""
    digest = hashlib.blake2b(key.encode(), digest_size=8, key=member.encode()[:64]).digest()
    return int.from_bytes(digest, "big")


def owner_of(key: str, members: Iterable[str]) -> str | None:
    """The member that should own `key`; None when there is no member. Ties go to the larger id."""
    return max(members, key=lambda m: (weight(m, key), m), default=None)


def assign(keys: Iterable[str], members: Iterable[str]) -> dict[str, str]:
    """Each key's owner among `members` (empty when there are none)."""
    live = sorted(set(members))
    if not live:
        return {}
    return {key: owner_of(key, live) or "" for key in keys}
