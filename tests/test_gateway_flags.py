"""`jetlake serve --sync always` and `--flush-bytes` on a real gateway: what each flag does, not how fast.

`--sync always` is observed with strace attached to the gateway: each acknowledged publish and ack
is preceded by an fsync of its log segment, where `--sync os` leaves the log to the OS. Both then
survive kill -9 with every acknowledged write. `--flush-bytes` is observed in the Delta table: a
backlog past it is committed long before the flush interval, a smaller one is not.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import orjson
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from engine.store.layout import Layout
from tests.gateway import Gateway

WRITES = 20


@contextmanager
def _fsyncs(pid: int, out: Path) -> Iterator[list[str]]:
    """The paths fsynced by process `pid` (all its threads) while the block runs, via strace."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (Debian: apt-get install -y strace)")
    tracer = subprocess.Popen(
        [strace, "-f", "-y", "-qq", "-e", "trace=fsync,fdatasync", "-o", str(out), "-p", str(pid)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10
    while not out.exists() or not _threads_attached(pid, tracer.pid):
        if tracer.poll() is not None:
            why = tracer.stderr.read().decode()[-300:] if tracer.stderr else ""
            pytest.skip(f"strace cannot attach to the gateway: {why}")
        assert time.monotonic() < deadline, "strace did not attach"
        time.sleep(0.05)
    paths: list[str] = []
    try:
        yield paths
    finally:
        os.kill(tracer.pid, signal.SIGINT)  # detaches from the gateway and exits
        tracer.wait(timeout=10)
    paths += re.findall(r"(?:fsync|fdatasync)\(\d+<([^>]*)>", out.read_text())


def _threads_attached(pid: int, tracer: int) -> bool:
    """Every thread of `pid` is traced by `tracer` (TracerPid in its status)."""
    tasks = list(Path(f"/proc/{pid}/task").iterdir())
    return all(f"TracerPid:\t{tracer}\n" in (t / "status").read_text() for t in tasks)


def _publish_and_ack(c: httpx.Client, n: int) -> list[int]:
    """n raw publishes and n pull-and-ack rounds, one at a time: every write answered on its own."""
    seqs = []
    for i in range(n):
        answer = c.post("/v1/publish/flags.a", content=f"m{i}".encode())
        assert answer.status_code == 200, answer.text
        seqs.append(answer.json()["seq"])
    for _ in range(n):
        [msg] = c.post("/v1/streams/FLAGS/consumers/C/next", json={"batch": 1, "no_wait": True}).json()["messages"]
        answer = c.post("/v1/streams/FLAGS/consumers/C/ack", json={"acks": [{"token": msg["ack"]}]})
        assert answer.json() == {"results": [{"ok": True}]}
    return seqs


def _setup(c: httpx.Client) -> None:
    assert c.post("/v1/streams", json={"name": "FLAGS", "subjects": ["flags.>"]}).status_code == 201
    assert c.post("/v1/streams/FLAGS/consumers", json={"durable_name": "C", "ack_policy": "explicit"}).status_code == 201


@pytest.mark.parametrize("sync", ["os", "always"])
def test_sync_policy_of_the_log(tmp_path: Path, sync: str) -> None:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    layout = Layout(warehouse)
    gw = Gateway(warehouse, "--sync", sync, "--flush-interval", "60").start()
    try:
        assert f"sync {sync}" in gw.log.read_text()
        with gw.client() as c:
            _setup(c)
            _publish_and_ack(c, 1)  # the first write opens each log's segment (an fsync of its folder)
            assert gw.proc is not None
            with _fsyncs(gw.proc.pid, tmp_path / "writes.strace") as synced:
                seqs = _publish_and_ack(c, WRITES)
            before = c.get("/v1/streams/FLAGS/consumers/C").json()
            with _fsyncs(gw.proc.pid, tmp_path / "flush.strace") as flushed:  # the control: a flush seals segments
                assert c.post("/v1/flush").json()["commits"] >= 2
            _publish_and_ack(c, 1)  # and something only in the log at the kill
        gw.kill9()
    finally:
        gw.stop()
    assert any(p.startswith(str(layout.wal_dir("FLAGS"))) for p in flushed), "strace sees the gateway's fsyncs"
    stream_log = [p for p in synced if p.startswith(str(layout.wal_dir("FLAGS")))]
    ack_log = [p for p in synced if p.startswith(str(layout.acks_wal))]
    if sync == "always":
        assert len(stream_log) >= WRITES, f"an fsync before each publish is answered: {len(stream_log)}"
        assert len(ack_log) >= 2 * WRITES, f"an fsync before each pull and each ack is answered: {len(ack_log)}"
    else:
        assert (stream_log, ack_log) == ([], []), "the OS flushes the log"
    gw = Gateway(warehouse, "--sync", sync, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            state = c.get("/v1/streams/FLAGS").json()["state"]
            assert (state["messages"], state["last_seq"]) == (WRITES + 2, seqs[-1] + 1)
            after = c.get("/v1/streams/FLAGS/consumers/C").json()
            assert after["num_ack_pending"] == before["num_ack_pending"] == 0
            assert after["ack_floor"]["stream_seq"] == WRITES + 2
    finally:
        gw.stop()


def _committed(layout: Layout) -> tuple[int, int]:
    """(the stream table's app transaction, its number of commits after the create)."""
    stream_id = str(orjson.loads(layout.stream_config("FLAGS").read_bytes())["stream_id"])
    try:
        table = DeltaTable(str(layout.stream_table("FLAGS")))
    except TableNotFoundError:
        return 0, 0
    return table.transaction_version(stream_id) or 0, len(table.history()) - 1


def test_flush_bytes_commits_a_backlog_before_the_interval(warehouse: Path) -> None:
    layout = Layout(warehouse)
    gw = Gateway(warehouse, "--flush-interval", "600", "--flush-bytes", "200000").start()
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": "FLAGS", "subjects": ["flags.>"]}).status_code == 201
            base = _committed(layout)
            small = [{"subject": "flags.a", "text": "x" * 1000} for _ in range(50)]  # about 50 KB: under the bound
            assert all("seq" in a for a in c.post("/v1/publish", json={"messages": small}).json()["acks"])
            assert c.post("/v1/publish", json={"messages": small}).status_code == 200
            large = [{"subject": "flags.a", "text": "y" * 1000} for _ in range(150)]  # now past 200,000 bytes
            last = c.post("/v1/publish", json={"messages": large}).json()["acks"][-1]["seq"]
            deadline = time.monotonic() + 60  # the flush interval is 600 s: only the byte bound can flush
            while _committed(layout)[0] < last:
                assert time.monotonic() < deadline, "the backlog past --flush-bytes was not committed"
                time.sleep(0.1)
            version, commits = _committed(layout)
            assert (version, commits - base[1]) == (last, 1), "one commit of the whole backlog: the small ones waited"
            metrics = c.get("/metrics").text
            assert 'jetlake_stream_unflushed_bytes{stream="FLAGS"} 0' in metrics
    finally:
        gw.stop()
