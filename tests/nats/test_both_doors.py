"""One stream, two doors: what is published over HTTP is consumed over NATS and the other way round,
and SQL (Spark, over the Delta table) sees every message of both."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import nats
import pytest
from nats.js.api import ConsumerConfig
from pyspark.sql import SparkSession

from jobs.sql import register_views
from tests.gateway import Gateway


@pytest.mark.spark
def test_publish_on_one_door_consume_on_the_other_and_sql_sees_both(gateway: Gateway, spark: SparkSession) -> None:
    http = gateway.client()
    assert http.post("/v1/streams", json={"name": "SHARED", "subjects": ["shared.>"]}).status_code == 201
    for i in range(5):
        assert http.post(f"/v1/publish/shared.http", content=b"http-%d" % i).json() == {"stream": "SHARED", "seq": i + 1}
    http_consumer = {"durable_name": "via_http", "ack_policy": "explicit"}
    assert http.post("/v1/streams/SHARED/consumers", json=http_consumer).status_code == 201

    async def over_nats() -> list[bytes]:
        nc = await nats.connect(gateway.nats_url)
        js = nc.jetstream()
        acks = [await js.publish("shared.nats", b"nats-%d" % i) for i in range(5)]
        assert [a.seq for a in acks] == [6, 7, 8, 9, 10]
        sub = await js.pull_subscribe("shared.>", durable="via_nats", config=ConsumerConfig(ack_wait=30))
        got: list[bytes] = []
        while len(got) < 10:
            for msg in await sub.fetch(10 - len(got), timeout=5):
                got.append(msg.data)
                await msg.ack_sync()
        await nc.close()
        return got

    assert asyncio.run(over_nats()) == [b"http-%d" % i for i in range(5)] + [b"nats-%d" % i for i in range(5)]

    pulled = http.post("/v1/streams/SHARED/consumers/via_http/next", json={"batch": 20, "no_wait": True}).json()
    assert [base64.b64decode(m["data"]) for m in pulled["messages"]] == [b"http-%d" % i for i in range(5)] + [
        b"nats-%d" % i for i in range(5)
    ]
    acks: list[dict[str, Any]] = [{"token": m["ack"]} for m in pulled["messages"]]
    assert all(r == {"ok": True} for r in http.post("/v1/streams/SHARED/consumers/via_http/ack", json={"acks": acks}).json()["results"])
    via_nats = http.get("/v1/streams/SHARED/consumers/via_nats").json()
    assert (via_nats["ack_floor"]["stream_seq"], via_nats["num_pending"]) == (10, 0), "NATS acks as HTTP sees them"

    assert http.post("/v1/flush").json()["success"] is True
    register_views(spark, gateway.warehouse)
    rows = spark.sql("SELECT seq, subject, text FROM SHARED ORDER BY seq").collect()
    assert [(r.seq, r.subject, r.text) for r in rows] == [(i + 1, "shared.http", f"http-{i}") for i in range(5)] + [
        (i + 6, "shared.nats", f"nats-{i}") for i in range(5)
    ]
    http.close()
