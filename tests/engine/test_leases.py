"""Leases with fencing tokens, on a local folder and on the real S3 server: two or more "gateways"
(threads, then processes) race for one lease; expiry, takeover and a stale holder's refused writes."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.clock import ManualClock, SystemClock
from engine.store.leases import (
    Lease,
    LeaseHeldError,
    LeaseLostError,
    fenced_create,
    fenced_replace,
    read_fenced,
)
from engine.store.objectstore import (
    ObjectExistsError,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailedError,
    WarehouseLocation,
)
from engine.store.objectstore.base import ObjectMeta
from tests import lease_worker
from tests.s3 import S3Server

ROOT = Path(__file__).resolve().parents[2]
TTL = 10_000_000_000
MARGIN = 2_000_000_000
KEY = "default/_system/leases/streams/ORDERS.json"


@pytest.fixture(params=["local", "s3"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[WarehouseLocation, dict[str, str]]:
    if request.param == "local":
        return WarehouseLocation.parse(tmp_path / "warehouse"), {}
    server: S3Server = request.getfixturevalue("s3_server")
    return server.location(), server.env


@pytest.fixture
def store(location: tuple[WarehouseLocation, dict[str, str]]) -> Iterator[ObjectStore]:
    backend = location[0].open()
    yield backend
    backend.close()


def _lease(store: ObjectStore, owner: str, clock: ManualClock) -> Lease:
    return Lease(store, KEY, owner, TTL, clock=clock, margin_ns=MARGIN)


def test_one_holder_at_a_time_and_tokens_grow_across_release(store: ObjectStore) -> None:
    clock = ManualClock()
    a, b = _lease(store, "gw-a", clock), _lease(store, "gw-b", clock)
    assert a.try_acquire() and a.token == 1
    assert not b.try_acquire() and b.token is None
    with pytest.raises(LeaseHeldError):
        b.acquire(timeout=0)
    holder = b.holder()
    assert holder is not None and holder.owner == "gw-a" and holder.expires_ns == clock.now_ns() + TTL
    a.release()
    assert a.token is None
    assert b.try_acquire() and b.token == 2, "released: taken at once, with a larger token"
    b.release()
    assert a.acquire(timeout=1) == 3
    assert a.try_acquire() and a.token == 3, "the holder's try_acquire renews, keeping its token"


def test_renewal_keeps_the_lease_past_its_first_expiry(store: ObjectStore) -> None:
    clock = ManualClock()
    a, b = _lease(store, "gw-a", clock), _lease(store, "gw-b", clock)
    a.acquire(timeout=1)
    for _ in range(3):
        clock.advance(TTL - MARGIN - 1)
        assert a.fence() == 1
        a.renew()
        assert not b.try_acquire()
    clock.advance(TTL // 2)
    assert not b.try_acquire()
    assert a.check() == 1


def test_expiry_then_takeover_deposes_the_holder(store: ObjectStore) -> None:
    clock = ManualClock()
    a, b = _lease(store, "gw-a", clock), _lease(store, "gw-b", clock)
    a.acquire(timeout=1)
    clock.advance(TTL - MARGIN)
    with pytest.raises(LeaseLostError):
        a.fence()  # no longer trusted by its holder: it stops writing before anyone may take over
    assert not b.try_acquire(), "not expired yet for the others"
    clock.advance(MARGIN)
    assert b.try_acquire() and b.token == 2
    with pytest.raises(LeaseLostError):
        a.renew()
    assert a.token is None
    with pytest.raises(LeaseLostError):
        fenced_create(a, "default/_wal/ORDERS/00000001", b"late")


def test_a_stale_holders_conditional_writes_are_refused(store: ObjectStore) -> None:
    """Clocks apart by more than the margin: the old holder still trusts its lease when the new one
    takes over. The store's conditional writes and the tokens keep the new holder's writes."""
    clock_a, clock_b = ManualClock(), ManualClock()
    a, b = _lease(store, "gw-a", clock_a), _lease(store, "gw-b", clock_b)
    a.acquire(timeout=1)
    state = fenced_create(a, "default/_system/streams/ORDERS.state", b"last_seq=10")
    fenced_create(a, "default/_wal/ORDERS/00000011", b"msg 11")

    clock_b.advance(TTL)  # B's clock runs ahead: for B the lease has expired
    assert b.acquire(timeout=1) == 2
    assert a.fence() == 1, "A does not know yet"

    with pytest.raises(ObjectExistsError):
        fenced_create(b, "default/_wal/ORDERS/00000011", b"b's 11")  # A's record of the old epoch stands
    assert read_fenced(store, "default/_wal/ORDERS/00000011").payload == b"msg 11"
    fenced_create(b, "default/_wal/ORDERS/00000012", b"msg 12")
    newer = fenced_replace(b, "default/_system/streams/ORDERS.state", b"last_seq=12", state)
    assert newer.token == 2

    # Copies of A's handle, each still trusting token 1: one stale attempt per kind of write.
    a_renewing, a_replacing, a_replacing_newer = copy.copy(a), copy.copy(a), copy.copy(a)
    with pytest.raises(LeaseLostError):
        a_renewing.renew()  # its compare-and-swap is at the version B replaced
    with pytest.raises(LeaseLostError):
        fenced_create(a, "default/_wal/ORDERS/00000012", b"a's 12")  # the key holds token 2
    assert a.token is None, "a holder that meets a newer token forgets its lease"
    with pytest.raises(LeaseLostError):
        fenced_replace(a_replacing, "default/_system/streams/ORDERS.state", b"last_seq=11", state)
    with pytest.raises(LeaseLostError):
        fenced_replace(a_replacing_newer, "default/_system/streams/ORDERS.state", b"x", newer)
    current = read_fenced(store, "default/_system/streams/ORDERS.state")
    assert (current.token, current.payload) == (2, b"last_seq=12")


def test_a_newer_holder_never_overwrites_what_it_has_not_read(store: ObjectStore) -> None:
    clock_a, clock_b = ManualClock(), ManualClock()
    a, b = _lease(store, "gw-a", clock_a), _lease(store, "gw-b", clock_b)
    a.acquire(timeout=1)
    seen_by_b = fenced_create(a, "state", b"1")
    clock_b.advance(TTL)
    b.acquire(timeout=1)
    fenced_replace(a, "state", b"2", seen_by_b)  # A's last write of its epoch, before it learns
    with pytest.raises(PreconditionFailedError):
        fenced_replace(b, "state", b"from a stale read", seen_by_b)
    fenced_replace(b, "state", b"3", read_fenced(store, "state"))
    with pytest.raises(LeaseLostError):
        fenced_replace(a, "state", b"4", read_fenced(store, "state"))
    assert read_fenced(store, "state").payload == b"3"


def test_a_write_whose_answer_was_lost_is_resolved_by_reading_back(store: ObjectStore) -> None:
    clock = ManualClock()
    flaky = _AnswerLost(store)
    a = Lease(flaky, KEY, "gw-a", TTL, clock=clock, margin_ns=MARGIN)
    assert a.try_acquire() and a.token == 1
    flaky.lose_next = True
    a.renew()  # applied by the store, answer lost: read back, it is ours
    flaky.lose_next = True
    clock.advance(TTL)
    b = Lease(flaky, KEY, "gw-b", TTL, clock=clock, margin_ns=MARGIN)
    assert b.try_acquire() and b.token == 2
    assert not _lease(store, "gw-c", clock).try_acquire()


def test_threads_racing_for_the_lease_never_overlap(store: ObjectStore) -> None:
    gateways, rounds = 4, 5
    inside, most_inside, tokens = [0], [0], []
    guard = threading.Lock()

    def gateway(n: int) -> None:
        lease = Lease(store, KEY, f"gw-{n}", 60_000_000_000, clock=SystemClock())
        for _ in range(rounds):
            token = lease.acquire(timeout=120, poll=0.005)
            with guard:
                inside[0] += 1
                most_inside[0] = max(most_inside[0], inside[0])
                tokens.append(token)
            lease_worker.bump(lease, store)
            with guard:
                inside[0] -= 1
            lease.release()

    threads = [threading.Thread(target=gateway, args=(n,)) for n in range(gateways)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    assert most_inside[0] == 1
    assert sorted(tokens) == list(range(1, gateways * rounds + 1)), "one token per acquisition, none reused"
    assert read_fenced(store, lease_worker.COUNTER_KEY).payload == str(gateways * rounds).encode()


def test_processes_racing_for_the_lease_never_overlap(
    location: tuple[WarehouseLocation, dict[str, str]], tmp_path: Path
) -> None:
    where, env = location
    processes, rounds = 3, 4
    journal = tmp_path / "journal"
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.lease_worker", where.uri(), f"proc-{n}", str(rounds), str(journal)],
            cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        )
        for n in range(processes)
    ]
    for worker in workers:
        assert worker.wait(timeout=300) == 0
    lines = [line.split() for line in journal.read_text().splitlines()]
    assert len(lines) == 2 * processes * rounds
    for enter, leave in zip(lines[::2], lines[1::2], strict=True):
        assert enter[0] == "enter" and leave[0] == "exit" and enter[1:] == leave[1:], (enter, leave)
    tokens = [int(enter[2]) for enter in lines[::2]]
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), tokens
    store = where.open()
    assert read_fenced(store, lease_worker.COUNTER_KEY).payload == str(processes * rounds).encode()


class _AnswerLost(ObjectStore):
    """A real store whose next conditional write is applied but answered with a failure (a timeout)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.lose_next = False

    def _maybe_lose(self, meta: ObjectMeta) -> ObjectMeta:
        if self.lose_next:
            self.lose_next = False
            raise ObjectStoreError("timed out waiting for the answer")
        return meta

    def create(self, key: str, data: bytes) -> ObjectMeta:
        return self._maybe_lose(self.inner.create(key, data))

    def replace(self, key: str, data: bytes, version: str) -> ObjectMeta:
        return self._maybe_lose(self.inner.replace(key, data, version))

    def get(self, key: str):  # type: ignore[no-untyped-def]
        return self.inner.get(key)

    def head(self, key: str) -> ObjectMeta:
        return self.inner.head(key)

    def put(self, key, data):  # type: ignore[no-untyped-def]
        return self.inner.put(key, data)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def list(self, prefix: str = ""):  # type: ignore[no-untyped-def]
        return self.inner.list(prefix)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        return self.inner.get_range(key, start, end)

    def get_stream(self, key, chunk_size=1 << 20):  # type: ignore[no-untyped-def]
        return self.inner.get_stream(key, chunk_size)
