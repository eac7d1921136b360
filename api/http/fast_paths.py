"""The hot routes, dispatched without FastAPI's routing and parameter solving.

A single publish, a KV get or put, a pull and an ack are one small request each; FastAPI's router,
dependency solving and middleware chain cost about as much as the work itself (a bare ASGI answer is
twice as fast on this kind of machine). This ASGI middleware takes the route the gate matched in
the one route declaration (api/http/operations.py, which also holds the permission each route needs) and
calls the very same endpoint functions with a Starlette `Request`, so behaviour, parsing, checks and
errors stay those of the routes; anything else — other routes, a query string it would have to
parse, a path FastAPI would treat differently — goes to FastAPI unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http import errors, operations
from api.http.gate import ROUTE
from api.http.routes import consumers, kv, publish, streams, system

Endpoint = Callable[..., Awaitable[Response]]

# The hot routes of api/http/operations.py and their endpoints: path and permission come from that table.
_ENDPOINTS: dict[str, Endpoint] = {
    "publish.raw": publish.publish_raw,
    "publish.batch": publish.publish_batch,
    "consumers.next": consumers.next_messages,
    "consumers.ack": consumers.ack,
    "kv.get": kv.get,
    "messages.find": streams.find_message,
    "kv.put": kv.put,
    "health": system.healthz,
}

# Endpoint parameters other than the request and the path: a fast call passes their defaults.
_DEFAULTED = {kv.get: {"revision": None},
              streams.find_message: {"last_by_subj": None, "next_by_subj": None, "seq": 0, "start_time": None}}

# The string parameters a fast call may take from the query string (each once, not empty); a query
# string with anything else goes to FastAPI, which parses and checks every other kind.
_QUERIED = {"messages.find": frozenset({"last_by_subj"})}


def _check_endpoints() -> None:
    for name, endpoint in _ENDPOINTS.items():
        if name not in operations.BY_NAME:
            raise TypeError(f"fast route {name} is not declared in api/http/operations.py")
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"{endpoint.__name__} must be async to be answered on the event loop")


_check_endpoints()


class FastPaths:
    """ASGI middleware in front of FastAPI's router for the routes of `_ENDPOINTS`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = _match(scope)
        if match is None:
            await self.app(scope, receive, send)
            return
        endpoint, params = match
        request = Request(scope, receive, send)
        try:
            response = await endpoint(request, **params)
        except Exception as exc:  # noqa: BLE001 - mapped as FastAPI's handlers map it
            response = errors.answer(request, exc)
        await response(scope, receive, send)


def _match(scope: Scope) -> tuple[Endpoint, dict[str, Any]] | None:
    """The endpoint of a hot route and its path parameters; None leaves the request to FastAPI (a query
    string other than `_QUERIED`'s, a newline or an empty parameter in the path, any other route)."""
    if scope["type"] != "http":
        return None
    found = scope.get(ROUTE) or operations.match(scope["method"], scope["path"])
    if found is None:
        return None
    route, params = found
    endpoint = _ENDPOINTS.get(route.name)
    if endpoint is None or not all(params.values()) or "\n" in scope["path"] or "\r" in scope["path"]:
        return None
    query = _query(route.name, scope.get("query_string") or b"")
    if query is None:
        return None
    return endpoint, {**params, **_DEFAULTED.get(endpoint, {}), **query}


def _query(route: str, raw: bytes) -> dict[str, str] | None:
    """The query parameters a fast call takes (decoded as Starlette decodes them); None if there are
    others, repeats or empty values."""
    if not raw:
        return {}
    allowed = _QUERIED.get(route)
    if allowed is None:
        return None
    pairs = parse_qsl(raw.decode("latin-1"), keep_blank_values=True)
    query = dict(pairs)
    if len(query) != len(pairs) or not query.keys() <= allowed or not all(query.values()):
        return None
    return query
