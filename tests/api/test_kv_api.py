"""KV buckets through a real gateway (`jetlake serve` on loopback): every route of API.md's KV section,
JetStream's err_codes in the ApiError shape, and the watch as server-sent events.

Refused requests must leave every bucket's `values` and `bytes` as they were, and the gateway must keep
answering `/healthz`.
"""

from __future__ import annotations

import base64
import itertools
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway import Gateway

BAD_REQUEST, INVALID_JSON, NO_MESSAGE, INVALID_CONFIG, TOO_LARGE = 10003, 10025, 10037, 10052, 10054
NAME_IN_USE, NOT_FOUND, WRONG_LAST_SEQ, STORE_FAILED = 10058, 10059, 10071, 10077
_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    warehouse: Path = tmp_path_factory.mktemp("kv-api") / "warehouse"
    warehouse.mkdir()
    gateway = Gateway(warehouse, "--flush-interval", "0.2").start()
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def c(gw: Gateway) -> Iterator[httpx.Client]:
    with gw.client() as client:
        yield client


def new_bucket(c: httpx.Client, **config: Any) -> str:
    bucket = f"b{next(_numbers)}"
    resp = c.post("/v1/kv", json={"bucket": bucket, **config})
    assert resp.status_code == 201, resp.text
    return bucket


def put(c: httpx.Client, bucket: str, key: str, value: bytes, **headers: str) -> int:
    resp = c.put(f"/v1/kv/{bucket}/entries/{key}", content=value, headers={k.replace("_", "-"): v for k, v in headers.items()})
    assert resp.status_code == 200, resp.text
    assert set(resp.json()) == {"revision"}
    return int(resp.json()["revision"])


def snapshot(c: httpx.Client) -> list[tuple[str, int, int]]:
    listing = c.get("/v1/kv")
    assert listing.status_code == 200
    return [(b["bucket"], b["values"], b["bytes"]) for b in listing.json()["buckets"]]


def api_error(resp: httpx.Response, status: int, err_code: int) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"type", "error"} and body["type"] == "io.nats.jetstream.api.v1.error_response", body
    assert set(body["error"]) == {"code", "err_code", "description"}, body
    assert (body["error"]["code"], body["error"]["err_code"]) == (status, err_code), body
    assert isinstance(body["error"]["description"], str) and body["error"]["description"]
    return str(body["error"]["description"])


def refused(c: httpx.Client, resp: Any, status: int, err_code: int, before: list[tuple[str, int, int]]) -> str:
    description = api_error(resp, status, err_code)
    assert snapshot(c) == before, "a refused request changed a bucket"
    assert c.get("/healthz").status_code == 200
    return description


# -- buckets ------------------------------------------------------------------------------------


def test_create_status_list_destroy(c: httpx.Client) -> None:
    body = {"bucket": "cfg_1", "history": 5, "ttl": 60 * 10**9, "max_value_size": 1024, "max_bytes": 1 << 20,
            "storage": "file", "description": "settings"}
    created = c.post("/v1/kv", json=body)
    assert created.status_code == 201, created.text
    status = created.json()
    assert {k: status[k] for k in ("bucket", "values", "history", "ttl", "bytes", "backing_store")} == {
        "bucket": "cfg_1", "values": 0, "history": 5, "ttl": 60 * 10**9, "bytes": 0, "backing_store": "JetStream",
    }
    assert status["description"] == "settings" and status["max_value_size"] == 1024
    again = c.post("/v1/kv", json=body)
    assert again.status_code == 200 and again.json() == status, "an identical create answers the bucket"
    before = snapshot(c)
    refused(c, c.post("/v1/kv", json={**body, "history": 6}), 400, NAME_IN_USE, before)
    assert c.get("/v1/kv/cfg_1").json() == status
    assert "cfg_1" in [b["bucket"] for b in c.get("/v1/kv").json()["buckets"]]
    stream = c.get("/v1/streams/KV_cfg_1")
    assert stream.status_code == 200 and stream.json()["config"]["subjects"] == ["$KV.cfg_1.>"]
    assert c.delete("/v1/kv/cfg_1").json() == {"success": True}
    api_error(c.get("/v1/kv/cfg_1"), 404, NOT_FOUND)
    api_error(c.delete("/v1/kv/cfg_1"), 404, NOT_FOUND)
    api_error(c.get("/v1/streams/KV_cfg_1"), 404, NOT_FOUND)
    memory = c.post("/v1/kv", json={"bucket": "mem_1", "storage": "memory", "history": 0})
    assert memory.status_code == 201 and (memory.json()["storage"], memory.json()["history"]) == ("memory", 1)


