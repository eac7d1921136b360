"""Accounts, users and permissions through a real gateway: every route checked as the NATS operation it
stands for, refusals that change nothing, credentials refused on every route, accounts that cannot see
each other. The accounts and the request for each route are in tests/api/security_setup.py."""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.http import operations
from api.http.operations import ROUTES
from tests.api.security_setup import (
    ACCOUNT_ROUTES,
    ROUTE_REQUESTS,
    SYSTEM_ROUTES,
    Call,
    basic,
    config_file,
    nothing_changes,
    send,
    setup_account,
)
from tests.gateway import Gateway

A = basic("a_admin", "a-pw")
B = basic("b_admin", "b-pw")
OP = basic("op", "op-pw")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    folder = tmp_path_factory.mktemp("security")
    (folder / "warehouse").mkdir()
    gw = Gateway(folder / "warehouse", "--config", str(config_file(folder, "bcrypt-pw")), "--flush-interval", "0.2").start()
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def c(gateway: Gateway) -> Iterator[httpx.Client]:
    with gateway.client() as client:
        yield client


@pytest.fixture(scope="module")
def names(c: httpx.Client) -> dict[str, str]:
    """A's resources, and B's: its own ORDERS on the same subjects, and names A does not have."""
    found = setup_account(c, A)
    c.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}, headers=B).raise_for_status()
    c.post("/v1/streams", json={"name": "BONLY", "subjects": ["bonly.>"]}, headers=B).raise_for_status()
    for i in range(3):
        c.post("/v1/publish/orders.eu", content=f"B{i}".encode(), headers=B).raise_for_status()
        c.post("/v1/publish/bonly.x", content=f"B{i}".encode(), headers=B).raise_for_status()
    c.post("/v1/streams/ORDERS/consumers", json={"durable_name": "bcons", "ack_policy": "explicit"}, headers=B).raise_for_status()
    c.post("/v1/kv", json={"bucket": "bkv"}, headers=B).raise_for_status()
    c.put("/v1/kv/bkv/entries/k", content=b"v", headers=B).raise_for_status()
    c.post("/v1/objects", json={"bucket": "bobj"}, headers=B).raise_for_status()
    c.put("/v1/objects/bobj/data/o", content=b"o", headers=B).raise_for_status()
    found["b_erasure"] = c.post("/v1/erasures", json={"stream": "BONLY", "seq": 1}, headers=B).json()["id"]
    return found


def assert_api_error(response: httpx.Response, status: int, err_code: int | None = None) -> dict[str, object]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"code", "err_code", "description"} and error["code"] == status
    if err_code is not None:
        assert error["err_code"] == err_code
    return error  # type: ignore[no-any-return]


def _app_routes() -> list[Any]:
    from api.http.app import create_app
    from api.auth import Authenticator
    from engine.accounts.config import ServerConfig
    from engine.accounts.registry import Accounts
    from engine.jetstream import EngineOptions

    config = ServerConfig.open()
    app = create_app(Accounts("/nonexistent", EngineOptions(), config), Authenticator(config))

    def flat(routes: list[Any]) -> Iterator[Any]:
        for route in routes:
            if hasattr(route, "original_router"):
                yield from flat(route.original_router.routes)
            elif hasattr(route, "methods") and route.path not in ("/docs", "/openapi.json", "/docs/oauth2-redirect"):
                yield route

    return list(flat(app.routes))


def test_every_route_has_a_request_here_and_the_declaration_matches_fastapi() -> None:
    assert set(ROUTE_REQUESTS) == {r.name for r in ROUTES if not r.open}
    served = {(m, r.path_format) for r in _app_routes() for m in r.methods if m != "HEAD"}
    assert served == {(r.method, r.path.replace(":path", "")) for r in ROUTES}


PATHS = [
    "/v1/streams", "/v1/streams/S", "/v1/streams/S/purge", "/v1/streams/S/messages", "/v1/streams/S/messages/7",
    "/v1/streams/S/consumers/C", "/v1/streams/S/consumers/C/next", "/v1/streams/S/consumers/C/x", "/v1/publish/a.b",
    "/v1/publish/a\n", "/v1/publish/a\nb", "/v1/publish/", "/v1/publish", "/v1/kv/b/entries/a/b.c", "/v1/kv/b/entries/",
    "/v1/kv/b/watch", "/v1/kv/b/keys", "/v1/objects/b/data/x/y", "/v1/objects/b/info/", "/v1/erasures/abc",
    "/v1/accounts/A/erasures/x", "/v1/streams//consumers/C", "/v1/streams/S/", "/healthz", "/metrics", "/v1/nope",
]


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE"])
def test_the_gate_finds_the_route_fastapi_finds(method: str) -> None:
    from starlette.routing import Match

    routes = _app_routes()
    for path in PATHS:
        scope = {"type": "http", "method": method, "path": path, "root_path": ""}
        fastapi = next(((r.path_format, s["path_params"]) for r in routes for m, s in [r.matches(scope)] if m == Match.FULL), None)
        ours = operations.match(method, path)
        expected = (ours[0].path.replace(":path", ""), ours[1]) if ours else None
        assert fastapi == expected, (method, path)


