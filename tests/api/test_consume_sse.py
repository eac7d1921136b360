"""`consume()` over server-sent events: messages as they arrive, heartbeats, a clean end."""

from __future__ import annotations

import json
import threading
import time

import httpx

from tests.gateway import Gateway

NS = 1_000_000_000


def _events(gw: Gateway, path: str, out: list[tuple[str, dict[str, object]]], done: threading.Event) -> None:
    with httpx.Client(base_url=gw.url, timeout=httpx.Timeout(10.0, read=10.0)) as c, c.stream("GET", path) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event is not None:
                out.append((event, json.loads(line[6:])))
    done.set()


def test_sse_delivers_heartbeats_and_ends_when_the_consumer_is_deleted(gateway: Gateway) -> None:
    with gateway.client() as c:
        c.post("/v1/streams", json={"name": "E", "subjects": ["e.>"]})
        c.post("/v1/streams/E/consumers", json={"durable_name": "W", "ack_policy": "explicit"})
        c.post("/v1/publish/e.1", content=b"before")
        events: list[tuple[str, dict[str, object]]] = []
        done = threading.Event()
        reader = threading.Thread(
            target=_events, args=(gateway, f"/v1/streams/E/consumers/W/messages?idle_heartbeat={NS // 5}", events, done)
        )
        reader.start()
        time.sleep(0.6)
        c.post("/v1/publish/e.2", content=b"after")
        time.sleep(0.5)
        assert c.delete("/v1/streams/E/consumers/W").json() == {"success": True}
        assert done.wait(5), "the event stream did not end after the consumer was deleted"
        reader.join()
    messages = [data for kind, data in events if kind == "message"]
    assert [(m["seq"], m["num_delivered"]) for m in messages] == [(1, 1), (2, 1)]
    assert any(kind == "heartbeat" for kind, _ in events)


def test_sse_stops_delivering_when_the_client_goes_away(gateway: Gateway) -> None:
    with gateway.client() as c:
        c.post("/v1/streams", json={"name": "G", "subjects": ["g"]})
        c.post("/v1/streams/G/consumers", json={"durable_name": "W", "ack_policy": "explicit"})
        with httpx.Client(base_url=gateway.url, timeout=5.0) as sse, sse.stream(
            "GET", "/v1/streams/G/consumers/W/messages?idle_heartbeat=200000000"
        ) as r:
            next(r.iter_lines())
        time.sleep(0.5)
        c.post("/v1/publish/g", content=b"x")
        time.sleep(0.3)
        info = c.get("/v1/streams/G/consumers/W").json()
        assert info["num_waiting"] == 0
        assert info["delivered"]["stream_seq"] == 0, "nothing is delivered to a client that left"
