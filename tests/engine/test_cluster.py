"""Several gateways on one warehouse, below the engine: rendezvous spread, membership heartbeats,
per-stream ownership handed over when a gateway joins or leaves (cleanly or by dying), and fencing:
a deposed stream owner's log write is refused. Real leases and real fenced log objects
(engine/store/object_log.py) on a local warehouse folder; time moves on a manual clock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from engine.clock import ManualClock
from engine.cluster import (
    ClusterLocator,
    Member,
    Membership,
    Ownership,
    assign,
    lease_key_of,
    owner_of,
    plan,
    split_ref,
    stream_ref,
)
from engine.cluster.service import Cluster
from engine.store.commits import TableCommitter, ensure_table
from engine.store.layout import Layout
from engine.store.leases import Lease, LeaseLostError
from engine.store.object_log import ObjectLog
from engine.store.objectstore import ObjectStore
from tests.delta_tables import open_table

TTL = 10_000_000_000
STREAMS = [f"S{i}" for i in range(60)]


def test_rendezvous_spreads_streams_evenly_and_deterministically() -> None:
    names = [f"STREAM_{i}" for i in range(3000)]
    owners = assign(names, ["gw-a", "gw-b", "gw-c"])
    counts = Counter(owners.values())
    assert set(counts) == {"gw-a", "gw-b", "gw-c"}
    assert all(800 < n < 1200 for n in counts.values()), counts  # about a third each
    assert assign(names, ["gw-c", "gw-a", "gw-b"]) == owners  # order of the members does not matter
    assert owner_of("X", []) is None and assign(names, []) == {}


def test_a_join_moves_only_the_streams_the_newcomer_wins_and_a_leave_only_the_leavers() -> None:
    names = [f"STREAM_{i}" for i in range(2000)]
    before = assign(names, ["gw-a", "gw-b", "gw-c"])
    joined = assign(names, ["gw-a", "gw-b", "gw-c", "gw-d"])
    moved = [n for n in names if before[n] != joined[n]]
    assert moved and all(joined[n] == "gw-d" for n in moved)
    assert 350 < len(moved) < 650  # about a quarter
    left = assign(names, ["gw-a", "gw-c"])
    moved = [n for n in names if before[n] != left[n]]
    assert moved and all(before[n] == "gw-b" for n in moved)


def test_members_expire_unless_they_heartbeat(tmp_path: Path) -> None:
    store = Layout(tmp_path / "warehouse").objects
    clock = ManualClock()
    a = Membership(store, Member("gw-a", "http://127.0.0.1:1"), TTL, clock)
    b = Membership(store, Member("gw-b|host|42", "http://127.0.0.1:2", "nats://127.0.0.1:3"), TTL, clock)
    a.heartbeat()
    b.heartbeat()
    assert [(m.id, m.http, m.nats) for m in a.members()] == [
        ("gw-a", "http://127.0.0.1:1", ""), ("gw-b|host|42", "http://127.0.0.1:2", "nats://127.0.0.1:3")]
    clock.advance(TTL // 2)
    a.heartbeat()  # b is silent (killed)
    clock.advance(TTL // 2 + 1)
    assert [m.id for m in b.members()] == ["gw-a"]
    a.leave()
    assert a.members() == []


class LogHost:
    """A gateway's streams as their real fenced logs: opened (recovered) under the stream's lease on
    take, given up on hand over; `lost` records what a deposed owner was told."""

    def __init__(self, store: ObjectStore, layout: Layout) -> None:
        self.store = store
        self.layout = layout
        self.logs: dict[str, ObjectLog] = {}
        self.recovered: dict[str, list[bytes]] = {}
        self.handed: list[str] = []
        self.lost_streams: list[str] = []

    def take(self, stream: str, lease: Lease) -> None:
        log = ObjectLog(self.store, self.layout.object_log_key(stream), lease)
        self.recovered[stream] = [bytes(r.payload) for r in log.recover()]
        self.logs[stream] = log

    def hand_over(self, stream: str) -> None:
        self.logs.pop(stream)
        self.handed.append(stream)

    def lost(self, stream: str, reason: str) -> None:
        self.lost_streams.append(stream)


class Gateway:
    def __init__(self, name: str, layout: Layout, clock: ManualClock) -> None:
        store = layout.objects
        self.name = name
        self.host = LogHost(store, layout)
        self.membership = Membership(store, Member(name, f"http://{name}"), TTL, clock)
        self.ownership = Ownership(store, layout.stream_lease_key, name, self.host, TTL, clock)

    def round(self) -> None:
        self.membership.heartbeat()
        self.ownership.round(STREAMS, [m.id for m in self.membership.members()])


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "warehouse")


def test_ownership_moves_on_join_and_on_a_clean_leave(layout: Layout) -> None:
    clock = ManualClock()
    a = Gateway("gw-a", layout, clock)
    a.round()
    assert sorted(a.ownership.held) == sorted(STREAMS)
    for stream in STREAMS:
        a.host.logs[stream].append([(1, f"{stream} from a".encode())])

    b = Gateway("gw-b", layout, clock)
    b.round()  # b should own some now, but a still holds them: nothing taken yet
    assert b.ownership.held == {}
    wanted_by_b = plan("gw-b", STREAMS, ["gw-a", "gw-b"], []).claim
    assert 15 < len(wanted_by_b) < 45
    a.round()  # a sees b and hands those over (released, no expiry to wait for)
    assert sorted(a.host.handed) == wanted_by_b
    b.round()
    assert sorted(b.ownership.held) == wanted_by_b
    assert set(a.ownership.held).isdisjoint(b.ownership.held)
    for stream in wanted_by_b:  # b recovered a's log and goes on after it
        assert b.host.recovered[stream] == [f"{stream} from a".encode()]
        assert b.host.logs[stream].append([(1, b"from b")]) == 2
        assert b.ownership.held[stream].token == 2

    b.membership.leave()
    b.ownership.release_all()
    a.round()
    assert sorted(a.ownership.held) == sorted(STREAMS)
    assert a.host.recovered[wanted_by_b[0]] == [f"{wanted_by_b[0]} from a".encode(), b"from b"]


def test_a_dead_gateways_streams_move_once_its_leases_expire(layout: Layout) -> None:
    clock = ManualClock()
    a, b = Gateway("gw-a", layout, clock), Gateway("gw-b", layout, clock)
    for gateway in (a, b, a, b):
        gateway.round()
    of_b = sorted(b.ownership.held)
    assert of_b and set(of_b) | set(a.ownership.held) == set(STREAMS)
    for stream in of_b:
        b.host.logs[stream].append([(1, b"acked by b")])
    # b is killed: no heartbeat, no release
    clock.advance(TTL // 2)
    a.round()
    assert set(a.ownership.held).isdisjoint(of_b)  # b's heartbeat still counts, its leases hold
    clock.advance(TTL // 2 + 1)
    a.round()  # b's record and leases expired: a claims its streams and replays their logs
    assert set(of_b) <= set(a.ownership.held)
    assert all(a.host.recovered[s] == [b"acked by b"] for s in of_b)


def test_a_deposed_owner_cannot_write_the_streams_log(layout: Layout) -> None:
    """The old owner was paused (its clock stood still: it still trusts its lease) while the stream
    moved; its next log write meets the new owner's token and is refused, and nothing of it lands."""
    stale_clock, clock = ManualClock(), ManualClock()
    old = Gateway("gw-a", layout, stale_clock)
    old.round()
    stream = STREAMS[0]
    stale_log = old.host.logs[stream]
    assert stale_log.append([(1, b"acked")]) == 1

    clock.advance(2 * TTL)
    new = Gateway("gw-b", layout, clock)
    new.round()
    assert stream in new.ownership.held and new.ownership.held[stream].token == 2
    assert new.host.recovered[stream] == [b"acked"]
    assert new.host.logs[stream].append([(1, b"new owner")]) == 2

    with pytest.raises(OSError, match="no longer owns"):
        stale_log.append([(1, b"stale")])
    stale_clock.advance(TTL // 3)  # its next renewal is due (it still trusts its lease)
    old.round()  # the renewal finds the lease taken over: the stream is dropped, not handed over
    assert stream in old.host.lost_streams and stream not in old.ownership.held
    check = ObjectLog(layout.objects, layout.object_log_key(stream), new.ownership.held[stream])
    assert [bytes(r.payload) for r in check.recover()] == [b"acked", b"new owner"]


def test_the_locator_points_at_the_holder_and_nowhere_while_a_dead_holders_lease_runs(tmp_path: Path) -> None:
    """Streams of account `default` named by ref; a's view: its own streams here, b's at b's address,
    b's after b's death unreachable ("") until its leases expire, then here."""
    warehouse = tmp_path / "warehouse"
    layouts = {"default": Layout(warehouse)}
    clock = ManualClock()
    store = layouts["default"].objects
    refs = [stream_ref("default", s) for s in STREAMS]

    def gateway(name: str) -> tuple[Membership, Ownership, ClusterLocator]:
        membership = Membership(store, Member(name, f"http://{name}"), TTL // 2, clock)  # heartbeats outlive less
        host = LogHost(store, layouts["default"])
        ownership = Ownership(store, lease_key_of(layouts.__getitem__), name, host, TTL, clock)
        locator = ClusterLocator(membership, ownership, layouts.__getitem__, cache_ns=0, clock=clock)
        return membership, ownership, locator

    (ma, oa, la), (mb, ob, lb) = gateway("gw-a"), gateway("gw-b")
    for membership, ownership in ((ma, oa), (mb, ob), (ma, oa), (mb, ob)):
        membership.heartbeat()
        ownership.round(refs, [m.id for m in membership.members()])
    of_a, of_b = sorted(oa.held), sorted(ob.held)
    assert of_a and of_b
    assert {la.owner_url(*split_ref(r)) for r in of_a} == {None}
    assert {la.owner_url(*split_ref(r)) for r in of_b} == {"http://gw-b"}
    assert {lb.owner_url(*split_ref(r)) for r in of_a} == {"http://gw-a"}
    new_owner = owner_of("default/NEW", ["gw-a", "gw-b"])  # not made yet: its rendezvous owner
    assert la.owner_url("default", "NEW") == (None if new_owner == "gw-a" else "http://gw-b")

    clock.advance(TTL // 2)  # b is killed: its record expires now, its leases in TTL / 2
    ma.heartbeat()
    oa.renew()
    assert {la.owner_url(*split_ref(r)) for r in of_b} == {""}
    clock.advance(TTL // 2 + 1)
    ma.heartbeat()
    oa.round(refs, [m.id for m in ma.members()])
    assert {la.owner_url(*split_ref(r)) for r in of_b} == {None}


def test_the_locator_finds_the_stream_capturing_a_subject(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "warehouse")
    store = layout.objects
    for name, subjects in (("ORDERS", ["orders.>"]), ("EVENTS", ["ev.*"])):
        store.put(layout.stream_config_key(name), orjson.dumps({"config": {"name": name, "subjects": subjects}}))
    membership = Membership(store, Member("gw-a", "http://gw-a"))
    ownership = Ownership(store, layout.stream_lease_key, "gw-a", LogHost(store, layout))
    locator = ClusterLocator(membership, ownership, lambda _: layout)
    assert locator.stream_for_subject("default", "orders.eu.1") == "ORDERS"
    assert locator.stream_for_subject("default", "ev.x") == "EVENTS"
    assert locator.stream_for_subject("default", "ev.x.y") is None
    assert locator.streams("default") == ["EVENTS", "ORDERS"]


def test_a_deposed_owners_table_commit_is_refused(layout: Layout) -> None:
    """A table commit carries the committer's stream-lease token; one under an older token than the
    table's last is refused and adds nothing (the flusher of a paused, deposed owner)."""
    table = layout.table("_system", "fence-test")
    schema = pa.schema([pa.field("seq", pa.int64())])
    ensure_table(table, schema, None, {})
    committer = TableCommitter(table, "test")
    rows = pa.table({"seq": [1, 2]}, schema=schema)
    committer.append(lambda _: rows, "S", 2, fence=("owner-token", 2))  # the new owner, token 2
    stale = pa.table({"seq": [3]}, schema=schema)
    with pytest.raises(LeaseLostError, match="token 2"):
        committer.append(lambda _: stale, "S", 3, fence=("owner-token", 1))
    committer.append(lambda _: stale, "S", 3, fence=("owner-token", 2))
    assert sorted(open_table(table).to_pyarrow_table().column("seq").to_pylist()) == [1, 2, 3]


class SlowHost:
    """An account's engine as the cluster sees it, whose recovery of stream SLOW waits until the test
    lets it go (a recovery replaying a long log from a slow store)."""

    claim_stream = None
    release_stream = None

    def __init__(self) -> None:
        self.recovering = threading.Event()
        self.finish = threading.Event()
        self.taken: list[str] = []

    def take(self, name: str, lease: Lease) -> None:
        if name == "SLOW":
            self.recovering.set()
            assert self.finish.wait(60), "the test never let the recovery finish"
        self.taken.append(name)

    def hand_over(self, name: str) -> None:
        pass

    def lost(self, name: str, reason: str) -> None:
        raise AssertionError(f"stream {name} lost: {reason}")


def test_a_slow_recovery_of_one_stream_never_lets_the_other_leases_run_out(tmp_path: Path) -> None:
    """The round thread is stuck in SLOW's recovery for more than two lease TTLs: the renewal thread
    keeps every other lease (and SLOW's own) held by this gateway all along."""
    layout = Layout(tmp_path / "warehouse")
    store = layout.objects
    ttl = 1_500_000_000

    def make(name: str) -> None:
        store.put(layout.stream_config_key(name), orjson.dumps({"config": {"name": name, "subjects": [f"{name}.>"]}}))

    others = ["A1", "A2", "A3"]
    for name in others:
        make(name)
    host = SlowHost()
    cluster = Cluster(store, Member("gw-a", "http://gw-a"), lambda: ["default"], lambda _: host, lambda _: layout,
                      interval=0.05, member_ttl_ns=2 * ttl, stream_ttl_ns=ttl)
    cluster.start()
    try:
        assert sorted(host.taken) == others
        make("SLOW")
        assert host.recovering.wait(30), "SLOW was never claimed"
        stuck_at = time.time_ns()
        leases = {name: Lease(store, layout.stream_lease_key(name), "reader", ttl) for name in [*others, "SLOW"]}
        deadline = time.monotonic() + 60
        while True:  # until each lease has been renewed past two TTLs after the round got stuck
            records = {name: lease.holder() for name, lease in leases.items()}
            assert all(r is not None and r.owner == "gw-a" and r.held_at(time.time_ns()) for r in records.values()), \
                records
            if all(r is not None and r.expires_ns > stuck_at + 2 * ttl for r in records.values()):
                break
            assert time.monotonic() < deadline, f"leases not renewed while SLOW recovers: {records}"
            time.sleep(0.05)
        assert "SLOW" not in host.taken  # the round was still stuck all along
        assert all(m.id == "gw-a" for m in cluster.membership.members())
    finally:
        host.finish.set()
    deadline = time.monotonic() + 30
    while stream_ref("default", "SLOW") not in cluster.ownership.held:
        assert time.monotonic() < deadline, "SLOW not held after its recovery"
        time.sleep(0.02)
    cluster.stop()