# -- permissions --------------------------------------------------------------------------------


@pytest.mark.parametrize("route", [*ACCOUNT_ROUTES, *sorted(SYSTEM_ROUTES)])
def test_each_route_needs_its_subjects_deny_wins_and_wildcards_grant(c: httpx.Client, names: dict[str, str], route: str) -> None:
    request = ROUTE_REQUESTS[route]
    with nothing_changes(c, A):
        error = assert_api_error(send(c, request.call, basic(f"{route}-deny", "p"), **names), 403, 0)
    assert error["description"] == f'Permissions Violation for Publish to "{request.named}"'
    allowed = send(c, request.call, basic(f"{route}-exact", "p"), **names)
    assert allowed.status_code in request.call.ok, f"{route}: {allowed.status_code} {allowed.text[:300]}"
    by_wildcard = send(c, request.call, basic(f"{route}-wild", "p"), **names)
    assert by_wildcard.status_code not in (401, 403), by_wildcard.text[:300]


def test_a_batch_with_one_denied_subject_publishes_nothing(c: httpx.Client, names: dict[str, str]) -> None:
    producer = basic("publish.batch-exact", "p")  # may publish to orders.us only
    batch = {"messages": [{"subject": "orders.us", "text": "ok"}, {"subject": "orders.eu", "text": "not allowed"}]}
    with nothing_changes(c, A):
        error = assert_api_error(c.post("/v1/publish", json=batch, headers=producer), 403)
    assert error["description"] == 'Permissions Violation for Publish to "orders.eu"'
    ndjson = b'{"subject":"orders.us","text":"a"}\n{"subject":"orders.eu","text":"b"}\n'
    with nothing_changes(c, A):
        assert_api_error(c.post("/v1/publish", content=ndjson, headers={**producer, "content-type": "application/x-ndjson"}), 403)
    ok = c.post("/v1/publish", json={"messages": [{"subject": "orders.us", "text": "ok"}] * 3}, headers=producer)
    assert ok.status_code == 200 and all("seq" in a for a in ok.json()["acks"])


def test_ordinary_users_cannot_reach_the_system_accounts_routes(c: httpx.Client, names: dict[str, str]) -> None:
    for route in sorted(SYSTEM_ROUTES):
        with nothing_changes(c, A):
            assert_api_error(send(c, ROUTE_REQUESTS[route].call, A, **names), 403)
    listed = c.get("/v1/accounts", headers=OP).json()
    assert {a["name"] for a in listed["accounts"]} == {"A", "B", "C", "SYS", "default"}
    assert_api_error(c.get("/v1/streams", headers=OP), 503, 10039)  # the system account has no JetStream
    assert_api_error(c.get("/v1/accounts/NOPE", headers=OP), 404)


def test_the_operator_erases_in_any_account(c: httpx.Client, names: dict[str, str]) -> None:
    seq = c.post("/v1/publish/bonly.erase", content=b"personal", headers=B).json()["seq"]
    answer = c.post("/v1/accounts/B/erasures", json={"stream": "BONLY", "seq": seq}, headers=OP)
    assert answer.status_code == 202, answer.text
    assert_api_error(c.get(f"/v1/streams/BONLY/messages/{seq}", headers=B), 404, 10037)
    status = c.get(f"/v1/accounts/B/erasures/{answer.json()['id']}", headers=OP).json()
    assert status["stream"] == "BONLY" and status["messages"] == 1


def test_a_bucket_erasure_needs_the_right_to_purge_the_buckets_stream(
    c: httpx.Client, names: dict[str, str]
) -> None:
    assert c.put("/v1/objects/media/data/erase-me", content=b"personal", headers=A).status_code in (200, 201)
    body = {"bucket": "media", "object": "erase-me"}
    with nothing_changes(c, A):  # allowed to erase a message of ORDERS, not to purge OBJ_media
        error = assert_api_error(c.post("/v1/erasures", json=body, headers=basic("erasures.create-exact", "p")), 403)
    assert error["description"] == 'Permissions Violation for Publish to "$JS.API.STREAM.PURGE.OBJ_media"'
    answer = c.post("/v1/erasures", json=body, headers=basic("objects.delete-exact", "p"))  # may purge OBJ_media
    assert answer.status_code == 202 and answer.json()["messages"] == 2, answer.text
    assert_api_error(c.get("/v1/objects/media/info/erase-me", headers=A), 404)


