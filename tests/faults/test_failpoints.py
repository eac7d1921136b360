"""Each failpoint armed in a real gateway under publish, delete and ack load, then a restart and a flush.

Whatever fires — a log write failing or torn, a segment that cannot be sealed or removed, a commit
that fails before or after it lands, a checkpoint or fsync that fails, the process killed between
two steps — every publish, delete and ack answered OK is stored exactly once, no sequence is given
twice, and the gateway either keeps serving or refuses writes with a 503 ApiError; restart works.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from deltalake import DeltaTable

from engine.store.failpoints import ENV
from engine.store.layout import Layout
from engine.store.lease import commit_lease
from tests.faults.harness import STREAM, Load, check_restart, create_consumer, create_stream
from tests.gateway import Gateway

# Failpoints that leave the process running, a few armed at once (each fires once, at its own time),
# and the `serve` arguments they need.
GROUPS = [
    ("wal.append=short@5,wal.rotate=eio@2,wal.unlink=eio@1", ()),
    ("wal.append=eio@5,stream.commit=raise_after@2,tombstones.commit=raise_after@1", ()),
    ("wal.append=enospc@5,stream.commit=eio@3,stream.checkpoint=eio@1,tombstones.commit=eio@2", ()),
    ("acklog.append=short@3,acks.commit=raise_after@2,acks.fold=raise_after@1", ()),
    ("acklog.append=enospc@3,acks.commit=eio@2,acklog.rotate=eio@3,acklog.unlink=eio@1", ()),
    ("stream.sync=eio@2,tombstones.sync=eio@1,acks.sync=raise_after@2", ("--sync", "always")),
]

# Failpoints that kill the process, one after another on the same warehouse: each restart recovers
# what the kill before it left, under load, until the next kill.
KILLS = [
    "stream.commit=kill_after@2",  # committed, its segments not removed: recovery removes them
    "acklog.append=kill_after@3",  # acks logged, never answered
    "wal.append=kill_after@8",  # messages logged, never answered
    "tombstones.commit=kill_after@1",
    "acks.commit=kill_after@2",
]


def _checkpoint_every_other_version(warehouse: Path, table: str) -> None:
    """Makes a checkpoint due at every other commit, so a short load reaches one (as the 100th would)."""
    path = warehouse / "default" / table
    with commit_lease(Layout(warehouse).lease_file(path), timeout=10):
        DeltaTable(str(path)).alter.set_table_properties({"delta.checkpointInterval": "2"})


def _fired(gw: Gateway, names: list[str], timeout: float = 20.0) -> None:
    """Waits until every failpoint of `names` has fired (pulling the ack fold along when it is one)."""
    deadline = time.monotonic() + timeout
    while True:
        log = gw.log.read_text()
        waiting = [n for n in names if f"failpoint {n} fires" not in log]
        if not waiting:
            return
        assert time.monotonic() < deadline, f"failpoints never fired: {waiting}"
        if "acks.fold" in waiting:
            _fold_acks(gw)
        time.sleep(0.05)


def _names(spec: str) -> list[str]:
    return [part.partition("=")[0].strip() for part in spec.split(",")]


@pytest.mark.parametrize(("spec", "args"), GROUPS, ids=[g[0] for g in GROUPS])
def test_failpoints_lose_and_double_nothing(warehouse: Path, spec: str, args: tuple[str, ...]) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.2", *args, env={ENV: spec}).start()
    load = Load(gw.url)
    try:
        with gw.client() as c:
            create_stream(c)
            create_consumer(c)
            if "stream.checkpoint" in spec:
                _checkpoint_every_other_version(warehouse, f"streams/{STREAM}")
        load.start()
        _fired(gw, _names(spec))
        load.wait(len(load.acked) + 200)
        _takes_writes_again(gw)
        load.stop()
        gw.kill9()  # what the faults left on disk is what the restart must recover
    finally:
        load.stop()
        gw.stop()
    assert not load.unexpected, load.unexpected[:5]
    assert load.acked and load.connection_errors == 0
    check_restart(warehouse, load).stop()


def test_kill_after_kill_loses_and_doubles_nothing(warehouse: Path) -> None:
    load = Load("", max_batches=10**6)
    created = False
    for spec in KILLS:
        gw = Gateway(warehouse, "--flush-interval", "0.2", env={ENV: spec})
        try:
            gw.start()
        except RuntimeError:  # killed while starting: its first flush commits what the last kill left
            assert f"failpoint {_names(spec)[0]} fires" in gw.log.read_text(), gw.log.read_text()[-2000:]
            gw.proc = None
            continue
        try:
            if not created:
                with gw.client() as c:
                    create_stream(c)
                    create_consumer(c)
                created = True
            load = load.restart(gw.url)
            _fired(gw, _names(spec))
            assert gw.proc is not None
            gw.proc.wait(timeout=20)
            gw.proc = None
        finally:
            load.stop()
            gw.stop()
        assert not load.unexpected, (spec, load.unexpected[:5])
    assert load.acked
    check_restart(warehouse, load).stop()


def _fold_acks(gw: Gateway) -> None:
    """A deleted consumer's ack rows are folded away at the next flush: makes `acks.fold` run."""
    with gw.client() as c:
        create_consumer(c, name="FOLDED")
        c.post(f"/v1/streams/{STREAM}/consumers/FOLDED/next", json={"batch": 5, "no_wait": True})
        c.delete(f"/v1/streams/{STREAM}/consumers/FOLDED")
        c.post("/v1/flush")


def _takes_writes_again(gw: Gateway, timeout: float = 15.0) -> None:
    """After the fault the gateway serves again by itself: a publish and a flush succeed."""
    deadline = time.monotonic() + timeout
    with gw.client() as c:
        while True:
            publish = c.post("/v1/publish/faults.after", content=b"after the fault")
            flushed = c.post("/v1/flush") if publish.status_code == 200 else None
            if flushed is not None and flushed.status_code == 200:
                return
            refused = flushed.text if flushed is not None else publish.text
            assert time.monotonic() < deadline, f"still refusing writes: {refused}"
            assert publish.status_code in (200, 503), publish.text
            time.sleep(0.1)


def test_an_unknown_failpoint_spec_stops_the_gateway_from_starting(warehouse: Path) -> None:
    gw = Gateway(warehouse, env={ENV: "wal.append=explode"})
    with pytest.raises(RuntimeError, match="bad failpoint"):
        gw.start(timeout=10)