@pytest.mark.parametrize(("body", "err_code"), [
    ({"bucket": "x1", "history": 65}, INVALID_CONFIG),
    ({"bucket": "x1", "history": -1}, INVALID_CONFIG),
    ({"bucket": "x1", "ttl": -5}, INVALID_CONFIG),
    ({"bucket": "x1", "histroy": 2}, INVALID_JSON),
    ({"bucket": "x1", "history": "2"}, INVALID_JSON),
    ({"bucket": "x1", "storage": "disk"}, INVALID_JSON),
    ({"history": 2}, INVALID_JSON),
    ({"bucket": "a.b"}, BAD_REQUEST),
    ({"bucket": "a b"}, BAD_REQUEST),
    ({"bucket": "a\n"}, BAD_REQUEST),
    ({"bucket": "a*"}, BAD_REQUEST),
    ({"bucket": ""}, BAD_REQUEST),
])
def test_bad_creates(c: httpx.Client, body: dict[str, Any], err_code: int) -> None:
    before = snapshot(c)
    refused(c, c.post("/v1/kv", json=body), 400, err_code, before)


def test_bad_create_bodies(c: httpx.Client) -> None:
    before = snapshot(c)
    refused(c, c.post("/v1/kv", content=b"{not json"), 400, INVALID_JSON, before)
    refused(c, c.post("/v1/kv", content=b"[1]"), 400, INVALID_JSON, before)
    refused(c, c.post("/v1/kv", content=b""), 400, INVALID_JSON, before)


@pytest.mark.parametrize("path", ["/v1/kv/a.b", "/v1/kv/a%20b", "/v1/kv/a%0A", "/v1/kv/a*", "/v1/kv/%C3%A4"])
def test_invalid_bucket_names_in_paths(c: httpx.Client, path: str) -> None:
    before = snapshot(c)
    refused(c, c.get(path), 400, BAD_REQUEST, before)
    refused(c, c.delete(path), 400, BAD_REQUEST, before)
    refused(c, c.put(f"{path}/entries/k", content=b"v"), 400, BAD_REQUEST, before)
    refused(c, c.get(f"{path}/entries/k"), 400, BAD_REQUEST, before)
    refused(c, c.get(f"{path}/keys"), 400, BAD_REQUEST, before)


def test_unknown_bucket_is_404_everywhere(c: httpx.Client) -> None:
    before = snapshot(c)
    for resp in (
        c.get("/v1/kv/nobucket"), c.delete("/v1/kv/nobucket"), c.put("/v1/kv/nobucket/entries/k", content=b"v"),
        c.get("/v1/kv/nobucket/entries/k"), c.delete("/v1/kv/nobucket/entries/k"),
        c.get("/v1/kv/nobucket/history/k"), c.get("/v1/kv/nobucket/keys"), c.get("/v1/kv/nobucket/watch"),
    ):
        refused(c, resp, 404, NOT_FOUND, before)


# -- entries ------------------------------------------------------------------------------------


def test_put_get_headers_and_revisions(c: httpx.Client) -> None:
    b = new_bucket(c, history=4)
    assert put(c, b, "greeting", b"hello") == 1
    assert put(c, b, "greeting", b"\x00\xffbinary") == 2
    resp = c.get(f"/v1/kv/{b}/entries/greeting")
    assert resp.status_code == 200 and resp.content == b"\x00\xffbinary"
    assert resp.headers["KV-Revision"] == "2" and resp.headers["KV-Operation"] == "PUT"
    assert resp.headers["ETag"] == '"2"'
    assert datetime.fromisoformat(resp.headers["KV-Created"].replace("Z", "+00:00")).tzinfo is not None
    old = c.get(f"/v1/kv/{b}/entries/greeting", params={"revision": 1})
    assert (old.status_code, old.content, old.headers["KV-Revision"]) == (200, b"hello", "1")
    assert put(c, b, "other", b"o") == 3
    before = snapshot(c)
    refused(c, c.get(f"/v1/kv/{b}/entries/greeting", params={"revision": 3}), 404, NO_MESSAGE, before)
    refused(c, c.get(f"/v1/kv/{b}/entries/greeting", params={"revision": 99}), 404, NO_MESSAGE, before)
    refused(c, c.get(f"/v1/kv/{b}/entries/missing"), 404, NO_MESSAGE, before)
    for bad in ("abc", "0", "-1", "1.5", ""):
        refused(c, c.get(f"/v1/kv/{b}/entries/greeting", params={"revision": bad}), 400, BAD_REQUEST, before)
    assert put(c, b, "empty", b"") == 4
    assert c.get(f"/v1/kv/{b}/entries/empty").content == b""


