"""A real gateway on a real S3 server (versitygw on loopback): `jetlake serve --warehouse s3://…`.

Streams, consumers with acks and KV work on an S3 warehouse; every shared object (configs, tables,
leases, snapshots) is in the bucket and only the write-ahead log is on local disk; a restart, even
after kill -9, brings everything back; a second gateway on the same warehouse is refused.
"""

from __future__ import annotations

import base64
import os
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.store.objectstore import WarehouseLocation
from tests.gateway import JETLAKE, Gateway, free_port
from tests.s3 import S3Server

STREAM = "ORDERS"


def _gateway(s3: S3Server, warehouse: str, tmp_path: Path) -> Gateway:
    return Gateway(warehouse, "--wal-dir", str(tmp_path / "state"), "--flush-interval", "0.2",
                   env=s3.env, log_dir=tmp_path)


def _publish(c: httpx.Client, first: int, count: int) -> list[int]:
    batch = [{"subject": f"orders.{i % 3}", "text": f"order-{i}"} for i in range(first, first + count)]
    answer = c.post("/v1/publish", json={"messages": batch})
    assert answer.status_code == 200, answer.text
    return [ack["seq"] for ack in answer.json()["acks"]]


def _pull_and_ack(c: httpx.Client, n: int) -> list[dict]:
    msgs = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json={"batch": n, "no_wait": True}).json()["messages"]
    answer = c.post(f"/v1/streams/{STREAM}/consumers/C/ack", json={"acks": [{"token": m["ack"]} for m in msgs]})
    assert answer.status_code == 200, answer.text
    return msgs


def _keys(location: WarehouseLocation) -> list[str]:
    return [meta.key for meta in location.open().list()]


def _state(c: httpx.Client) -> tuple[dict, dict]:
    stream = c.get(f"/v1/streams/{STREAM}").json()["state"]
    consumer = c.get(f"/v1/streams/{STREAM}/consumers/C").json()
    return stream, consumer


def test_a_gateway_serves_an_s3_warehouse_and_recovers_it(s3_server: S3Server, tmp_path: Path) -> None:
    prefix = "gw-" + tmp_path.name[-20:].lower().replace("_", "-")
    warehouse = s3_server.warehouse(prefix)
    location = WarehouseLocation.parse(warehouse, s3_server.env)
    gw = _gateway(s3_server, warehouse, tmp_path).start(timeout=60)
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            assert _publish(c, 1, 50) == list(range(1, 51))
            consumer = {"durable_name": "C", "ack_policy": "explicit"}
            assert c.post(f"/v1/streams/{STREAM}/consumers", json=consumer).status_code == 201
            assert [m["seq"] for m in _pull_and_ack(c, 20)] == list(range(1, 21))
            assert c.post("/v1/kv", json={"bucket": "cfg"}).status_code == 201
            assert c.put("/v1/kv/cfg/entries/app.timeout", content=b"45s").status_code == 200
            assert c.put("/v1/kv/cfg/entries/app.retries", content=b"3").status_code == 200
            assert c.post("/v1/flush").status_code == 200
            before = _state(c)

        keys = _keys(location)
        for expected in ("default/_system/streams/ORDERS.json", "default/_system/consumers/ORDERS/C.json",
                         "default/_system/leases/owner.json", "default/_system/streams/KV_cfg.json"):
            assert expected in keys, keys
        for table in ("default/streams/ORDERS/", "default/streams/KV_cfg/", "default/_system/acks/",
                      "default/_system/tombstones/"):
            assert any(k.startswith(table + "_delta_log/") for k in keys), table
            assert table.startswith("default/_system/tombstones") or any(
                k.startswith(table) and k.endswith(".parquet") for k in keys), table
        local = sorted(p.relative_to(tmp_path / "state").as_posix() for p in (tmp_path / "state").rglob("*"))
        assert "default/_wal/ORDERS" in local, local
        assert all("default/_wal".startswith(p) or p.startswith("default/_wal/") for p in local), local

        refused = subprocess.run(
            [str(JETLAKE), "serve", "--warehouse", warehouse, "--wal-dir", str(tmp_path / "second"),
             "--port", str(free_port()), "--nats-port", "0"],
            env={**os.environ, **s3_server.env}, capture_output=True, timeout=60,
        )
        assert refused.returncode == 2 and b"already owns the warehouse" in refused.stderr, refused.stderr[-2000:]

        gw.stop()
        gw.start(timeout=60)
        with gw.client() as c:
            stream, consumer = _state(c)
            assert stream == {**before[0], **{k: stream[k] for k in ("first_ts", "last_ts") if k in stream}}
            assert (stream["messages"], stream["first_seq"], stream["last_seq"]) == (50, 1, 50)
            assert consumer["ack_floor"]["stream_seq"] == 20 and consumer["num_ack_pending"] == 0
            first = c.get(f"/v1/streams/{STREAM}/messages/1")
            assert first.status_code == 200, first.text  # read back from a Parquet file in the bucket
            assert base64.b64decode(first.json()["message"]["data"]) == b"order-1"
            assert c.get("/v1/kv/cfg/entries/app.timeout").content == b"45s"
            assert [m["seq"] for m in _pull_and_ack(c, 5)] == list(range(21, 26))
            assert _publish(c, 51, 10) == list(range(51, 61))  # in the local log, maybe not yet in the table

        gw.kill9()
        gw.start(timeout=60)  # the dead owner's lease is taken at once: its process is gone
        with gw.client() as c:
            stream, consumer = _state(c)
            assert (stream["messages"], stream["last_seq"]) == (60, 60)
            assert consumer["ack_floor"]["stream_seq"] == 25
            assert [m["seq"] for m in _pull_and_ack(c, 40)] == list(range(26, 61))
    finally:
        gw.stop()