def test_an_account_without_jetstream_gets_10039(c: httpx.Client) -> None:
    user = basic("c_user", "c-pw")
    for path in ("/v1/streams", "/v1/info", "/v1/kv"):
        assert_api_error(c.get(path, headers=user), 503, 10039)


# -- credentials --------------------------------------------------------------------------------

BAD_CREDENTIALS: list[list[tuple[bytes, bytes]]] = [
    [],
    [(b"authorization", b"Basic " + b"YV9hZG1pbjp3cm9uZw==")],  # a_admin:wrong
    [(b"authorization", b"Basic " + b"bm9ib2R5OmEtcHc=")],  # nobody:a-pw
    [(b"authorization", b"Basic YV9hZG1pbg==")],  # no colon
    [(b"authorization", b"Basic !!!not base64!!!")],
    [(b"authorization", b"Basic //79")],  # not UTF-8
    [(b"authorization", b"Basic ")],
    [(b"authorization", b"Bearer")],
    [(b"authorization", b"Bearer wrong-token")],
    [(b"authorization", b"Bearer " + b"a" * 20000)],
    [(b"authorization", b"Bearer \xff\xfe\xfd")],
    [(b"authorization", b"Digest username=a_admin")],
    [(b"authorization", b"a-token")],
    [(b"authorization", b"Bearer a-token"), (b"authorization", b"Bearer a-token")],
    [(b"authorization", b"Basic " + b"Y191c2VyOmMtcHc="), (b"authorization", b"Bearer a-token")],
    [(b"authorization", b"Basic " + b"YV90b2tlbjo=")],  # a_token by name, without its token
    [(b"authorization", b"Basic " + b"YV9iY3J5cHQ6JDJhJDA0JA==")],  # a_bcrypt with a hash-looking password
]


def test_header_values_http_forbids_never_reach_the_gateway(c: httpx.Client, names: dict[str, str]) -> None:
    with nothing_changes(c, A):
        for value in (b"Bearer a-token\x00", b"Basic \x01abc", b"Bearer a\x7ftoken"):
            response = _raw(c, ROUTE_REQUESTS["streams.delete"].call, [(b"authorization", value)], names)
            assert response.status_code in (400, 401), response.text


def test_methods_no_route_has_reach_no_handler(c: httpx.Client, names: dict[str, str]) -> None:
    for method in ("HEAD", "OPTIONS", "PATCH"):
        assert c.request(method, "/v1/streams/ORDERS").status_code == 405


def test_bad_or_missing_credentials_are_401_on_every_route(c: httpx.Client, names: dict[str, str]) -> None:
    before = _auth_failures(c)
    refusals = 0
    with nothing_changes(c, A):
        for route in [r.name for r in ROUTES if not r.open]:
            call = ROUTE_REQUESTS[route].call
            for headers in BAD_CREDENTIALS:
                response = _raw(c, call, headers, names)
                error = assert_api_error(response, 401, 0)
                assert error["description"] == "Authorization Violation"
                assert "Bearer" in response.headers["www-authenticate"]
                refusals += 1
    assert _auth_failures(c) - before == refusals
    health = c.get("/healthz")  # health needs no credentials, and names nothing of any account
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["flush"]["failing"] == 0


def test_each_kind_of_credentials_authenticates(c: httpx.Client, names: dict[str, str]) -> None:
    for headers in (A, {"Authorization": "Bearer a-token"}, {"Authorization": "bearer   a-token"}, basic("a_bcrypt", "bcrypt-pw")):
        assert c.get("/v1/streams/ORDERS", headers=headers).status_code == 200
    assert_api_error(c.get("/v1/streams/ORDERS", headers=basic("a_bcrypt", "bcrypt-pw2")), 401)


def _raw(c: httpx.Client, call: Call, headers: list[tuple[bytes, bytes]], names: dict[str, str]) -> httpx.Response:
    """The request with exactly these header lines, over a socket: HTTP clients refuse to send some."""
    path = call.path.format(**names).replace(">", "%3E")
    body = json.dumps(call.json).encode() if call.json is not None else (call.content or b"")
    url = httpx.URL(str(c.base_url))
    head = f"{call.method} {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n".encode()
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n"
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    response_headers = [tuple(line.split(": ", 1)) for line in lines[1:] if ": " in line]
    return httpx.Response(status, headers=response_headers, content=payload)