def test_keys_with_slashes_take_the_rest_of_the_path(c: httpx.Client) -> None:
    b = new_bucket(c, history=3)
    assert put(c, b, "a/b/c", b"slashes") == 1
    assert put(c, b, "a.b.c", b"dots") == 2
    assert c.get(f"/v1/kv/{b}/entries/a/b/c").content == b"slashes"
    assert c.get(f"/v1/kv/{b}/entries/a%2Fb%2Fc").content == b"slashes"
    assert c.get(f"/v1/kv/{b}/entries/a.b.c").content == b"dots"
    assert c.get(f"/v1/kv/{b}/keys").json() == {"keys": ["a/b/c", "a.b.c"]}
    history = c.get(f"/v1/kv/{b}/history/a/b/c").json()["entries"]
    assert [(e["key"], e["revision"]) for e in history] == [("a/b/c", 1)]
    assert c.delete(f"/v1/kv/{b}/entries/a/b/c").json() == {"revision": 3}
    assert c.get(f"/v1/kv/{b}/keys").json() == {"keys": ["a.b.c"]}


@pytest.mark.parametrize("key", ["", ".a", "a.", "a..b", "a%20b", "a*", "a.%3E", "%3E", "%C3%A4", "a%0A", "a%09b", "a\\b"])
def test_invalid_keys(c: httpx.Client, key: str) -> None:
    b = new_bucket(c)
    put(c, b, "ok", b"v")
    before = snapshot(c)
    refused(c, c.put(f"/v1/kv/{b}/entries/{key}", content=b"v"), 400, BAD_REQUEST, before)
    refused(c, c.get(f"/v1/kv/{b}/entries/{key}"), 400, BAD_REQUEST, before)
    refused(c, c.delete(f"/v1/kv/{b}/entries/{key}"), 400, BAD_REQUEST, before)
    refused(c, c.get(f"/v1/kv/{b}/history/{key}"), 400, BAD_REQUEST, before)


def test_create_only_and_update_conditions(c: httpx.Client) -> None:
    b = new_bucket(c, history=10)
    assert put(c, b, "k", b"v1", If_None_Match="*") == 1
    before = snapshot(c)
    description = refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x", headers={"If-None-Match": "*"}), 400, WRONG_LAST_SEQ, before)
    assert description == "wrong last sequence: 1"
    assert put(c, b, "k", b"v2", If_Match="1") == 2
    assert put(c, b, "k", b"v3", If_Match='"2"') == 3, "If-Match as an ETag"
    assert put(c, b, "k", b"v4", If_Match='W/"3"') == 4
    before = snapshot(c)
    for wrong in ("3", '"1"', "0", "99"):
        refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x", headers={"If-Match": wrong}), 400, WRONG_LAST_SEQ, before)
    for bad in ("abc", "-1", '"x"', "1,2", "*", ""):
        refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x", headers={"If-Match": bad}), 400, BAD_REQUEST, before)
    refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x", headers={"If-None-Match": '"4"'}), 400, BAD_REQUEST, before)
    refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x", headers={"If-None-Match": "*", "If-Match": "4"}), 400, BAD_REQUEST, before)
    refused(c, c.put(f"/v1/kv/{b}/entries/new", content=b"x", headers={"If-Match": "1"}), 400, WRONG_LAST_SEQ, before)
    assert c.delete(f"/v1/kv/{b}/entries/k").json() == {"revision": 5}
    assert put(c, b, "k", b"again", If_None_Match="*") == 6, "a deleted key counts as absent"
    assert c.delete(f"/v1/kv/{b}/entries/k", params={"purge": "true"}).json() == {"revision": 7}
    assert put(c, b, "k", b"after purge", If_None_Match="*") == 8, "a purged key counts as absent"
    before = snapshot(c)
    refused(c, c.delete(f"/v1/kv/{b}/entries/k", headers={"If-Match": "7"}), 400, WRONG_LAST_SEQ, before)
    assert c.delete(f"/v1/kv/{b}/entries/k", headers={"If-Match": "8"}).json() == {"revision": 9}


