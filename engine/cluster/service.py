"""The gateway's part in a cluster: its heartbeat, its stream leases and the thread that keeps both.

Every `interval` seconds: the heartbeat is written, the live members listed, every stream of every
account listed (from the stored configs), and ownership runs a round (claim, renew, hand over).
The heartbeat and the renewals also run on a thread of their own, so a round held up by a slow
recovery of one stream never lets the others' leases (or the membership) run out.
Streams are served by the accounts' engines (`take`, `hand_over`, `lost`); a stream made through
this gateway takes its lease first (`claim_new`). A clean stop hands every stream over and leaves
the membership, so the others take the streams at their next round instead of after the TTL.
Counterpart: nats-server's JetStream cluster monitor (server/jetstream_cluster.go, monitorCluster).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from engine import errors
from engine.clock import Clock, SystemClock
from engine.cluster.locator import ClusterLocator, lease_key_of, split_ref, stream_ref
from engine.cluster.membership import DEFAULT_MEMBER_TTL_NS, Member, Membership
from engine.cluster.ownership import STREAM_TTL_NS, Ownership
from engine.store.layout import Layout
from engine.store.leases import Lease, LeaseHeldError
from engine.store.objectstore import ObjectStore, ObjectStoreError

if TYPE_CHECKING:
    from engine.accounts.registry import Accounts

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 1.0


class StreamServer(Protocol):
    """An account's engine as the cluster sees it (engine/jetstream.py)."""

    claim_stream: Callable[[str], Lease] | None
    release_stream: Callable[[str], None] | None

    def take(self, name: str, lease: Lease) -> None: ...

    def hand_over(self, name: str) -> None: ...

    def lost(self, name: str, reason: str) -> None: ...


class _EngineHost:
    """Ownership's host over the accounts' engines: a stream ref goes to its account's engine."""

    def __init__(self, engine_of: Callable[[str], StreamServer | None]) -> None:
        self.engine_of = engine_of

    def _engine(self, ref: str) -> tuple[StreamServer, str]:
        account, stream = split_ref(ref)
        engine = self.engine_of(account)
        if engine is None:
            raise LookupError(f"account {account} has no JetStream here")
        return engine, stream

    def take(self, stream: str, lease: Lease) -> None:
        engine, name = self._engine(stream)
        engine.take(name, lease)

    def hand_over(self, stream: str) -> None:
        engine, name = self._engine(stream)
        engine.hand_over(name)

    def lost(self, stream: str, reason: str) -> None:
        engine, name = self._engine(stream)
        engine.lost(name, reason)


class Cluster:
    """Membership, ownership and the locator of one gateway, and the thread running their rounds.

    Args:
        store: the warehouse's object store.
        me: this gateway (id, advertised addresses).
        accounts: the names of the accounts whose streams are spread.
        engine_of: an account's engine (None without JetStream).
        layout_of: an account's warehouse layout.
    """

    def __init__(self, store: ObjectStore, me: Member, accounts: Callable[[], list[str]],
                 engine_of: Callable[[str], StreamServer | None], layout_of: Callable[[str], Layout], *,
                 interval: float = DEFAULT_INTERVAL, member_ttl_ns: int = DEFAULT_MEMBER_TTL_NS,
                 stream_ttl_ns: int = STREAM_TTL_NS, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.accounts = accounts
        self.engine_of = engine_of
        self.interval = interval
        self.membership = Membership(store, me, member_ttl_ns, self.clock)
        self.ownership = Ownership(store, lease_key_of(layout_of), me.id, _EngineHost(engine_of), stream_ttl_ns,
                                   self.clock)
        self.locator = ClusterLocator(self.membership, self.ownership, layout_of, clock=self.clock)
        self._round_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Hooks the engines, announces this gateway, runs a first round, then keeps running them."""
        for account in self.accounts():
            engine = self.engine_of(account)
            if engine is not None:
                engine.claim_stream = lambda name, a=account: self.claim_new(a, name)
                engine.release_stream = lambda name, a=account: self.ownership.forget(stream_ref(a, name))
        self.round()
        self._threads = [threading.Thread(target=self._run, name="jetlake-cluster", daemon=True),
                         threading.Thread(target=self._renew, name="jetlake-renew", daemon=True)]
        for thread in self._threads:
            thread.start()

    def _renew(self) -> None:
        """The heartbeat and the lease renewals, on a thread of their own: a round stuck claiming
        (a slow recovery of one stream) never lets this gateway's other leases, or its membership,
        run out."""
        while not self._stop.wait(self.interval):
            try:
                self.membership.heartbeat()
            except ObjectStoreError as exc:
                log.warning("heartbeat failed (%s); retried", exc)
            try:
                self.ownership.renew()
            except Exception:  # noqa: BLE001 - the thread must keep going
                log.exception("lease renewal failed; retried")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.round()
            except ObjectStoreError as exc:  # the store did not answer: the next round tries again
                log.warning("cluster round failed (%s); retried", exc)
            except Exception:  # noqa: BLE001 - the thread must keep the leases renewed
                log.exception("cluster round failed; retried")

    def round(self) -> None:
        with self._round_lock:
            self.membership.heartbeat()
            members = [m.id for m in self.membership.members()]
            refs = [stream_ref(a, s) for a in self.accounts() if self.engine_of(a) is not None
                    for s in self.locator.streams(a)]
            self.ownership.round(refs, members)

    def claim_new(self, account: str, stream: str) -> Lease:
        """The lease of a stream created through this gateway. Raises 503 (10008) when another holds it."""
        try:
            return self.ownership.claim_new(stream_ref(account, stream))
        except (LeaseHeldError, ObjectStoreError) as exc:
            raise errors.cluster_unavailable(f"stream {stream} is being made or served elsewhere: {exc}") from None

    def members(self) -> list[Member]:
        return self.membership.members()

    def stop(self) -> None:
        """Hands every stream over and leaves (a clean stop)."""
        self._stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []
        with self._round_lock:
            self.ownership.release_all()
        self.membership.leave()


def for_accounts(accounts: Accounts, me: Member, **options: float | int) -> Cluster:
    """The cluster part of a gateway serving `accounts` (engines opened with `EngineOptions.cluster`)."""
    def engine_of(name: str) -> StreamServer | None:
        account = accounts.get(name)
        return account.engine if account is not None else None

    def layout_of(name: str) -> Layout:
        return Layout(accounts.warehouse, name, accounts.options.wal_dir)

    store = accounts.warehouse.open()
    return Cluster(store, me, accounts.names, engine_of, layout_of, **options)  # type: ignore[arg-type]
