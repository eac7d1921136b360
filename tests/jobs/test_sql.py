"""SQL sees exactly what the API returns: after publishes, deletes, purges, limit and max_age removals.

One real gateway with a long flush interval, so the test decides when the log reaches the tables
(`POST /v1/flush`, as `jetlake sql` does) and the views must hide what the tombstones name.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession

from jobs.sql import register_views
from tests.gateway import Gateway

pytestmark = pytest.mark.spark

Message = tuple[int, str, bytes, dict[str, list[str]] | None]


@pytest.fixture
def slow_gateway(warehouse: Path) -> Iterator[Gateway]:
    gw = Gateway(warehouse, "--flush-interval", "600").start()
    yield gw
    gw.stop()


def _api_messages(client: httpx.Client, stream: str) -> list[Message]:
    info = client.get(f"/v1/streams/{stream}").json()
    out = []
    for seq in range(1, info["state"]["last_seq"] + 1):
        r = client.get(f"/v1/streams/{stream}/messages/{seq}")
        if r.status_code == 404:
            continue
        m = r.json()["message"]
        out.append((m["seq"], m["subject"], base64.b64decode(m.get("data") or ""), m.get("headers") or None))
    assert len(out) == info["state"]["messages"]
    return out


def _sql_messages(spark: SparkSession, stream: str) -> list[Message]:
    rows = spark.sql(f"SELECT seq, subject, data, text, headers FROM `{stream}` ORDER BY seq").collect()
    out = []
    for r in rows:
        data = bytes(r.data) if r.data is not None else b""
        assert r.text == data.decode(), "text is data as UTF-8"
        out.append((r.seq, r.subject, data, {k: list(v) for k, v in r.headers.items()} if r.headers else None))
    return out


def _publish(client: httpx.Client, messages: list[dict]) -> list[int]:
    acks = client.post("/v1/publish", json={"messages": messages}).json()["acks"]
    assert all("seq" in a for a in acks), acks
    return [a["seq"] for a in acks]


def _flush(client: httpx.Client) -> int:
    r = client.post("/v1/flush")
    assert r.status_code == 200 and r.json()["success"] is True, r.text
    return int(r.json()["commits"])


def _agree(client: httpx.Client, spark: SparkSession, stream: str) -> list[Message]:
    api = _api_messages(client, stream)
    assert _sql_messages(spark, stream) == api
    return api


def test_sql_and_api_agree_after_deletes_purges_and_limits(
    slow_gateway: Gateway, warehouse: Path, spark: SparkSession
) -> None:
    assert register_views(spark, warehouse) == [], "an empty warehouse registers nothing and does not fail"
    with slow_gateway.client() as c:
        assert c.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}).status_code == 201
        assert c.post("/v1/streams", json={"name": "LIMITED", "subjects": ["lim.*"], "max_msgs": 5}).status_code == 201
        assert c.post("/v1/streams", json={"name": "AGED", "subjects": ["aged"], "max_age": 1_000_000_000}).status_code == 201
        assert c.post("/v1/streams", json={"name": "MEM", "subjects": ["mem"], "storage": "memory"}).status_code == 201

        regions = ["eu", "us", "asia"]
        _publish(c, [
            {"subject": f"orders.{regions[i % 3]}", "text": f"order {i} ✓", **({"headers": {"Trace": [f"t{i}", "x"]}} if i % 4 == 0 else {})}
            for i in range(24)
        ])
        _publish(c, [{"subject": f"lim.{i % 2}", "text": f"l{i}"} for i in range(12)])
        _publish(c, [{"subject": "aged", "text": "old"}] * 3)
        _publish(c, [{"subject": "mem", "text": "m"}])

        views = register_views(spark, warehouse)
        assert views == ["AGED", "LIMITED", "ORDERS"], "memory streams have no table"
        assert spark.sql("SELECT count(*) AS n FROM ORDERS").first().n == 0, "nothing flushed yet"
        assert _flush(c) >= 3
        orders = _agree(c, spark, "ORDERS")
        assert len(orders) == 24
        limited = _agree(c, spark, "LIMITED")
        assert [m[0] for m in limited] == list(range(8, 13)), "discard old kept the last 5"

        # Deletes (with and without erasure), a purge by subject, a purge keeping the last 2.
        assert c.delete("/v1/streams/ORDERS/messages/2", params={"no_erase": "true"}).json() == {"success": True}
        assert c.delete("/v1/streams/ORDERS/messages/5").status_code == 200
        assert c.post("/v1/streams/ORDERS/purge", json={"filter": "orders.asia"}).json()["purged"] == 8
        assert c.post("/v1/streams/ORDERS/purge", json={"filter": "orders.eu", "keep": 2}).json()["success"]
        _publish(c, [{"subject": "orders.asia", "text": "after purge"}, {"subject": "lim.0", "text": "l12"}])
        _flush(c)
        orders = _agree(c, spark, "ORDERS")  # the same views, registered before: they read the latest tables
        assert {m[1] for m in orders} == {"orders.eu", "orders.us", "orders.asia"}
        assert sum(m[1] == "orders.eu" for m in orders) == 2
        assert [m[2] for m in orders if m[1] == "orders.asia"] == [b"after purge"]
        assert 5 not in {m[0] for m in orders}
        limited = _agree(c, spark, "LIMITED")
        assert [m[0] for m in limited] == list(range(9, 14))

        # max_age: expired messages leave SQL at the query's time, whether or not a tombstone says so yet.
        time.sleep(1.3)
        assert spark.sql("SELECT count(*) AS n FROM AGED").first().n == 0
        # A longer max_age before the next message, so a slow query cannot see it age out (views read the config).
        aged = {"name": "AGED", "subjects": ["aged"], "max_age": 3_600_000_000_000}
        assert c.put("/v1/streams/AGED", json=aged).status_code == 200
        register_views(spark, warehouse)
        _publish(c, [{"subject": "aged", "text": "new"}])
        _flush(c)
        assert [m[2] for m in _agree(c, spark, "AGED")] == [b"new"]

        # A purge of everything, then new messages.
        c.post("/v1/streams/LIMITED/purge", json={})
        _publish(c, [{"subject": "lim.1", "text": "fresh"}])
        _flush(c)
        assert [m[2] for m in _agree(c, spark, "LIMITED")] == [b"fresh"]

        grouped = spark.sql("SELECT subject, count(*) AS n FROM ORDERS GROUP BY subject").collect()
        assert {r.subject: r.n for r in grouped} == {s: sum(m[1] == s for m in orders) for s in {m[1] for m in orders}}


def test_kv_buckets_are_tables_of_current_values(gateway: Gateway, warehouse: Path, spark: SparkSession) -> None:
    """A KV bucket is a stream `KV_<bucket>` over `$KV.<bucket>.>`; its view holds each key's latest live value."""
    def put(key: str, text: str, op: str | None = None) -> None:
        msg: dict = {"subject": f"$KV.cfg.{key}", "text": text}
        if op:
            msg["headers"] = {"KV-Operation": [op]}
        _publish(c, [msg])

    with gateway.client() as c:
        assert c.post("/v1/streams", json={"name": "KV_cfg", "subjects": ["$KV.cfg.>"], "max_msgs_per_subject": 3}).status_code == 201
        put("a", "1")
        put("a", "2")
        put("b", "x")
        put("b", "", "DEL")
        put("c", "y")
        put("c", "", "PURGE")
        put("d/e", "deep")
        put("f", "kept")
        put("f", "gone")
        c.delete(f"/v1/streams/KV_cfg/messages/{c.get('/v1/streams/KV_cfg').json()['state']['last_seq']}",
                 params={"no_erase": "true"})
        _flush(c)
        views = register_views(spark, warehouse)
        assert views == ["KV_cfg", "kv_cfg_values"]
        rows = spark.sql("SELECT bucket, key, revision, value, text FROM kv_cfg_values ORDER BY key").collect()
        assert [(r.bucket, r.key, r.text, bytes(r.value)) for r in rows] == [
            ("cfg", "a", "2", b"2"), ("cfg", "d/e", "deep", b"deep"), ("cfg", "f", "kept", b"kept"),
        ]
        for r in rows:
            api = c.get("/v1/streams/KV_cfg/messages", params={"last_by_subj": f"$KV.cfg.{r.key}"}).json()["message"]
            assert api["seq"] == r.revision
