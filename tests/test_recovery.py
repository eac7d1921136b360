"""Kill -9 under load, a torn log tail, restart: every acknowledged message is there exactly once."""

from __future__ import annotations

import base64
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable

from api.binary_batch import MEDIA_TYPE, encode
from tests.gateway import JETLAKE, Gateway

STREAM = "REC"


def _publisher(url: str, worker: int, stop: threading.Event, acked: dict[str, int], lock: threading.Lock) -> None:
    n = 0
    with httpx.Client(base_url=url, timeout=5.0) as client:
        while not stop.is_set() and n < 20_000:
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


def _tear_log_tail(warehouse: Path) -> Path:
    segments = sorted((warehouse / "default" / "_wal" / STREAM).glob("*.wal"))
    assert segments, "the kill left no unflushed log segment"
    with open(segments[-1], "ab") as f:
        f.write(b"JLW2\x01" + b"\x00" * 7 + b"\xff\xff\x00\x00partial")
    return segments[-1]


def test_kill9_under_load_loses_no_acknowledged_message(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.4").start()
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["rec.>"]}).status_code == 201
        acked: dict[str, int] = {}
        lock = threading.Lock()
        stop = threading.Event()
        workers = [threading.Thread(target=_publisher, args=(gw.url, w, stop, acked, lock)) for w in range(3)]
        for t in workers:
            t.start()
        time.sleep(1.3)
        gw.kill9()
        stop.set()
        for t in workers:
            t.join(timeout=10)
    finally:
        gw.stop()
    assert len(acked) > 100
    torn = _tear_log_tail(warehouse)
    size_with_tear = torn.stat().st_size

    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        try:
            assert torn.stat().st_size < size_with_tear, "the torn tail was cut"
        except FileNotFoundError:
            pass  # already flushed and deleted by the restarted gateway: the tear was cut before that
        with gw.client() as c:
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            last = state["last_seq"]
            assert last >= max(acked.values())
            assert state["messages"] == last and state["first_seq"] == 1 and state["num_deleted"] == 0
            for msg_id, seq in list(acked.items())[::7]:
                msg = c.get(f"/v1/streams/{STREAM}/messages/{seq}").json()["message"]
                assert msg["headers"]["Nats-Msg-Id"] == [msg_id]
            again_id, again_seq = next(iter(acked.items()))
            dup = c.post("/v1/publish/rec.0.0", content=b"again", headers={"Nats-Msg-Id": again_id}).json()
            assert dup == {"stream": STREAM, "seq": again_seq, "duplicate": True}
            fresh = c.post("/v1/publish/rec.0.0", content=b"fresh").json()
            assert fresh["seq"] == last + 1
        _wait_flushed(warehouse, last + 1)
    finally:
        gw.stop()
    table = DeltaTable(str(warehouse / "default" / "streams" / STREAM)).to_pyarrow_table(columns=["seq", "msg_id"])
    seqs = sorted(table.column("seq").to_pylist())
    assert seqs == list(range(1, last + 2)), "every message exactly once in the Delta table"
    ids = dict(zip(table.column("msg_id").to_pylist(), table.column("seq").to_pylist(), strict=True))
    assert all(ids[msg_id] == seq for msg_id, seq in acked.items())


def _wait_flushed(warehouse: Path, last_seq: int, timeout: float = 15.0) -> None:
    path = warehouse / "default" / "streams" / STREAM
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (DeltaTable(str(path)).transaction_version(_stream_id(warehouse)) or 0) >= last_seq:
            return
        time.sleep(0.1)
    pytest.fail("the flusher did not commit the recovered log")


def _stream_id(warehouse: Path) -> str:
    import orjson

    record = orjson.loads((warehouse / "default" / "_system" / "streams" / f"{STREAM}.json").read_bytes())
    return str(record["stream_id"])


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


def _binary_publisher(url: str, worker: int, stop: threading.Event, acked: dict[int, bytes], lock: threading.Lock) -> None:
    """Binary batches without headers (the columnar path), 200 a request, payloads naming themselves."""
    n = 0
    with httpx.Client(base_url=url, timeout=5.0) as client:
        while not stop.is_set() and n < 40_000:
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


def test_kill9_during_columnar_batches_loses_no_acknowledged_message(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.4").start()
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["rec.>"]}).status_code == 201
        acked: dict[int, bytes] = {}
        lock = threading.Lock()
        stop = threading.Event()
        workers = [threading.Thread(target=_binary_publisher, args=(gw.url, w, stop, acked, lock)) for w in range(3)]
        for t in workers:
            t.start()
        time.sleep(1.3)
        gw.kill9()
        stop.set()
        for t in workers:
            t.join(timeout=10)
    finally:
        gw.stop()
    assert len(acked) > 1000
    _tear_log_tail(warehouse)

    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gw.client() as c:
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            last = state["last_seq"]
            assert last >= max(acked) and state["messages"] == last and state["num_deleted"] == 0
            for seq in sorted(acked)[::97]:
                msg = c.get(f"/v1/streams/{STREAM}/messages/{seq}").json()["message"]
                assert base64.b64decode(msg["data"]) == acked[seq]
            fresh = c.post("/v1/publish", content=encode([("rec.0", b"fresh", None)]), headers={"content-type": MEDIA_TYPE})
            assert fresh.json()["acks"] == [{"stream": STREAM, "seq": last + 1}]
        _wait_flushed(warehouse, last + 1)
    finally:
        gw.stop()
    table = DeltaTable(str(warehouse / "default" / "streams" / STREAM)).to_pyarrow_table(columns=["seq", "data"])
    assert sorted(table.column("seq").to_pylist()) == list(range(1, last + 2)), "every message exactly once"
    stored = dict(zip(table.column("seq").to_pylist(), table.column("data").to_pylist(), strict=True))
    assert all(stored[seq] == payload for seq, payload in acked.items())
