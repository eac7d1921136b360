"""`--wal object`: the log as one fenced object per group commit, on a local folder and on the real
S3 server. Records come back in order after a "crash" (a new log object on the same prefix, as the
next owner opens it); a deposed owner's append is refused; flushed objects are removed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.clock import ManualClock
from engine.store.leases import Lease
from engine.store.object_log import ObjectLog
from engine.store.objectstore import ObjectStore, WarehouseLocation
from tests.s3 import S3Server

TTL = 10_000_000_000
PREFIX = "default/_log/ORDERS"


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        backend = WarehouseLocation.parse(tmp_path / "warehouse").open()
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        backend = server.location().open()
    yield backend
    backend.close()


def _owner(store: ObjectStore, name: str, clock: ManualClock) -> Lease:
    lease = Lease(store, "default/_system/leases/owner.json", name, TTL, clock=clock)
    assert lease.try_acquire()
    return lease


def test_records_written_by_one_owner_are_replayed_by_the_next(store: ObjectStore) -> None:
    clock = ManualClock(1_000_000_000)
    first = ObjectLog(store, PREFIX, _owner(store, "gw-1", clock))
    assert first.append([(1, b"a"), (1, b"b")]) == 2
    assert first.append([(1, b"c")]) == 3
    assert [m.key.rsplit("/", 1)[-1] for m in store.list(PREFIX)] == [
        "00000000000000000001.wal", "00000000000000000003.wal"]
    assert first.size > 0
    assert first.rotate() == [f"{PREFIX}/00000000000000000001.wal", f"{PREFIX}/00000000000000000003.wal"]

    clock.advance(2 * TTL)  # gw-1 is gone; its lease expired
    second = ObjectLog(store, PREFIX, _owner(store, "gw-2", clock))
    records = second.recover()
    assert [(r.lsn, r.payload) for r in records] == [(1, b"a"), (2, b"b"), (3, b"c")]
    assert second.next_lsn == 4 and not second.damage
    assert second.append([(1, b"d")]) == 4

    segments = second.rotate()
    second.remove(segments[:2])
    assert [r.payload for r in ObjectLog(store, PREFIX, second.lease).recover()] == [b"d"]


def test_a_deposed_owner_cannot_append(store: ObjectStore) -> None:
    clock = ManualClock(1_000_000_000)
    old = ObjectLog(store, PREFIX, _owner(store, "gw-1", clock))
    assert old.append([(1, b"acked")]) == 1
    clock.advance(2 * TTL)
    new = ObjectLog(store, PREFIX, _owner(store, "gw-2", clock))
    assert [r.payload for r in new.recover()] == [b"acked"]
    assert new.append([(1, b"new owner")]) == 2
    with pytest.raises(OSError, match="no longer"):
        old.append([(1, b"stale")])  # its lease is not trusted any more: nothing written
    with pytest.raises(OSError):
        old.append([(1, b"stale")])  # and it stays refused
    assert [r.payload for r in ObjectLog(store, PREFIX, new.lease).recover()] == [b"acked", b"new owner"]
