"""Stream ownership: one lease per stream, claimed by the gateway rendezvous hashing picks.

Each stream (with its consumers) has one owner at a time: the holder of the stream's lease
(`<account>/_system/leases/streams/<STREAM>.json`, engine/store/leases.py), whose fencing token
every log write and table commit of the stream carries, so a deposed owner can never write again.
On each round a gateway compares the streams it should own (rendezvous.py over the live members)
with those it holds:
- a stream it should no longer own is handed over: the host flushes and closes it, then the lease
  is released, so the new owner takes it at once (no wait for an expiry);
- a stream it should own is claimed: the lease is taken when free, released or expired (a dead
  gateway's streams move once its lease runs out), then the host opens it under the lease;
- held leases are renewed; a lease found taken over tells the host the stream is lost.
`renew` may run on a thread of its own (engine/cluster/service.py does) while a round is claiming:
the lease of a stream being recovered is renewed too, so a slow recovery of one stream delays
neither the renewal of the others nor its own.
The lease names its holder by member id; the holder's addresses are in its membership record
(membership.py), one record per gateway rather than a copy per stream.
Counterpart: nats-server's stream leader election (server/jetstream_cluster.go), replaced by leases.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from engine.clock import Clock, SystemClock
from engine.cluster.rendezvous import owner_of
from engine.store.lease import holder_is_dead
from engine.store.leases import Lease, LeaseHeldError, LeaseLostError, LeaseRecord
from engine.store.objectstore import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

STREAM_TTL_NS = 10_000_000_000


class StreamHost(Protocol):
    """What serves a stream once owned (the engine): opened under its lease, flushed and closed on handover."""

    def take(self, stream: str, lease: Lease) -> None:
        """Recovers the stream (table, log) and serves it; every write carries `lease`'s token."""

    def hand_over(self, stream: str) -> None:
        """Flushes and closes the stream before its lease is released."""

    def lost(self, stream: str, reason: str) -> None:
        """The lease was taken over: stop serving the stream without writing."""


@dataclass
class Plan:
    """One round's changes: the streams to claim and those to hand over."""

    claim: list[str] = field(default_factory=list)
    release: list[str] = field(default_factory=list)


def plan(me: str, streams: Iterable[str], members: Iterable[str], held: Iterable[str]) -> Plan:
    """What `me` should claim and hand over, given every stream and the live members' ids. A held
    stream missing from `streams` is kept: it was made here after the listing was read (only its
    owner deletes a stream, and gives its lease up then)."""
    live = sorted(set(members) | {me})
    listed = set(streams)
    wanted = {s for s in listed if owner_of(s, live) == me}
    owned = set(held)
    return Plan(sorted(wanted - owned), sorted((owned & listed) - wanted))