@pytest.mark.parametrize(("warehouse", "says"), [("s3://jl/x", b"invalid bucket name 'jl'"),
                                                  ("ftp://bucket/x", b"unsupported warehouse")])
def test_a_bad_warehouse_uri_is_refused_at_start(warehouse: str, says: bytes) -> None:
    answer = subprocess.run([str(JETLAKE), "serve", "--warehouse", warehouse, "--nats-port", "0",
                             "--port", str(free_port())], capture_output=True, timeout=60)
    assert answer.returncode == 2 and says in answer.stderr, answer.stderr[-2000:]


def test_a_standby_gateway_takes_the_warehouse_when_the_owner_goes(s3_server: S3Server, tmp_path: Path) -> None:
    """`--takeover-wait`: a second gateway waits for the owner's lease instead of refusing to start."""
    warehouse = s3_server.warehouse()
    owner = _gateway(s3_server, warehouse, tmp_path).start(timeout=60)
    standby = Gateway(warehouse, "--wal", "object", "--takeover-wait", "120", "--wal-dir", str(tmp_path / "two"),
                      env=s3_server.env, log_dir=tmp_path)
    started: list[BaseException | None] = []
    try:
        with owner.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            assert _publish(c, 1, 5) == [1, 2, 3, 4, 5]
        waiter = threading.Thread(target=lambda: started.append(_start(standby)))
        waiter.start()
        deadline = time.monotonic() + 30
        while standby.proc is None or b"waiting up to" not in standby.log.read_bytes():
            assert time.monotonic() < deadline, "the standby did not start waiting"
            time.sleep(0.1)  # the standby runs and is not serving while the owner lives
        assert standby.proc is not None and standby.proc.poll() is None and not started
        owner.stop()  # a clean stop releases the owner lease
        waiter.join(timeout=120)
        assert started == [None], started
        with standby.client() as c:
            assert c.get(f"/v1/streams/{STREAM}").json()["state"]["last_seq"] == 5
            assert _publish(c, 6, 1) == [6]
    finally:
        owner.stop()
        standby.stop()


def _start(gw: Gateway) -> BaseException | None:
    try:
        gw.start(timeout=120)
        return None
    except BaseException as exc:  # noqa: BLE001 - handed to the test thread
        return exc
