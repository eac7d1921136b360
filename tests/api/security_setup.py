"""The accounts, users and resources the security tests share, and a request for every route.

Account A holds a stream ORDERS, a consumer `reader`, a KV bucket `cfg`, an object store `media`
and an erasure; account B holds its own ORDERS and names A has not (BONLY, bcons, bkv, bobj); C has
no JetStream; SYS is the system account. For every route of api/http/operations.py, `ROUTE_REQUESTS` says
how to call it on A's resources and which subjects a user must be allowed to publish to (written
out here, independently of the declaration under test).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import httpx

from api.http.operations import ROUTES


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    stream: bool = False  # server-sent events: read the status, then hang up
    ok: frozenset[int] = frozenset({200, 201, 202})


@dataclass(frozen=True)
class RouteRequest:
    call: Call
    subjects: tuple[str, ...]  # what a user must be allowed (one subject per operation the call stands for)
    deny: tuple[str, ...] = ()  # what refuses it: every alternative of one operation (default: subjects[0])
    refused: str = ""  # the subject the 403 names (default: deny[0])

    @property
    def denied(self) -> tuple[str, ...]:
        return self.deny or self.subjects[:1]

    @property
    def named(self) -> str:
        return self.refused or self.denied[0]


OBJECT_META_READ = ("$JS.API.STREAM.MSG.GET.OBJ_media", "$JS.API.DIRECT.GET.OBJ_media.>")
B64 = lambda name: base64.urlsafe_b64encode(name.encode()).decode()  # noqa: E731

ROUTE_REQUESTS: dict[str, RouteRequest] = {
    "metrics": RouteRequest(Call("GET", "/metrics"), ("$JS.API.INFO",)),
    "info": RouteRequest(Call("GET", "/v1/info"), ("$JS.API.INFO",)),
    "flush": RouteRequest(Call("POST", "/v1/flush"), ("$JS.API.INFO",)),
    "cluster": RouteRequest(Call("GET", "/v1/cluster"), ("$JS.API.INFO",)),
    "streams.create": RouteRequest(Call("POST", "/v1/streams", {"name": "NEW1", "subjects": ["new1.>"]}), ("$JS.API.STREAM.CREATE.NEW1",)),
    "streams.list": RouteRequest(Call("GET", "/v1/streams"), ("$JS.API.STREAM.LIST",)),
    "streams.info": RouteRequest(Call("GET", "/v1/streams/ORDERS"), ("$JS.API.STREAM.INFO.ORDERS",)),
    "streams.update": RouteRequest(
        Call("PUT", "/v1/streams/ORDERS", {"name": "ORDERS", "subjects": ["orders.>"], "description": "updated"}),
        ("$JS.API.STREAM.UPDATE.ORDERS",),
    ),
    "streams.delete": RouteRequest(Call("DELETE", "/v1/streams/DOOMED"), ("$JS.API.STREAM.DELETE.DOOMED",)),
    "streams.purge": RouteRequest(Call("POST", "/v1/streams/ORDERS/purge", {"filter": "orders.none"}), ("$JS.API.STREAM.PURGE.ORDERS",)),
    "messages.get": RouteRequest(
        Call("GET", "/v1/streams/ORDERS/messages/1"), ("$JS.API.STREAM.MSG.GET.ORDERS",),
        ("$JS.API.STREAM.MSG.GET.ORDERS", "$JS.API.DIRECT.GET.ORDERS"),
    ),
    "messages.find": RouteRequest(
        Call("GET", "/v1/streams/ORDERS/messages?last_by_subj=orders.eu"), ("$JS.API.DIRECT.GET.ORDERS.orders.eu",),
        ("$JS.API.STREAM.MSG.GET.ORDERS", "$JS.API.DIRECT.GET.ORDERS.>"),
    ),
    "messages.delete": RouteRequest(Call("DELETE", "/v1/streams/ORDERS/messages/3?no_erase=true"), ("$JS.API.STREAM.MSG.DELETE.ORDERS",)),
    "publish.raw": RouteRequest(Call("POST", "/v1/publish/orders.eu", content=b"x"), ("orders.eu",)),
    "publish.batch": RouteRequest(Call("POST", "/v1/publish", {"messages": [{"subject": "orders.us", "text": "x"}]}), ("orders.us",)),
    "consumers.create": RouteRequest(
        Call("POST", "/v1/streams/ORDERS/consumers", {"durable_name": "c9", "filter_subject": "orders.eu", "ack_policy": "explicit"}),
        ("$JS.API.CONSUMER.CREATE.ORDERS.c9.orders.eu",),
        ("$JS.API.CONSUMER.CREATE.ORDERS.c9.orders.eu", "$JS.API.CONSUMER.DURABLE.CREATE.ORDERS.c9"),
    ),
    "consumers.list": RouteRequest(Call("GET", "/v1/streams/ORDERS/consumers"), ("$JS.API.CONSUMER.LIST.ORDERS",)),
    "consumers.info": RouteRequest(Call("GET", "/v1/streams/ORDERS/consumers/reader"), ("$JS.API.CONSUMER.INFO.ORDERS.reader",)),
    "consumers.update": RouteRequest(
        Call("PUT", "/v1/streams/ORDERS/consumers/reader", {"durable_name": "reader", "ack_policy": "explicit", "description": "u"}),
        ("$JS.API.CONSUMER.DURABLE.CREATE.ORDERS.reader",),
        ("$JS.API.CONSUMER.CREATE.ORDERS.reader", "$JS.API.CONSUMER.DURABLE.CREATE.ORDERS.reader"),
    ),
    "consumers.delete": RouteRequest(Call("DELETE", "/v1/streams/ORDERS/consumers/gone"), ("$JS.API.CONSUMER.DELETE.ORDERS.gone",)),
    "consumers.next": RouteRequest(
        Call("POST", "/v1/streams/ORDERS/consumers/reader/next", {"no_wait": True}), ("$JS.API.CONSUMER.MSG.NEXT.ORDERS.reader",)
    ),
    "consumers.unpin": RouteRequest(  # `reader` has no priority group: 10160 once past the permission check
        Call("POST", "/v1/streams/ORDERS/consumers/reader/unpin", {"group": "A"}, ok=frozenset({400})),
        ("$JS.API.CONSUMER.UNPIN.ORDERS.reader",),
    ),
    "consumers.ack": RouteRequest(
        Call("POST", "/v1/streams/ORDERS/consumers/reader/ack", {"acks": [{"seq": 1}]}), ("$JS.ACK.ORDERS.reader.>",)
    ),
    "consumers.consume": RouteRequest(
        Call("GET", "/v1/streams/ORDERS/consumers/reader/messages", stream=True), ("$JS.API.CONSUMER.MSG.NEXT.ORDERS.reader",)
    ),
    "kv.create": RouteRequest(Call("POST", "/v1/kv", {"bucket": "newkv"}), ("$JS.API.STREAM.CREATE.KV_newkv",)),
    "kv.list": RouteRequest(Call("GET", "/v1/kv"), ("$JS.API.STREAM.LIST",)),
    "kv.status": RouteRequest(Call("GET", "/v1/kv/cfg"), ("$JS.API.STREAM.INFO.KV_cfg",)),
    "kv.destroy": RouteRequest(Call("DELETE", "/v1/kv/doomedkv"), ("$JS.API.STREAM.DELETE.KV_doomedkv",)),
    "kv.put": RouteRequest(Call("PUT", "/v1/kv/cfg/entries/app.timeout", content=b"45s"), ("$KV.cfg.app.timeout",)),
    "kv.get": RouteRequest(
        Call("GET", "/v1/kv/cfg/entries/app.timeout"), ("$JS.API.DIRECT.GET.KV_cfg.$KV.cfg.app.timeout",),
        ("$JS.API.STREAM.MSG.GET.KV_cfg", "$JS.API.DIRECT.GET.KV_cfg.>"),
    ),
    "kv.delete": RouteRequest(Call("DELETE", "/v1/kv/cfg/entries/gone"), ("$KV.cfg.gone",)),
    "kv.history": RouteRequest(Call("GET", "/v1/kv/cfg/history/app.timeout"), ("$JS.API.CONSUMER.CREATE.KV_cfg.*.$KV.cfg.app.timeout",)),
    "kv.keys": RouteRequest(Call("GET", "/v1/kv/cfg/keys"), ("$JS.API.CONSUMER.CREATE.KV_cfg.*.$KV.cfg.>",)),
    "kv.watch": RouteRequest(Call("GET", "/v1/kv/cfg/watch?key=app.>", stream=True), ("$JS.API.CONSUMER.CREATE.KV_cfg.*.$KV.cfg.app.>",)),
    "objects.create": RouteRequest(Call("POST", "/v1/objects", {"bucket": "newobj"}), ("$JS.API.STREAM.CREATE.OBJ_newobj",)),
    "objects.list": RouteRequest(Call("GET", "/v1/objects"), ("$JS.API.STREAM.LIST",)),
    "objects.status": RouteRequest(Call("GET", "/v1/objects/media"), ("$JS.API.STREAM.INFO.OBJ_media",)),
    "objects.destroy": RouteRequest(Call("DELETE", "/v1/objects/doomedobj"), ("$JS.API.STREAM.DELETE.OBJ_doomedobj",)),
    "objects.seal": RouteRequest(
        Call("POST", "/v1/objects/sealme/seal"), ("$JS.API.STREAM.INFO.OBJ_sealme", "$JS.API.STREAM.UPDATE.OBJ_sealme")
    ),
    "objects.list_objects": RouteRequest(Call("GET", "/v1/objects/media/list"), ("$JS.API.CONSUMER.CREATE.OBJ_media.*.$O.media.M.>",)),
    "objects.watch": RouteRequest(Call("GET", "/v1/objects/media/watch", stream=True), ("$JS.API.CONSUMER.CREATE.OBJ_media.*.$O.media.M.>",)),
    "objects.info": RouteRequest(
        Call("GET", "/v1/objects/media/info/doc"), (f"$JS.API.DIRECT.GET.OBJ_media.$O.media.M.{B64('doc')}",),
        OBJECT_META_READ,
    ),
    "objects.put": RouteRequest(
        Call("PUT", "/v1/objects/media/data/doc2", content=b"second document"),
        ("$JS.API.STREAM.MSG.GET.OBJ_media", "$O.media.C.*", f"$O.media.M.{B64('doc2')}"), OBJECT_META_READ,
    ),
    "objects.get": RouteRequest(
        Call("GET", "/v1/objects/media/data/doc"), ("$JS.API.STREAM.MSG.GET.OBJ_media", "$JS.API.CONSUMER.CREATE.OBJ_media.*.$O.media.C.*"),
        OBJECT_META_READ,
    ),
    "objects.delete": RouteRequest(
        Call("DELETE", "/v1/objects/media/data/doc3"),
        ("$JS.API.STREAM.MSG.GET.OBJ_media", f"$O.media.M.{B64('doc3')}", "$JS.API.STREAM.PURGE.OBJ_media"),
        OBJECT_META_READ,
    ),
    "erasures.create": RouteRequest(Call("POST", "/v1/erasures", {"stream": "ORDERS", "seq": 4}), ("$JS.API.STREAM.MSG.DELETE.ORDERS",)),
    "erasures.status": RouteRequest(Call("GET", "/v1/erasures/{erasure}"), ("$JS.API.STREAM.INFO.ORDERS",)),
    "accounts.list": RouteRequest(Call("GET", "/v1/accounts"), ("$SYS.REQ.SERVER.PING.ACCOUNTZ",)),
    "accounts.info": RouteRequest(Call("GET", "/v1/accounts/A"), ("$SYS.REQ.ACCOUNT.A.JSZ",)),
    "accounts.erase": RouteRequest(Call("POST", "/v1/accounts/A/erasures", {"stream": "ORDERS", "seq": 5}), ("$SYS.REQ.ACCOUNT.A.ERASE",)),
    "accounts.erasure": RouteRequest(Call("GET", "/v1/accounts/A/erasures/{erasure}"), ("$SYS.REQ.ACCOUNT.A.JSZ",)),
    "accounts.rotate_key": RouteRequest(  # account A has no key: the allowed call reaches the engine's 400
        Call("POST", "/v1/accounts/A/streams/ORDERS/rotate-key", ok=frozenset({400})),
        ("$SYS.REQ.ACCOUNT.A.KEY.ROTATE.ORDERS",)),
    "accounts.delete": RouteRequest(  # A is in the config: the allowed call reaches the registry's 409
        Call("DELETE", "/v1/accounts/A", ok=frozenset({409})), ("$JS.API.ACCOUNT.PURGE.A",)),
}
SYSTEM_ROUTES = {r.name for r in ROUTES if r.system}
ACCOUNT_ROUTES = [r.name for r in ROUTES if not r.open and not r.system]


def wildcard(subject: str) -> str:
    """A grant covering `subject` by a wildcard: its first three tokens and `>`, or its last token as `*`."""
    tokens = subject.split(".")
    return ".".join(tokens[:3]) + ".>" if len(tokens) > 3 else ".".join(tokens[:-1] + ["*"])


def _user(name: str, password: str, publish: dict[str, list[str]] | None = None) -> str:
    perms = ""
    if publish is not None:
        parts = ", ".join(f"{k}: [{', '.join(_q(s) for s in v)}]" for k, v in publish.items())
        perms = f", permissions: {{ publish: {{ {parts} }} }}"
    return f"      {{ user: {_q(name)}, password: {_q(password)}{perms} }}"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def route_users(route: str) -> list[str]:
    """Three users per route: allowed its subjects exactly, allowed them by wildcards, denied one over `>`."""
    request = ROUTE_REQUESTS[route]
    return [
        _user(f"{route}-exact", "p", {"allow": list(request.subjects)}),
        _user(f"{route}-wild", "p", {"allow": [wildcard(s) for s in request.subjects]}),
        _user(f"{route}-deny", "p", {"allow": [">"], "deny": list(request.denied)}),
    ]


def config_text(bcrypt_password: str) -> str:
    hashed = bcrypt.hashpw(bcrypt_password.encode(), bcrypt.gensalt(4, prefix=b"2a")).decode()
    a_users = [
        _user("a_admin", "a-pw"),
        "      { user: a_token, token: a-token }",
        _user("a_bcrypt", hashed),
        *[u for route in ACCOUNT_ROUTES for u in route_users(route)],
    ]
    sys_users = [_user("op", "op-pw"), *[u for route in sorted(SYSTEM_ROUTES) for u in route_users(route)]]
    return (
        "system_account: SYS\naccounts {\n"
        "  SYS {\n    users: [\n" + "\n".join(sys_users) + "\n    ]\n  }\n"
        "  A {\n    jetstream: enabled\n    users: [\n" + "\n".join(a_users) + "\n    ]\n  }\n"
        "  B {\n    jetstream: enabled\n    users: [\n" + _user("b_admin", "b-pw") + "\n    ]\n  }\n"
        "  C {\n    users: [\n" + _user("c_user", "c-pw") + "\n    ]\n  }\n"
        "}\n"
    )


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def send(client: httpx.Client, call: Call, headers: dict[str, str] | None = None, **names: str) -> httpx.Response:
    path = call.path.format(**names) if names else call.path
    if call.stream:
        with client.stream(call.method, path, headers=headers) as response:
            response.read() if response.status_code >= 300 else None
            return response
    return client.request(call.method, path, json=call.json, content=call.content, headers=headers)


def setup_account(c: httpx.Client, admin: dict[str, str], orders_subjects: list[str] | None = None) -> dict[str, str]:
    """ORDERS with six messages, consumers `reader` and `gone`, streams DOOMED, KV `cfg` (and `doomedkv`),
    object stores `media` (objects doc, doc3), `doomedobj`, `sealme`, and an erasure; returns its id."""
    def ok(response: httpx.Response) -> httpx.Response:
        assert response.status_code < 300, response.text
        return response

    ok(c.post("/v1/streams", json={"name": "ORDERS", "subjects": orders_subjects or ["orders.>"]}, headers=admin))
    for i in range(6):
        ok(c.post(f"/v1/publish/orders.{'eu' if i % 2 == 0 else 'us'}", content=f"A{i}".encode(), headers=admin))
    for name in ("reader", "gone"):
        ok(c.post("/v1/streams/ORDERS/consumers", json={"durable_name": name, "ack_policy": "explicit"}, headers=admin))
    ok(c.post("/v1/streams", json={"name": "DOOMED", "subjects": ["doomed.>"]}, headers=admin))
    for bucket in ("cfg", "doomedkv"):
        ok(c.post("/v1/kv", json={"bucket": bucket}, headers=admin))
    ok(c.put("/v1/kv/cfg/entries/app.timeout", content=b"30s", headers=admin))
    for bucket in ("media", "doomedobj", "sealme"):
        ok(c.post("/v1/objects", json={"bucket": bucket}, headers=admin))
    for name in ("doc", "doc3"):
        ok(c.put(f"/v1/objects/media/data/{name}", content=b"document " + name.encode(), headers=admin))
    return {"erasure": ok(c.post("/v1/erasures", json={"stream": "ORDERS", "seq": 6}, headers=admin)).json()["id"]}


def snapshot(c: httpx.Client, admin: dict[str, str]) -> dict[str, Any]:
    """What a refused request must leave as it was: streams, their messages and consumers, keys, objects."""
    streams = c.get("/v1/streams", headers=admin).json()["streams"]
    state = {
        s["config"]["name"]: (s["config"], {k: v for k, v in s["state"].items() if not k.endswith("_ts")}) for s in streams
    }
    consumers = c.get("/v1/streams/ORDERS/consumers", headers=admin).json().get("consumers", [])
    return {
        "streams": state,
        "consumers": sorted((x["name"], x["delivered"]["stream_seq"], x["num_ack_pending"]) for x in consumers),
        "keys": c.get("/v1/kv/cfg/keys", headers=admin).json(),
        "objects": sorted(o["name"] for o in c.get("/v1/objects/media/list", headers=admin).json().get("objects", [])),
    }


@contextmanager
def nothing_changes(c: httpx.Client, admin: dict[str, str]) -> Iterator[None]:
    before = snapshot(c, admin)
    yield
    assert snapshot(c, admin) == before


def config_file(folder: Path, bcrypt_password: str) -> Path:
    path = folder / "gateway.conf"
    path.write_text(config_text(bcrypt_password))
    return path
