"""`jetlake serve --wal object` on the real S3 server: the log is in the bucket, so after a kill -9
another gateway with nothing on its own disk (another machine's, here another `--wal-dir`) takes the
warehouse over and serves every acknowledged message and ack, the sequence going on without a gap."""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path

import httpx

from engine.store.objectstore import WarehouseLocation
from tests.gateway import Gateway
from tests.s3 import S3Server

STREAM = "ORDERS"


def _gateway(s3: S3Server, warehouse: str, state: Path) -> Gateway:
    # A long flush interval: what is acknowledged stays in the log objects until the kill.
    return Gateway(warehouse, "--wal", "object", "--wal-dir", str(state), "--flush-interval", "600",
                   env=s3.env, log_dir=state.parent)


def _publisher(url: str, worker: int, stop: threading.Event, acked: dict[int, bytes], lock: threading.Lock) -> None:
    """Batches of 10 until stopped or the gateway is gone; records what was acknowledged."""
    n = 0
    with httpx.Client(base_url=url, timeout=5.0) as client:
        while not stop.is_set():
            texts = [f"w{worker}-{n + i}" for i in range(10)]
            n += 10
            try:
                answer = client.post("/v1/publish", json={"messages": [{"subject": f"orders.{worker}", "text": t}
                                                                       for t in texts]})
            except httpx.HTTPError:
                return
            if answer.status_code != 200:
                return
            with lock:
                for text, ack in zip(texts, answer.json()["acks"], strict=True):
                    acked[ack["seq"]] = text.encode()


def test_another_gateway_takes_over_an_object_log_after_a_kill(s3_server: S3Server, tmp_path: Path) -> None:
    warehouse = s3_server.warehouse()
    location = WarehouseLocation.parse(warehouse, s3_server.env)
    first = _gateway(s3_server, warehouse, tmp_path / "machine-1").start(timeout=60)
    second = _gateway(s3_server, warehouse, tmp_path / "machine-2")
    acked: dict[int, bytes] = {}
    lock = threading.Lock()
    stop = threading.Event()
    try:
        with first.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            consumer = {"durable_name": "C", "ack_policy": "explicit"}
            assert c.post(f"/v1/streams/{STREAM}/consumers", json=consumer).status_code == 201
            workers = [threading.Thread(target=_publisher, args=(first.url, w, stop, acked, lock)) for w in range(2)]
            for t in workers:
                t.start()
            deadline = time.monotonic() + 60
            while len(acked) < 200:
                assert time.monotonic() < deadline, f"{len(acked)} acknowledged after 60 s"
                time.sleep(0.05)
            pull = {"batch": 50, "no_wait": True}
            msgs = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json=pull).json()["messages"]
            assert c.post(f"/v1/streams/{STREAM}/consumers/C/ack",
                          json={"acks": [{"token": m["ack"]} for m in msgs]}).status_code == 200
            acked_by_consumer = [m["seq"] for m in msgs]
            assert acked_by_consumer == list(range(1, 51))
        assert all(t.is_alive() for t in workers), "the load runs at the kill"
        first.kill9()
        stop.set()
        for t in workers:
            t.join(timeout=10)

        log_objects = [m.key for m in location.open().list("default/_log")]
        assert any(k.startswith(f"default/_log/{STREAM}/") for k in log_objects), log_objects
        assert any(k.startswith("default/_log/.acks/") for k in log_objects), log_objects
        local = [p for p in (tmp_path / "machine-1").rglob("*") if p.is_file()]
        assert local == [], f"nothing of the log is on the dead gateway's disk: {local}"

        started = time.monotonic()
        second.start(timeout=60)
        took_over = time.monotonic() - started
        with second.client() as c:
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            # A batch logged at the kill and never answered may be there too (at most one per publisher).
            assert (state["first_seq"], state["messages"]) == (1, state["last_seq"]), "no gap"
            assert max(acked) <= state["last_seq"] <= max(acked) + 10 * len(workers), (state, max(acked))
            assert set(acked) <= set(range(1, state["last_seq"] + 1))
            for seq in (1, max(acked) // 2, max(acked)):
                got = c.get(f"/v1/streams/{STREAM}/messages/{seq}").json()["message"]
                assert base64.b64decode(got["data"]) == acked[seq]
            info = c.get(f"/v1/streams/{STREAM}/consumers/C").json()
            assert info["ack_floor"]["stream_seq"] == 50
            again = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json={"batch": 10, "no_wait": True}).json()
            assert [m["seq"] for m in again["messages"]] == list(range(51, 61)), "acked messages are not redelivered"
            answer = c.post("/v1/publish", json={"messages": [{"subject": "orders.9", "text": "after"}]})
            assert answer.json()["acks"][0]["seq"] == state["last_seq"] + 1, "the sequence goes on: no gap, no reuse"
            assert c.post("/v1/flush").status_code == 200
        left = [m.key for m in location.open().list(f"default/_log/{STREAM}") if m.key.endswith(".wal")]
        assert left == [], f"log objects committed to the table are removed: {left}"
        print(f"takeover: the second gateway served {len(acked)} messages {took_over:.2f}s after it started")
    finally:
        stop.set()
        first.stop()
        second.stop()
