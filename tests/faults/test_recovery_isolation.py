"""A stream that cannot be recovered (a corrupt table, an unreadable log) is kept apart; the others serve.

Before, one bad stream stopped the whole engine from opening. Now the gateway starts: every request on
that stream is a 503 ApiError, `/healthz` lists it (status "degraded", still 200: the gateway takes
writes), the stream list names it under `missing` as JetStream does, and the other streams serve. A
stream with unflushed log records is recovered at start; an idle one at its first use (engine/catalog.py).
"""

from __future__ import annotations

from pathlib import Path

from tests.gateway import Gateway

STREAMS = {"TABLE": "a corrupt table", "LOG": "an unreadable log", "GOOD": "intact"}


def _damage(warehouse: Path) -> None:
    root = warehouse / "default"
    commit = root / "streams" / "TABLE" / "_delta_log" / f"{1:020d}.json"
    commit.write_bytes(b"this is not a Delta commit\n")
    segment = sorted((root / "_wal" / "LOG").glob("*.wal"))[-1]
    segment.unlink()
    segment.mkdir()  # a segment that cannot be read


def test_streams_that_cannot_be_recovered_do_not_stop_the_others(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    with gw.client() as c:
        for name in STREAMS:
            assert c.post("/v1/streams", json={"name": name, "subjects": [f"{name.lower()}.>"]}).status_code == 201
            for i in range(3):
                assert c.post(f"/v1/publish/{name.lower()}.x", content=b"m%d" % i).status_code == 200
            if name == "TABLE":
                assert c.post("/v1/flush").status_code == 200  # its messages in its table, its log empty
    gw.kill9()
    _damage(warehouse)

    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gw.client() as c:
            health = c.get("/healthz")
            assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
            failed = health.json()["streams_failed"]
            assert [f["stream"] for f in failed] == ["LOG"], "recovered at start: its log holds records"
            assert c.get("/v1/streams/TABLE").status_code == 503, "an idle stream is recovered at its first use"
            failed = c.get("/healthz").json()["streams_failed"]
            assert sorted(f["stream"] for f in failed) == ["LOG", "TABLE"]
            assert all("recovery failed" in f["error"] for f in failed)
            for name in ("TABLE", "LOG"):
                for resp in (c.get(f"/v1/streams/{name}"), c.post(f"/v1/publish/{name.lower()}.x", content=b"no"),
                             c.get(f"/v1/streams/{name}/messages/1")):
                    assert resp.status_code == 503, resp.text
                    assert resp.json()["error"]["err_code"] == 10023
            listed = c.get("/v1/streams").json()
            assert [s["config"]["name"] for s in listed["streams"]] == ["GOOD"]
            assert listed["missing"] == ["LOG", "TABLE"]
            assert c.get("/v1/streams/GOOD").json()["state"]["last_seq"] == 3
            assert c.get("/v1/streams/GOOD/messages/2").status_code == 200
            assert c.post("/v1/publish/good.x", content=b"served").json()["seq"] == 4
            assert c.post("/v1/flush").status_code == 200
    finally:
        gw.stop()