class Ownership:
    """The stream leases this gateway holds, and the rounds that claim, renew and hand them over.

    Args:
        store: the warehouse's object store.
        lease_key: the lease key of a stream name (`Layout.stream_lease_key`).
        me: this gateway's member id (also the lease owner).
        host: what opens and closes the streams.
        ttl_ns: the stream leases' TTL; a dead owner's streams move after at most this.
        clock: wall clock of the leases.
    """

    def __init__(self, store: ObjectStore, lease_key: Callable[[str], str], me: str, host: StreamHost,
                 ttl_ns: int = STREAM_TTL_NS, clock: Clock | None = None) -> None:
        self.store = store
        self.lease_key = lease_key
        self.me = me
        self.host = host
        self.ttl_ns = ttl_ns
        self.clock: Clock = clock or SystemClock()
        self.held: dict[str, Lease] = {}
        self._taking: dict[str, Lease] = {}  # claimed, the host still recovering the stream
        self._renewed_ns: dict[str, int] = {}  # when each held (or taking) lease was last written
        self._lock = threading.Lock()  # held, _taking, _renewed_ns: rounds and renewals on two threads
        self._renewing = threading.Lock()

    def round(self, streams: Iterable[str], members: Iterable[str]) -> Plan:
        """One round: renew, hand over, claim. Returns what was planned (a claim of a lease still
        held elsewhere waits for a later round)."""
        self.renew()  # first: a lease taken over is dropped, never flushed as if still owned
        todo = plan(self.me, streams, members, list(self.held))
        for stream in todo.release:
            self.hand_over(stream)
        for stream in todo.claim:
            self.claim(stream)
        return todo

    def claim_new(self, stream: str) -> Lease:
        """The lease of a stream about to be made here (its creator serves it): taken now, without the
        host opening anything. Raises LeaseHeldError when another gateway holds it."""
        lease = Lease(self.store, self.lease_key(stream), self.me, self.ttl_ns, clock=self.clock)
        if not lease.try_acquire(breakable=holder_is_dead):
            raise LeaseHeldError(f"stream {stream} is owned by {lease.holder()}")
        with self._lock:
            self.held[stream] = lease
            self._renewed_ns[stream] = self.clock.now_ns()
        return lease

    def forget(self, stream: str) -> None:
        """A stream deleted (or not made after `claim_new`): its lease released, nothing handed over."""
        lease = self._pop(stream)
        if lease is not None:
            try:
                lease.release()
            except ObjectStoreError as exc:
                log.warning("lease of stream %s not released (it expires): %s", stream, exc)

    def claim(self, stream: str) -> bool:
        """Takes the stream's lease if free, released, expired or its holder is a dead local process,
        then opens the stream; True if this gateway owns it now."""
        lease = Lease(self.store, self.lease_key(stream), self.me, self.ttl_ns, clock=self.clock)
        try:
            if not lease.try_acquire(breakable=holder_is_dead):
                return False
        except ObjectStoreError as exc:
            log.warning("claiming stream %s failed (%s); retried next round", stream, exc)
            return False
        with self._lock:
            self._taking[stream] = lease
            self._renewed_ns[stream] = self.clock.now_ns()
        try:
            self.host.take(stream, lease)
        except Exception:
            log.exception("stream %s could not be opened; its lease is released for another gateway", stream)
            with self._lock:
                self._taking.pop(stream, None)
                self._renewed_ns.pop(stream, None)
            lease.release()
            return False
        with self._lock:
            kept = self._taking.pop(stream, None) is lease  # not lost to another gateway while recovering
            if kept:
                self.held[stream] = lease
        if not kept:
            self.host.lost(stream, "its lease was taken over while the stream was being recovered")
            return False
        log.info("stream %s claimed (token %s)", stream, lease.token)
        return True

    def hand_over(self, stream: str) -> None:
        """Flushes and closes the stream, then releases its lease for the gateway that should own it."""
        lease = self._pop(stream)
        if lease is None:
            return
        try:
            self.host.hand_over(stream)
        finally:
            try:
                lease.release()
            except ObjectStoreError as exc:
                log.warning("lease of stream %s not released (it expires): %s", stream, exc)
        log.info("stream %s handed over", stream)

    def renew(self, force: bool = False) -> None:
        """Renews the held leases (and those of streams being recovered) written a third of their TTL
        ago or more (one PUT per stream per TTL/3, not per round); one taken over is dropped and its
        stream stops serving. Safe beside a round on another thread."""
        with self._renewing:
            now = self.clock.now_ns()
            with self._lock:
                leases = [*self.held.items(), *self._taking.items()]
            for stream, lease in leases:
                with self._lock:
                    current = self.held.get(stream) or self._taking.get(stream)
                    due = force or now - self._renewed_ns.get(stream, 0) >= self.ttl_ns // 3
                if current is not lease or not due:
                    continue  # forgotten or handed over meanwhile, or renewed recently
                try:
                    lease.renew()
                    with self._lock:
                        self._renewed_ns[stream] = now
                except LeaseLostError as exc:
                    self._drop(stream, str(exc))
                except ObjectStoreError as exc:  # no answer: the lease stays trusted until its margin
                    log.warning("lease of stream %s not renewed (%s); retried", stream, exc)

    def release_all(self) -> None:
        """A clean stop: every stream handed over."""
        for stream in list(self.held):
            self.hand_over(stream)

    def holder(self, stream: str) -> LeaseRecord | None:
        """The stream's lease as stored, if held now (None when free or expired)."""
        record = Lease(self.store, self.lease_key(stream), self.me, self.ttl_ns, clock=self.clock).holder()
        if record is None or not record.held_at(self.clock.now_ns()):
            return None
        return record

    def _pop(self, stream: str) -> Lease | None:
        with self._lock:
            self._renewed_ns.pop(stream, None)
            return self.held.pop(stream, None)

    def _drop(self, stream: str, reason: str) -> None:
        with self._lock:
            taking = self._taking.pop(stream, None)
            if taking is not None:
                self._renewed_ns.pop(stream, None)
        if taking is not None:  # the claiming round tells the host once its recovery returns
            taking.lost()
            log.error("stream %s lost while being recovered: %s", stream, reason)
            return
        lease = self._pop(stream)
        if lease is None:
            return
        lease.lost()
        log.error("stream %s is no longer owned by this gateway: %s", stream, reason)
        self.host.lost(stream, reason)