def test_non_ascii_digits_in_if_match_are_a_bad_request(c: httpx.Client) -> None:
    b = new_bucket(c)
    put(c, b, "k", b"v")
    before = snapshot(c)
    # "²" (latin-1 0xB2) passes str.isdigit() but int() refuses it: must be a 400, never a 500.
    refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x", headers={"If-Match": b"\xb2"}), 400, BAD_REQUEST, before)


def test_delete_purge_and_history(c: httpx.Client) -> None:
    b = new_bucket(c, history=5)
    put(c, b, "k", b"one")
    put(c, b, "k", b"two")
    put(c, b, "j", b"jay")
    assert c.delete(f"/v1/kv/{b}/entries/k").json() == {"revision": 4}
    before = snapshot(c)
    refused(c, c.get(f"/v1/kv/{b}/entries/k"), 404, NO_MESSAGE, before)
    assert c.get(f"/v1/kv/{b}/entries/k", params={"revision": 2}).content == b"two"
    history = c.get(f"/v1/kv/{b}/history/k")
    assert history.status_code == 200
    entries = history.json()["entries"]
    assert [(e["bucket"], e["key"], base64.b64decode(e["value"]), e["revision"], e["operation"], e["delta"]) for e in entries] == [
        (b, "k", b"one", 1, "PUT", 2), (b, "k", b"two", 2, "PUT", 1), (b, "k", b"", 4, "DEL", 0),
    ]
    assert all(e["created"].endswith("Z") for e in entries)
    assert c.delete(f"/v1/kv/{b}/entries/k", params={"purge": "true"}).json() == {"revision": 5}
    entries = c.get(f"/v1/kv/{b}/history/k").json()["entries"]
    assert [(e["revision"], e["operation"], e["value"]) for e in entries] == [(5, "PURGE", "")]
    before = snapshot(c)
    refused(c, c.get(f"/v1/kv/{b}/entries/k", params={"revision": 2}), 404, NO_MESSAGE, before)
    refused(c, c.get(f"/v1/kv/{b}/history/never"), 404, NO_MESSAGE, before)
    refused(c, c.delete(f"/v1/kv/{b}/entries/k", params={"purge": "maybe"}), 400, BAD_REQUEST, before)
    assert c.get(f"/v1/kv/{b}").json()["values"] == 2
    assert c.get(f"/v1/kv/{b}/keys").json() == {"keys": ["j"]}


def test_keys_filter(c: httpx.Client) -> None:
    b = new_bucket(c)
    for key in ("user.1.name", "user.2.name", "user.2.mail", "team.x", "solo", "gone"):
        put(c, b, key, b"v")
    c.delete(f"/v1/kv/{b}/entries/gone")
    assert c.get(f"/v1/kv/{b}/keys").json() == {"keys": ["user.1.name", "user.2.name", "user.2.mail", "team.x", "solo"]}
    assert c.get(f"/v1/kv/{b}/keys", params={"filter": "user.*.name"}).json() == {"keys": ["user.1.name", "user.2.name"]}
    assert c.get(f"/v1/kv/{b}/keys", params={"filter": "user.>"}).json()["keys"] == ["user.1.name", "user.2.name", "user.2.mail"]
    assert c.get(f"/v1/kv/{b}/keys", params={"filter": "*"}).json() == {"keys": ["solo"]}
    assert c.get(f"/v1/kv/{b}/keys", params={"filter": "nothing"}).json() == {"keys": []}
    before = snapshot(c)
    for bad in ("", "a..b", "a b", "a*", "x.>.y"):
        refused(c, c.get(f"/v1/kv/{b}/keys", params={"filter": bad}), 400, BAD_REQUEST, before)


