"""One stream, two doors: what is published over HTTP is consumed over NATS and the other way round,
and SQL (Spark, over the Delta table) sees every message of both."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import httpx
import nats
import orjson
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


def test_unpin_over_http_is_the_unpin_of_the_nats_door(gateway: Gateway) -> None:
    """`POST …/consumers/{consumer}/unpin`: the unpin API's checks and errors (nothing changes on bad
    input), then the pin is gone from consumer info over both doors, NATS hears the UNPINNED advisory
    (reason `admin`, account `$G`), the old pin id is refused and the next request gets a new pin."""
    http = gateway.client()
    assert http.post("/v1/streams", json={"name": "PINS", "subjects": ["pins.>"]}).status_code == 201
    for i in range(3):
        assert http.post("/v1/publish/pins.a", content=b"m%d" % i).status_code == 200
    config = {"durable_name": "P", "ack_policy": "explicit", "priority_policy": "pinned_client",
              "priority_groups": ["A"]}
    assert http.post("/v1/streams/PINS/consumers", json=config).status_code == 201

    def unpin(path: str, body: object) -> tuple[int, Any]:
        answer = http.post(f"/v1/streams/{path}/unpin", json=body)
        return answer.status_code, answer.json()

    def error(status: int, err_code: int, description: str) -> tuple[int, Any]:
        return status, {"type": "io.nats.jetstream.api.v1.error_response",
                        "error": {"code": status, "err_code": err_code, "description": description}}

    def groups(info: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in g.items() if k != "pinned_ts"} | {"pinned": g["pinned_ts"] != "0001-01-01T00:00:00Z"}
                for g in info["priority_groups"]]

    async def scenario() -> None:
        nc = await nats.connect(gateway.nats_url)
        try:
            advisories = await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.*.PINS.P")
            inbox = nc.new_inbox()
            replies = await nc.subscribe(inbox)

            async def pull(**request: Any) -> tuple[str, str]:
                body = orjson.dumps({"batch": 1, "no_wait": True, "group": "A", **request})
                await nc.publish("$JS.API.CONSUMER.MSG.NEXT.PINS.P", body, reply=inbox)
                msg = await replies.next_msg(timeout=10)
                headers = msg.headers or {}
                return headers.get("Status", "message"), headers.get("Nats-Pin-Id", headers.get("Description", ""))

            kind, first = await pull()
            assert kind == "message" and first
            pinned = orjson.loads((await advisories.next_msg(timeout=10)).data)
            assert (pinned["type"], pinned["account"], pinned["pinned_id"]) == (
                "io.nats.jetstream.advisory.v1.consumer_group_pinned", "$G", first)
            info = await asyncio.to_thread(lambda: http.get("/v1/streams/PINS/consumers/P").json())
            assert groups(info) == [{"group": "A", "pinned_client_id": first, "pinned": True}]

            bad = await asyncio.to_thread(lambda: [
                unpin("PINS/consumers/P", {}), unpin("PINS/consumers/P", {"group": 5}),
                unpin("PINS/consumers/P", {"group": "no spaces"}), unpin("PINS/consumers/P", {"group": "B"}),
                unpin("PINS/consumers/NOPE", {"group": "A"}), unpin("NOPE/consumers/P", {"group": "A"}),
            ])
            assert bad == [
                error(400, 10025, "invalid JSON: consumer group not specified"),
                error(400, 10025, "invalid JSON: the group must be a string"),
                error(400, 10162,
                      "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters"),
                error(400, 10160, "Provided priority group does not exist for this consumer"),
                error(404, 10014, "consumer not found"),
                error(404, 10059, "stream not found"),
            ]
            assert await pull(id=first) == ("message", first), "bad input changed nothing: the pin holds"

            assert await asyncio.to_thread(unpin, "PINS/consumers/P", {"group": "A"}) == (200, {})
            unpinned = orjson.loads((await advisories.next_msg(timeout=10)).data)
            assert {k: unpinned[k] for k in ("type", "account", "stream", "consumer", "group", "reason")} == {
                "type": "io.nats.jetstream.advisory.v1.consumer_group_unpinned", "account": "$G", "stream": "PINS",
                "consumer": "P", "group": "A", "reason": "admin"}
            over_nats = orjson.loads((await nc.request("$JS.API.CONSUMER.INFO.PINS.P", b"", timeout=10)).data)
            assert groups(over_nats) == [{"group": "A", "pinned": False}]
            assert await pull(id=first) == ("423", "Nats-Wrong-Pin-Id")
            kind, second = await pull()
            assert kind == "message" and second and second != first
        finally:
            await nc.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))
    http.close()
