"""Kill -9 under load, a torn log tail, restart: every acknowledged message is there exactly once.

The publishers run until the kill (they stop only when the gateway is gone), and the kill comes
once the flusher has committed some of the load, so that at the kill part of what was acknowledged
is in the Delta table and part only in the log: the test checks both before it restarts.
"""

from __future__ import annotations

import base64
import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import orjson
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from api.http.binary_batch import MEDIA_TYPE, encode
from engine.store.layout import Layout
from engine.store.wal import read_segment
from tests.gateway import JETLAKE, Gateway

STREAM = "REC"
T = TypeVar("T")

Publisher = Callable[[str, int, threading.Event, dict, threading.Lock], None]


def _publisher(url: str, worker: int, stop: threading.Event, acked: dict[str, int], lock: threading.Lock) -> None:
    """JSON batches of 25 with message ids, until stopped or the gateway is gone."""
    n = 0
    with httpx.Client(base_url=url, timeout=5.0) as client:
        while not stop.is_set():
            batch = [
                {"subject": f"rec.{worker}.{(n + i) % 7}", "text": f"w{worker}-{n + i}",
                 "headers": {"Nats-Msg-Id": [f"w{worker}-{n + i}"]}}
                for i in range(25)
            ]
            n += len(batch)
            try:
                answer = client.post("/v1/publish", json={"messages": batch})
            except httpx.HTTPError:
                return
            if answer.status_code != 200:
                return
            with lock:
                for msg, ack in zip(batch, answer.json()["acks"], strict=True):
                    assert "seq" in ack, ack
                    acked[msg["headers"]["Nats-Msg-Id"][0]] = ack["seq"]


def _binary_publisher(url: str, worker: int, stop: threading.Event, acked: dict[int, bytes], lock: threading.Lock) -> None:
    """Binary batches without headers (the columnar path), 200 a request, payloads naming themselves."""
    n = 0
    with httpx.Client(base_url=url, timeout=5.0) as client:
        while not stop.is_set():
            payloads = [f"b{worker}-{n + i:08d}".encode() for i in range(200)]
            n += len(payloads)
            body = encode([(f"rec.{worker}", p, None) for p in payloads])
            try:
                answer = client.post("/v1/publish", content=body, headers={"content-type": MEDIA_TYPE})
            except httpx.HTTPError:
                return
            if answer.status_code != 200:
                return
            with lock:
                for payload, ack in zip(payloads, answer.json()["acks"], strict=True):
                    acked[ack["seq"]] = payload


def _flushed(warehouse: Path) -> int:
    """The last sequence committed to the stream's Delta table (its app transaction), 0 before any."""
    layout = Layout(warehouse)
    stream_id = str(orjson.loads(layout.stream_config(STREAM).read_bytes())["stream_id"])
    try:
        return DeltaTable(str(layout.stream_table(STREAM))).transaction_version(stream_id) or 0
    except TableNotFoundError:
        return 0


def _logged_records(warehouse: Path) -> int:
    return sum(len(read_segment(p)[0]) for p in sorted(Layout(warehouse).wal_dir(STREAM).glob("*.wal")))


def _kill_under_load(gw: Gateway, publisher: Publisher, acked: dict, least: int) -> None:
    """Publishes from three threads until the gateway is killed; the kill comes once `least` messages
    are acknowledged and the flusher has committed some of them, while every publisher still runs."""
    lock = threading.Lock()
    stop = threading.Event()
    workers = [threading.Thread(target=publisher, args=(gw.url, w, stop, acked, lock)) for w in range(3)]
    for t in workers:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(acked) < least or _flushed(gw.warehouse) == 0:
            assert time.monotonic() < deadline, f"{len(acked)} acknowledged, {_flushed(gw.warehouse)} flushed after 60 s"
            assert all(t.is_alive() for t in workers), "a publisher stopped before the kill"
            time.sleep(0.05)
        assert all(t.is_alive() for t in workers), "the load runs at the kill"
        gw.kill9()
    finally:
        stop.set()
        for t in workers:
            t.join(timeout=10)


def _assert_log_holds_unflushed(warehouse: Path, last_acked: int) -> None:
    """What the restart must recover: acknowledged messages past the table's last commit, in the log."""
    assert last_acked > _flushed(warehouse), "acknowledged messages were only in the log at the kill"
    assert _logged_records(warehouse) > 0, "the kill left unflushed records in a log segment"


def _tear_log_tail(warehouse: Path) -> tuple[Path, int]:
    """Appends half a record to the last segment, as a write cut by a crash leaves it."""
    segments = sorted(Layout(warehouse).wal_dir(STREAM).glob("*.wal"))
    with open(segments[-1], "ab") as f:
        f.write(b"JLW2\x01" + b"\x00" * 7 + b"\xff\xff\x00\x00partial")
    return segments[-1], segments[-1].stat().st_size