def _auth_failures(c: httpx.Client) -> int:
    text = c.get("/metrics", headers=OP).text
    return int(re.search(r"^jetlake_auth_failures_total (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]


# -- isolation ----------------------------------------------------------------------------------

PROBES: list[tuple[str, str, object]] = [
    ("GET", "/v1/streams/{stream}", None),
    ("PUT", "/v1/streams/{stream}", {"name": "{stream}", "subjects": ["probe.{lower}.>"]}),
    ("DELETE", "/v1/streams/{stream}", None),
    ("POST", "/v1/streams/{stream}/purge", {}),
    ("GET", "/v1/streams/{stream}/messages/1", None),
    ("GET", "/v1/streams/{stream}/messages?last_by_subj=bonly.x", None),
    ("DELETE", "/v1/streams/{stream}/messages/1", None),
    ("GET", "/v1/streams/{stream}/consumers", None),
    ("POST", "/v1/streams/{stream}/consumers/x/next", {"no_wait": True}),
    ("GET", "/v1/streams/ORDERS/consumers/{consumer}", None),
    ("PUT", "/v1/streams/ORDERS/consumers/{consumer}", {"durable_name": "{consumer}", "ack_policy": "explicit"}),
    ("DELETE", "/v1/streams/ORDERS/consumers/{consumer}", None),
    ("POST", "/v1/streams/ORDERS/consumers/{consumer}/next", {"no_wait": True}),
    ("POST", "/v1/streams/ORDERS/consumers/{consumer}/ack", {"acks": [{"seq": 1}]}),
    ("POST", "/v1/streams/ORDERS/consumers/{consumer}/unpin", {"group": "A"}),
    ("GET", "/v1/kv/{bucket}", None),
    ("GET", "/v1/kv/{bucket}/entries/k", None),
    ("GET", "/v1/kv/{bucket}/history/k", None),
    ("GET", "/v1/kv/{bucket}/keys", None),
    ("DELETE", "/v1/kv/{bucket}", None),
    ("GET", "/v1/objects/{obj}", None),
    ("GET", "/v1/objects/{obj}/info/o", None),
    ("GET", "/v1/objects/{obj}/data/o", None),
    ("GET", "/v1/objects/{obj}/list", None),
    ("POST", "/v1/objects/{obj}/seal", None),
    ("DELETE", "/v1/objects/{obj}", None),
    ("GET", "/v1/erasures/{erasure}", None),
    ("POST", "/v1/erasures", {"stream": "{stream}", "seq": 1}),
    ("POST", "/v1/erasures", {"bucket": "{bucket}", "key": "k"}),
    ("POST", "/v1/erasures", {"bucket": "{obj}", "object": "o"}),
    ("POST", "/v1/publish/{lower}.x", None),
    ("POST", "/v1/publish", {"messages": [{"subject": "{lower}.x", "text": "x"}]}),
    ("GET", "/v1/streams?subject={lower}.>", None),
    ("POST", "/v1/streams/{stream}/consumers", {"durable_name": "x", "ack_policy": "explicit"}),
    ("GET", "/v1/streams/ORDERS/consumers/{consumer}/messages", None),
    ("PUT", "/v1/kv/{bucket}/entries/k", "v"),
    ("DELETE", "/v1/kv/{bucket}/entries/k", None),
    ("GET", "/v1/kv/{bucket}/watch", None),
    ("PUT", "/v1/objects/{obj}/data/o", "o"),
    ("DELETE", "/v1/objects/{obj}/data/o", None),
    ("GET", "/v1/objects/{obj}/watch", None),
    ("POST", "/v1/streams", {"name": "{stream}", "subjects": ["probe.{lower}.>"]}),
    ("POST", "/v1/kv", {"bucket": "{bucket}"}),
    ("POST", "/v1/objects", {"bucket": "{obj}"}),
]
CREATES = {"/v1/streams": "/v1/streams/{stream}", "/v1/kv": "/v1/kv/{bucket}", "/v1/objects": "/v1/objects/{obj}"}


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def _probe(c: httpx.Client, method: str, path: str, body: object, values: dict[str, str]) -> tuple[int, str]:
    text = _fill(body if isinstance(body, str) else json.dumps(body), values) if body is not None else None
    response = c.request(method, _fill(path, values), content=text.encode() if text else b"x" if method == "POST" else None, headers=A)
    if method == "POST" and path in CREATES and response.status_code == 201:  # made in A: removed again
        c.delete(_fill(CREATES[path], values), headers=A).raise_for_status()
    out = response.text
    for value in values.values():
        out = out.replace(value, "<name>")
    return response.status_code, re.sub(r'"(ts|created|time|mtime)":"[^"]*"', "", out)


def test_every_route_that_names_something_is_probed() -> None:
    values = {"stream": "S", "lower": "s", "consumer": "C", "bucket": "b", "obj": "o", "erasure": "e"}
    probed = set()
    for method, path, _ in PROBES:
        found = operations.match(method, _fill(path, values).split("?")[0])
        assert found is not None, (method, path)
        probed.add(found[0].name)
    lists = {"kv.list", "objects.list", "info", "metrics", "flush", "cluster"}  # no name: see the next test
    assert probed == {r.name for r in ROUTES if not r.open and not r.system} - lists


def test_no_route_of_one_account_sees_names_of_another(c: httpx.Client, names: dict[str, str]) -> None:
    b_names = {"stream": "BONLY", "lower": "bonly", "consumer": "bcons", "bucket": "bkv", "obj": "bobj", "erasure": names["b_erasure"]}
    nowhere = {"stream": "NOWHERE", "lower": "nowhere", "consumer": "nocons", "bucket": "nokv", "obj": "noobj", "erasure": uuid.uuid4().hex}
    with nothing_changes(c, B):
        for method, path, body in PROBES:
            assert _probe(c, method, path, body, b_names) == _probe(c, method, path, body, nowhere), (method, path)


def test_two_accounts_have_their_own_orders_on_the_same_subjects(c: httpx.Client, gateway: Gateway, names: dict[str, str]) -> None:
    a_info = c.get("/v1/streams/ORDERS", headers=A).json()
    b_info = c.get("/v1/streams/ORDERS", headers=B).json()
    assert a_info["config"]["subjects"] == b_info["config"]["subjects"] == ["orders.>"]
    b_msgs = b_info["state"]["messages"]
    assert c.post("/v1/publish/orders.eu", content=b"to A", headers=A).json()["stream"] == "ORDERS"
    assert c.get("/v1/streams/ORDERS", headers=B).json()["state"]["messages"] == b_msgs
    assert c.get("/v1/streams/ORDERS/messages/1", headers=B).json()["message"]["data"] == "QjA="  # B0
    a_streams = {s["config"]["name"] for s in c.get("/v1/streams", headers=A).json()["streams"]}
    assert "BONLY" not in a_streams and "ORDERS" in a_streams
    a_buckets = {b["bucket"] for b in c.get("/v1/kv", headers=A).json()["buckets"]}
    assert "cfg" in a_buckets and "bkv" not in a_buckets
    info = c.get("/v1/info", headers=A).json()
    assert info["streams"] == len(a_streams)
    metrics = c.get("/metrics", headers=A).text
    assert "BONLY" not in metrics and 'account="B"' not in metrics and "jetlake_permission_denied_total" in metrics
    assert 'jetlake_stream_messages{account="B",stream="BONLY"}' in c.get("/metrics", headers=OP).text
    for account in ("A", "B"):
        assert (gateway.warehouse / account / "streams" / "ORDERS" / "_delta_log").is_dir() or (
            gateway.warehouse / account / "_wal" / "ORDERS"
        ).is_dir()
    assert not (gateway.warehouse / "A" / "streams" / "BONLY").exists()


def test_the_config_file_stays_out_of_the_logs(gateway: Gateway, names: dict[str, str]) -> None:
    log = Path(gateway.log).read_text()
    assert "a-pw" not in log and "a-token" not in log and "op-pw" not in log


def test_the_api_document_names_the_permission_of_every_route() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()
    permissions = text[text.index("## Authentication, accounts and permissions"):]
    for route in ROUTES:
        assert f"`{route.method} {route.path.replace(':path', '')}" in permissions, route.name


def test_remembered_decisions_are_per_subject_and_user(c: httpx.Client, names: dict[str, str]) -> None:
    for _ in range(2):  # the second round answers from what the gate remembered
        putter, getter = basic("kv.put-exact", "p"), basic("kv.get-exact", "p")
        assert c.put("/v1/kv/cfg/entries/app.timeout", content=b"1m", headers=putter).status_code == 200
        assert c.put("/v1/kv/cfg/entries/other", content=b"x", headers=putter).status_code == 403
        assert c.get("/v1/kv/cfg/entries/app.timeout", headers=getter).status_code == 200
        assert c.get("/v1/kv/cfg/entries/app.other", headers=getter).status_code == 403
        assert c.get("/v1/kv/cfg/entries/app.timeout?revision=1", headers=getter).status_code == 403  # DIRECT.GET.KV_cfg alone
        assert c.put("/v1/kv/cfg/entries/app.timeout", content=b"1m", headers=getter).status_code == 403
