"""`POST /v1/erasures` through the real gateway: by KV key and by object (extensions of API.md), and
bad input answered in JetStream's error shape, changing nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.store.erasures import erasures_dir
from engine.store.layout import Layout
from tests.gateway import Gateway

BAD_REQUEST, NOT_FOUND = 10003, 10059


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    warehouse: Path = tmp_path_factory.mktemp("erasures-api") / "warehouse"
    warehouse.mkdir()
    gateway = Gateway(warehouse, "--flush-interval", "0.2").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def c(gw: Gateway) -> Iterator[httpx.Client]:
    with gw.client() as client:
        yield client


def _requests(gw: Gateway) -> int:
    folder = erasures_dir(Layout(gw.warehouse))
    return len(list(folder.glob("*.json"))) if folder.is_dir() else 0


def test_a_kv_key_is_erased_with_its_history(c: httpx.Client) -> None:
    assert c.post("/v1/kv", json={"bucket": "people", "history": 3}).status_code == 201
    for value in (b"first@example.com", b"second@example.com"):
        assert c.put("/v1/kv/people/entries/alice.email", content=value).status_code == 200
    assert c.put("/v1/kv/people/entries/bob.email", content=b"kept").status_code == 200
    resp = c.post("/v1/erasures", json={"bucket": "people", "key": "alice.email"})
    assert resp.status_code == 202, resp.text
    assert resp.json()["status"] == "pending" and resp.json()["messages"] == 2
    assert c.get("/v1/kv/people/entries/alice.email").status_code == 404
    assert c.get("/v1/kv/people/entries/bob.email").content == b"kept"
    status = c.get(f"/v1/erasures/{resp.json()['id']}").json()
    assert status["stream"] == "KV_people" and status["status"] == "pending"


def test_an_object_is_erased_with_its_chunks(c: httpx.Client) -> None:
    assert c.post("/v1/objects", json={"bucket": "scans"}).status_code == 201
    assert c.put("/v1/objects/scans/data/passport.png", content=b"P" * 300_000).status_code in (200, 201)
    assert c.put("/v1/objects/scans/data/other.png", content=b"O" * 10).status_code in (200, 201)
    info = c.get("/v1/objects/scans/info/passport.png").json()
    resp = c.post("/v1/erasures", json={"bucket": "scans", "object": "passport.png"})
    assert resp.status_code == 202, resp.text
    assert resp.json()["messages"] == info["chunks"] + 1
    assert c.get("/v1/objects/scans/info/passport.png").status_code == 404
    assert c.get("/v1/objects/scans/data/other.png").content == b"O" * 10


@pytest.mark.parametrize(
    ("body", "status", "err_code"),
    [
        ({"bucket": "people"}, 400, BAD_REQUEST),
        ({"bucket": "people", "key": "a", "object": "b"}, 400, BAD_REQUEST),
        ({"bucket": "people", "key": "a", "stream": "KV_people"}, 400, BAD_REQUEST),
        ({"bucket": "people", "key": "bad..key"}, 400, BAD_REQUEST),
        ({"bucket": "people", "key": 7}, 400, BAD_REQUEST),
        ({"bucket": "", "key": "a"}, 400, BAD_REQUEST),
        ({"bucket": "no-such-bucket", "key": "a"}, 404, NOT_FOUND),
        ({"bucket": "no-such-bucket", "object": "a"}, 404, NOT_FOUND),
        ({"bucket": "people", "object": ""}, 400, BAD_REQUEST),
        ({"stream": "KV_people", "seq": 1, "key": "a"}, 400, BAD_REQUEST),
        ({"stream": "KV_people", "filter": "$KV.people.>", "nope": 1}, 400, BAD_REQUEST),
    ],
)
def test_bad_erasure_requests_change_nothing(
    gw: Gateway, c: httpx.Client, body: dict, status: int, err_code: int
) -> None:
    if c.get("/v1/kv/people").status_code == 404:
        assert c.post("/v1/kv", json={"bucket": "people", "history": 3}).status_code == 201
    before = _requests(gw)
    resp = c.post("/v1/erasures", json=body)
    assert resp.status_code == status, resp.text
    assert resp.json()["error"]["err_code"] == err_code and resp.json()["error"]["code"] == status
    assert _requests(gw) == before
    assert c.get("/healthz").status_code == 200