def _sample(items: list[T], n: int = 200) -> list[T]:
    """About `n` items spread evenly, first and last included: point reads across the whole load."""
    step = max(len(items) // n, 1)
    return items[::step] + items[-1:]


def _flush_all(c: httpx.Client, warehouse: Path, last_seq: int) -> None:
    assert c.post("/v1/flush").json()["success"] is True
    assert _flushed(warehouse) >= last_seq, "the flush committed the recovered log"


def test_kill9_under_load_loses_no_acknowledged_message(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.4").start()
    acked: dict[str, int] = {}
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["rec.>"]}).status_code == 201
        _kill_under_load(gw, _publisher, acked, least=300)
    finally:
        gw.stop()
    _assert_log_holds_unflushed(warehouse, max(acked.values()))
    torn, size_with_tear = _tear_log_tail(warehouse)

    gw = Gateway(warehouse, "--flush-interval", "60").start()  # no flush before the tear is checked
    try:
        assert torn.stat().st_size < size_with_tear, "the torn tail was cut"
        with gw.client() as c:
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            last = state["last_seq"]
            assert last >= max(acked.values())
            assert state["messages"] == last and state["first_seq"] == 1 and state["num_deleted"] == 0
            for msg_id, seq in _sample(list(acked.items())):
                msg = c.get(f"/v1/streams/{STREAM}/messages/{seq}").json()["message"]
                assert msg["headers"]["Nats-Msg-Id"] == [msg_id]
            again_id, again_seq = next(iter(acked.items()))
            dup = c.post("/v1/publish/rec.0.0", content=b"again", headers={"Nats-Msg-Id": again_id}).json()
            assert dup == {"stream": STREAM, "seq": again_seq, "duplicate": True}
            fresh = c.post("/v1/publish/rec.0.0", content=b"fresh").json()
            assert fresh["seq"] == last + 1
            _flush_all(c, warehouse, last + 1)
    finally:
        gw.stop()
    table = DeltaTable(str(Layout(warehouse).stream_table(STREAM))).to_pyarrow_table(columns=["seq", "msg_id"])
    seqs = sorted(table.column("seq").to_pylist())
    assert seqs == list(range(1, last + 2)), "every message exactly once in the Delta table"
    ids = dict(zip(table.column("msg_id").to_pylist(), table.column("seq").to_pylist(), strict=True))
    assert all(ids[msg_id] == seq for msg_id, seq in acked.items())


def test_second_gateway_on_the_same_warehouse_is_refused(warehouse: Path) -> None:
    gw = Gateway(warehouse).start()
    try:
        second = subprocess.run(
            [str(JETLAKE), "serve", "--warehouse", str(warehouse), "--port", "0"],
            capture_output=True, text=True, timeout=30,
        )
        assert second.returncode == 2
        assert "already owns the warehouse" in second.stderr
        with gw.client() as c:
            assert c.get("/healthz").status_code == 200
    finally:
        gw.stop()


def test_kill9_during_columnar_batches_loses_no_acknowledged_message(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.4").start()
    acked: dict[int, bytes] = {}
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["rec.>"]}).status_code == 201
        _kill_under_load(gw, _binary_publisher, acked, least=3000)
    finally:
        gw.stop()
    _assert_log_holds_unflushed(warehouse, max(acked))
    torn, size_with_tear = _tear_log_tail(warehouse)

    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        assert torn.stat().st_size < size_with_tear, "the torn tail was cut"
        with gw.client() as c:
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            last = state["last_seq"]
            assert last >= max(acked) and state["messages"] == last and state["num_deleted"] == 0
            for seq in _sample(sorted(acked)):
                msg = c.get(f"/v1/streams/{STREAM}/messages/{seq}").json()["message"]
                assert base64.b64decode(msg["data"]) == acked[seq]
            fresh = c.post("/v1/publish", content=encode([("rec.0", b"fresh", None)]), headers={"content-type": MEDIA_TYPE})
            assert fresh.json()["acks"] == [{"stream": STREAM, "seq": last + 1}]
            _flush_all(c, warehouse, last + 1)
    finally:
        gw.stop()
    table = DeltaTable(str(Layout(warehouse).stream_table(STREAM))).to_pyarrow_table(columns=["seq", "data"])
    assert sorted(table.column("seq").to_pylist()) == list(range(1, last + 2)), "every message exactly once"
    stored = dict(zip(table.column("seq").to_pylist(), table.column("data").to_pylist(), strict=True))
    assert all(stored[seq] == payload for seq, payload in acked.items())


def test_streams_made_or_changed_before_a_kill9_are_found_after_the_restart(warehouse: Path) -> None:
    """The catalog copy (engine/catalog_store.py) is written at a clean stop and read at the next start;
    what changed after it is found by its marks: an acknowledged create, consumer and update before a
    kill -9, and a create killed just after its config record was written (never acknowledged: the
    record, the truth, decides)."""
    gw = Gateway(warehouse).start()
    with gw.client() as c:
        assert c.post("/v1/streams", json={"name": "OLD", "subjects": ["old.>"]}).status_code == 201
    gw.stop()  # the copy holds OLD

    gw = Gateway(warehouse).start()
    with gw.client() as c:
        assert c.post("/v1/streams", json={"name": "NEW", "subjects": ["new.>"], "max_msgs": 5}).status_code == 201
        c.post("/v1/streams/NEW/consumers", json={"durable_name": "W", "ack_policy": "explicit"}).raise_for_status()
        c.put("/v1/streams/OLD", json={"name": "OLD", "subjects": ["old.>", "older.>"]}).raise_for_status()
    gw.kill9()

    gw = Gateway(warehouse, env={"JETLAKE_FAILPOINTS": "stream.config=kill_after"}).start()
    with gw.client() as c, contextlib.suppress(httpx.HTTPError):
        c.post("/v1/streams", json={"name": "HALF", "subjects": ["half.>"]})
    assert gw.proc is not None and gw.proc.wait(timeout=30) == -9
    gw.proc = None

    gw = Gateway(warehouse).start()
    try:
        with gw.client() as c:
            assert c.get("/v1/streams").json()["total"] == 3
            assert c.get("/v1/streams/OLD").json()["config"]["subjects"] == ["old.>", "older.>"]
            assert c.get("/v1/streams/NEW").json()["config"]["max_msgs"] == 5
            assert [x["name"] for x in c.get("/v1/streams/NEW/consumers").json()["consumers"]] == ["W"]
            assert c.get("/v1/streams/HALF").json()["config"]["subjects"] == ["half.>"]
    finally:
        gw.stop()
