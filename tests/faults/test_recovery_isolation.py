"""A stream that cannot be recovered (a corrupt table, an unreadable log) is kept apart; the others serve.

Before, one bad stream stopped the whole engine from opening. Now the gateway starts: every request on
that stream is a 503 ApiError, `/healthz` lists it (status "degraded", still 200: the gateway takes
writes), the stream list names it under `missing` as JetStream does, and the other streams serve.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gateway import Gateway


def _damage(warehouse: Path, how: str) -> None:
    root = warehouse / "default"
    if how == "corrupt table":
        commit = root / "streams" / "BAD" / "_delta_log" / f"{1:020d}.json"
        commit.write_bytes(b"this is not a Delta commit\n")
    else:
        segment = sorted((root / "_wal" / "BAD").glob("*.wal"))[-1]
        segment.unlink()
        segment.mkdir()  # a segment that cannot be read


@pytest.mark.parametrize("how", ["corrupt table", "unreadable log"])
def test_one_stream_that_cannot_be_recovered_does_not_stop_the_others(warehouse: Path, how: str) -> None:
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    with gw.client() as c:
        for name in ("BAD", "GOOD"):
            assert c.post("/v1/streams", json={"name": name, "subjects": [f"{name.lower()}.>"]}).status_code == 201
            for i in range(3):
                assert c.post(f"/v1/publish/{name.lower()}.x", content=b"m%d" % i).status_code == 200
        if how == "corrupt table":
            assert c.post("/v1/flush").status_code == 200
    gw.kill9()
    _damage(warehouse, how)

    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gw.client() as c:
            health = c.get("/healthz")
            assert health.status_code == 200 and health.json()["status"] == "degraded", health.text
            failed = health.json()["streams_failed"]
            assert [f["stream"] for f in failed] == ["BAD"] and "recovery failed" in failed[0]["error"]
            for resp in (c.get("/v1/streams/BAD"), c.post("/v1/publish/bad.x", content=b"refused"),
                         c.get("/v1/streams/BAD/messages/1")):
                assert resp.status_code == 503, resp.text
                assert resp.json()["error"]["err_code"] == 10023
            listed = c.get("/v1/streams").json()
            assert [s["config"]["name"] for s in listed["streams"]] == ["GOOD"] and listed["missing"] == ["BAD"]
            assert c.get("/v1/streams/GOOD").json()["state"]["last_seq"] == 3
            assert c.get("/v1/streams/GOOD/messages/2").status_code == 200
            assert c.post("/v1/publish/good.x", content=b"served").json()["seq"] == 4
            assert c.post("/v1/flush").status_code == 200
    finally:
        gw.stop()
