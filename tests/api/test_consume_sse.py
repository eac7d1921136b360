"""`consume()` over server-sent events: messages as they arrive, heartbeats, a clean end."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

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


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.02)


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

        def messages() -> list[tuple[object, object]]:
            return [(data["seq"], data["num_delivered"]) for kind, data in list(events) if kind == "message"]

        _wait_for(lambda: messages() == [(1, 1)], "the message published before the stream opened")
        _wait_for(lambda: any(kind == "heartbeat" for kind, _ in list(events)), "a heartbeat while idle")
        c.post("/v1/publish/e.2", content=b"after")
        _wait_for(lambda: messages() == [(1, 1), (2, 1)], "the message published while the stream is open")
        assert c.delete("/v1/streams/E/consumers/W").json() == {"success": True}
        assert done.wait(5), "the event stream did not end after the consumer was deleted"
        reader.join()
    assert messages() == [(1, 1), (2, 1)]


def test_sse_stops_delivering_when_the_client_goes_away(gateway: Gateway) -> None:
    with gateway.client() as c:
        c.post("/v1/streams", json={"name": "G", "subjects": ["g"]})
        c.post("/v1/streams/G/consumers", json={"durable_name": "W", "ack_policy": "explicit"})
        with httpx.Client(base_url=gateway.url, timeout=5.0) as sse, sse.stream(
            "GET", "/v1/streams/G/consumers/W/messages?idle_heartbeat=200000000"
        ) as r:
            lines = r.iter_lines()
            assert next(lines) == "event: heartbeat"
            assert c.get("/v1/streams/G/consumers/W").json()["num_waiting"] == 1
        # The gateway notices the client left (at its next heartbeat at the latest) and stops pulling.
        _wait_for(lambda: c.get("/v1/streams/G/consumers/W").json()["num_waiting"] == 0, "the gateway noticed")
        c.post("/v1/publish/g", content=b"x")
        info = c.get("/v1/streams/G/consumers/W").json()
        assert info["delivered"]["stream_seq"] == 0, "nothing is delivered to a client that left"
        assert info["num_pending"] == 1