def test_limits_max_value_size_and_max_bytes(c: httpx.Client) -> None:
    b = new_bucket(c, max_value_size=16)
    put(c, b, "k", b"x" * 16)
    before = snapshot(c)
    refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"x" * 17), 400, TOO_LARGE, before)
    refused(c, c.put(f"/v1/kv/{b}/entries/new", content=b"x" * 1000), 400, TOO_LARGE, before)
    f = "maxbytes"
    one = len(f"$KV.{f}.k0") + 40 + 16  # memstore bytes of one 40-byte value under key k<i>
    assert c.post("/v1/kv", json={"bucket": f, "max_bytes": 2 * one, "history": 3}).status_code == 201
    put(c, f, "k0", b"y" * 40)
    put(c, f, "k1", b"y" * 40)
    before = snapshot(c)
    refused(c, c.put(f"/v1/kv/{f}/entries/k2", content=b"y" * 40), 503, STORE_FAILED, before)
    assert c.get(f"/v1/kv/{f}").json()["bytes"] == 2 * one


def test_body_over_the_gateway_limit_is_413(gw: Gateway, tmp_path: Path) -> None:
    small = Gateway(tmp_path / "w413", "--max-body", "1024", "--flush-interval", "0.2")
    (tmp_path / "w413").mkdir()
    small.start()
    try:
        with small.client() as c:
            b = new_bucket(c)
            before = snapshot(c)
            refused(c, c.put(f"/v1/kv/{b}/entries/k", content=b"z" * 2048), 413, BAD_REQUEST, before)
    finally:
        small.stop()


# -- watch (server-sent events) -----------------------------------------------------------------


class Watch:
    """One watch's event stream, read in the test's own thread: a read timeout bounds every wait."""

    def __init__(self, url: str, path: str, params: dict[str, str] | None = None) -> None:
        self._client = httpx.Client(base_url=url, timeout=httpx.Timeout(10.0, read=10.0))
        self._context = self._client.stream("GET", path, params=params)
        self.response = self._context.__enter__()
        self._lines = self.response.iter_lines()
        self.comments = 0

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self, count: int) -> list[tuple[str, dict[str, Any]]]:
        """The next `count` events, ("message", entry) or ("init_done", {})."""
        events: list[tuple[str, dict[str, Any]]] = []
        name = "message"
        end = time.monotonic() + 15.0  # heartbeats every 5 s keep the read timeout from firing
        while len(events) < count:
            assert time.monotonic() < end, f"only {events} of {count} events arrived"
            line = next(self._lines)
            if line.startswith(":"):
                self.comments += 1
            elif line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, json.loads(line[6:])))
                name = "message"
        return events

    def read_to_end(self, deadline_s: float = 15.0) -> list[str]:
        """Every line left until the server ends the stream (heartbeats arrive every 5 s, so the
        deadline is checked between lines)."""
        end = time.monotonic() + deadline_s
        rest = []
        for line in self._lines:
            rest.append(line)
            assert time.monotonic() < end, "the event stream did not end"
        return rest

    def close(self) -> None:
        self._context.__exit__(None, None, None)
        self._client.close()


def entries(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, bytes, int, str, int | None]]:
    return [(e["key"], base64.b64decode(e["value"]), e["revision"], e["operation"], e.get("delta")) for kind, e in events if kind == "message"]


def test_watch_initial_init_done_live_updates_and_destroy(c: httpx.Client, gw: Gateway) -> None:
    b = new_bucket(c, history=5)
    put(c, b, "a", b"a1")
    put(c, b, "b", b"b1")
    put(c, b, "a", b"a2")
    c.delete(f"/v1/kv/{b}/entries/b")
    with Watch(gw.url, f"/v1/kv/{b}/watch") as w:
        assert w.response.status_code == 200 and w.response.headers["content-type"].startswith("text/event-stream")
        events = w.read(3)
        assert entries(events) == [("a", b"a2", 3, "PUT", 1), ("b", b"", 4, "DEL", 0)]
        assert events[2] == ("init_done", {})
        assert all(e["bucket"] == b and e["created"].endswith("Z") for _, e in events[:2])
        put(c, b, "c", b"live")
        assert entries(w.read(1)) == [("c", b"live", 5, "PUT", 0)], "a live put arrives"
        c.delete(f"/v1/kv/{b}/entries/a", params={"purge": "true"})
        assert entries(w.read(1)) == [("a", b"", 6, "PURGE", 0)]
        assert c.delete(f"/v1/kv/{b}").json() == {"success": True}
        assert [line for line in w.read_to_end() if line.startswith("data")] == [], "destroyed: the stream ends"
    assert c.get("/healthz").status_code == 200


