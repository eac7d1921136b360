"""Where a stream is served: here, at another gateway's address, or (for now) nowhere reachable.

The HTTP door asks this before serving a request (api/http/forwarding.py). A stream this gateway
holds the lease of is served here; a stream whose lease another live member holds is served at
that member's advertised address; a held lease whose holder stopped heartbeating (killed, its lease
not yet expired) has no reachable owner ("", the door retries and then answers 503); a stream
nobody holds goes to its rendezvous owner, which claims it on its next round (or at once, when that
is this gateway). Answers about other gateways are cached for `cache_ns`, so a busy stream costs
one store read a second, not one per request.
Streams are named across accounts as `<account>/<stream>` (a stream name has no `/`): the key of
rendezvous hashing and of ownership.
Counterpart: a NATS client's view of the stream leader through `$JS.API.STREAM.INFO` (cluster.leader).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import orjson

from engine.clock import Clock, SystemClock
from engine.cluster.membership import Member, Membership
from engine.cluster.ownership import Ownership
from engine.cluster.rendezvous import owner_of
from engine.store.layout import Layout
from engine.store.objectstore import ObjectNotFoundError
from engine.subjects import subject_matches

DEFAULT_CACHE_NS = 1_000_000_000
MISS_REFRESH_NS = 50_000_000


def stream_ref(account: str, stream: str) -> str:
    """The cluster-wide name of an account's stream."""
    return f"{account}/{stream}"


def split_ref(ref: str) -> tuple[str, str]:
    account, _, stream = ref.partition("/")
    return account, stream


def lease_key_of(layout_of: Callable[[str], Layout]) -> Callable[[str], str]:
    """The lease key of a stream ref, for `Ownership`."""
    def lease_key(ref: str) -> str:
        account, stream = split_ref(ref)
        return layout_of(account).stream_lease_key(stream)

    return lease_key


class ClusterLocator:
    """Answers `owner_url` and `stream_for_subject` from the leases, heartbeats and stream configs."""

    def __init__(self, membership: Membership, ownership: Ownership, layout_of: Callable[[str], Layout],
                 cache_ns: int = DEFAULT_CACHE_NS, clock: Clock | None = None) -> None:
        self.membership = membership
        self.ownership = ownership
        self.layout_of = layout_of
        self.cache_ns = cache_ns
        self.clock: Clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._members: tuple[int, dict[str, Member]] = (0, {})
        self._owners: dict[str, tuple[int, str | None]] = {}
        self._subjects: dict[str, tuple[int, list[tuple[str, list[str]]]]] = {}

    def owner_url(self, account: str, stream: str) -> str | None:
        """None: served here; "": its owner is not reachable now; else the owner's HTTP base URL."""
        ref = stream_ref(account, stream)
        if ref in self.ownership.held:
            return None
        now = self.clock.now_ns()
        with self._lock:
            cached = self._owners.get(ref)
        if cached is not None and now - cached[0] < self.cache_ns:
            return cached[1]
        answer = self._locate(ref)
        with self._lock:
            if len(self._owners) > 100_000:
                self._owners.clear()
            self._owners[ref] = (now, answer)
        return answer

    def _locate(self, ref: str) -> str | None:
        me = self.membership.me.id
        members = self.members()
        record = self.ownership.holder(ref)
        if record is not None:
            if record.owner == me:
                return None
            holder = members.get(record.owner)
            return holder.http if holder is not None else ""
        owner = owner_of(ref, set(members) | {me})
        if owner == me or owner is None:
            return None
        return members[owner].http

    def members(self) -> dict[str, Member]:
        """The live members by id, read at most once per `cache_ns`."""
        now = self.clock.now_ns()
        with self._lock:
            at, members = self._members
        if now - at >= self.cache_ns or not members:
            members = {m.id: m for m in self.membership.members()}
            with self._lock:
                self._members = (now, members)
        return members

    def stream_for_subject(self, account: str, subject: str) -> str | None:
        """The account's stream capturing `subject`, from the stored configs (read at most once per
        `cache_ns`; a miss reads them again, at most every MISS_REFRESH_NS: a stream made a moment ago
        through another gateway is found at once)."""
        for fresh in (False, True):
            for name, subjects in self._configs(account, fresh):
                if any(subject_matches(f, subject) for f in subjects):
                    return name
        return None

    def streams(self, account: str) -> list[str]:
        """Every stream of the account, by name (from its stored configs)."""
        return [name for name, _ in self._configs(account)]

    def stream_subjects(self, account: str) -> list[tuple[str, list[str]]]:
        """Every stream of the account with its subjects, read again when older than MISS_REFRESH_NS:
        the truth for account-wide views (a stream made a moment ago through another gateway counts)."""
        return self._configs(account, fresh=True)

    def peers(self) -> list[str]:
        """The HTTP addresses of the other live gateways (account-wide views ask each of them)."""
        me = self.membership.me.id
        return sorted(m.http for m in self.members().values() if m.id != me and m.http)

    def _configs(self, account: str, fresh: bool = False) -> list[tuple[str, list[str]]]:
        now = self.clock.now_ns()
        with self._lock:
            cached = self._subjects.get(account)
        if cached is not None and now - cached[0] < (min(MISS_REFRESH_NS, self.cache_ns) if fresh else self.cache_ns):
            return cached[1]
        layout = self.layout_of(account)
        store = layout.objects
        found: list[tuple[str, list[str]]] = []
        folder = layout.stream_configs_key + "/"
        for meta in store.list(layout.stream_configs_key):
            if not meta.key.endswith(".json") or "/" in meta.key[len(folder):]:
                continue
            try:
                config = orjson.loads(store.get(meta.key).data)["config"]
            except ObjectNotFoundError:
                continue  # deleted meanwhile
            found.append((config["name"], list(config.get("subjects") or [])))
        found.sort()
        with self._lock:
            self._subjects[account] = (now, found)
        return found