def test_watch_options(c: httpx.Client, gw: Gateway) -> None:
    b = new_bucket(c, history=5)
    put(c, b, "x.1", b"1")
    put(c, b, "x.1", b"2")
    put(c, b, "y", b"3")
    c.delete(f"/v1/kv/{b}/entries/y")
    new, deleted, last = ("x.2", b"new", 5, "PUT", 0), ("x.1", b"", 6, "DEL", 0), ("y", b"last", 7, "PUT", 0)
    cases: list[tuple[dict[str, str], list[tuple[str, bytes, int, str, int | None]], list[Any]]] = [
        ({"include_history": "true"},
         [("x.1", b"1", 1, "PUT", 3), ("x.1", b"2", 2, "PUT", 2), ("y", b"3", 3, "PUT", 1), ("y", b"", 4, "DEL", 0)],
         [new, deleted, last]),
        ({"ignore_deletes": "true"}, [("x.1", b"2", 2, "PUT", 1)], [new, last]),
        ({"updates_only": "true"}, [], [new, deleted, last]),
        ({"key": "x.*"}, [("x.1", b"2", 2, "PUT", 0)], [new, deleted]),
        ({"key": "y"}, [("y", b"", 4, "DEL", 0)], [last]),
    ]
    watches = [Watch(gw.url, f"/v1/kv/{b}/watch", params) for params, _, _ in cases]
    try:
        for w, (_, initial, _) in zip(watches, cases, strict=True):
            events = w.read(len(initial) + 1)
            assert entries(events) == initial and events[-1] == ("init_done", {})
        put(c, b, "x.2", b"new")
        c.delete(f"/v1/kv/{b}/entries/x.1")
        put(c, b, "y", b"last")
        for w, (params, _, updates) in zip(watches, cases, strict=True):
            assert entries(w.read(len(updates))) == updates, params
    finally:
        for w in watches:
            w.close()
    before = snapshot(c)
    refused(c, c.get(f"/v1/kv/{b}/watch", params={"key": "a..b"}), 400, BAD_REQUEST, before)
    refused(c, c.get(f"/v1/kv/{b}/watch", params={"key": ""}), 400, BAD_REQUEST, before)
    refused(c, c.get(f"/v1/kv/{b}/watch", params={"include_history": "true", "updates_only": "true"}), 400, BAD_REQUEST, before)
    refused(c, c.get(f"/v1/kv/{b}/watch", params={"updates_only": "perhaps"}), 400, BAD_REQUEST, before)


def test_watch_of_an_empty_bucket_says_init_done_at_once(c: httpx.Client, gw: Gateway) -> None:
    b = new_bucket(c)
    with Watch(gw.url, f"/v1/kv/{b}/watch") as w:
        assert w.read(1) == [("init_done", {})]
        put(c, b, "k", b"v")
        assert entries(w.read(1)) == [("k", b"v", 1, "PUT", 0)]


def test_watch_ends_when_the_client_disconnects(gateway: Gateway) -> None:
    """Watches whose clients left end: uvicorn's shutdown then finds no response still running (it would
    log "Waiting for connections/background tasks" and wait for them)."""
    with gateway.client() as c:
        b = new_bucket(c)
        put(c, b, "k", b"v")
        for _ in range(3):
            with Watch(gateway.url, f"/v1/kv/{b}/watch") as w:
                assert w.read(2)[1] == ("init_done", {})
        put(c, b, "k", b"after the clients left")
        assert c.get("/healthz").status_code == 200
        assert c.get(f"/v1/kv/{b}/entries/k").content == b"after the clients left"
        assert c.get("/metrics").status_code == 200
    proc = gateway.proc
    assert proc is not None
    proc.terminate()
    proc.wait(timeout=15)
    gateway.proc = None
    log = gateway.log.read_text()
    assert "Finished server process" in log, log[-2000:]
    assert "Waiting for connections to close" not in log and "Waiting for background tasks" not in log, log[-2000:]
