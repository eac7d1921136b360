"""The hot routes, dispatched without FastAPI's routing and parameter solving.

A single publish, a KV get or put, a pull and an ack are one small request each; FastAPI's router,
dependency solving and middleware chain cost about as much as the work itself (a bare ASGI answer is
twice as fast on this kind of machine). This ASGI middleware matches those few routes by a regular
expression and calls the very same endpoint functions with a Starlette `Request`, so behaviour,
parsing and errors stay those of the routes; anything it does not match — other routes, a query
string it would have to parse, a path FastAPI would treat differently — goes to FastAPI unchanged.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from api import errors
from api.routes import consumers, kv, publish, system

Endpoint = Callable[..., Awaitable[Response]]

# (method, full-match path pattern, endpoint): named groups are the endpoint's path parameters.
_ROUTES: list[tuple[str, re.Pattern[str], Endpoint]] = [
    ("POST", re.compile(r"/v1/publish/(?P<subject>[^\r\n]+)"), publish.publish_raw),
    ("POST", re.compile(r"/v1/publish"), publish.publish_batch),
    ("POST", re.compile(r"/v1/streams/(?P<stream>[^/]+)/consumers/(?P<consumer>[^/]+)/next"), consumers.next_messages),
    ("POST", re.compile(r"/v1/streams/(?P<stream>[^/]+)/consumers/(?P<consumer>[^/]+)/ack"), consumers.ack),
    ("GET", re.compile(r"/v1/kv/(?P<bucket>[^/]+)/entries/(?P<key>[^\r\n]+)"), kv.get),
    ("PUT", re.compile(r"/v1/kv/(?P<bucket>[^/]+)/entries/(?P<key>[^\r\n]+)"), kv.put),
    ("GET", re.compile(r"/healthz"), system.healthz),
]

# Endpoint parameters other than the request and the path: a fast call passes their defaults.
_DEFAULTED = {kv.get: {"revision": None}}


def _check_endpoints() -> None:
    for _, _, endpoint in _ROUTES:
        if not inspect.iscoroutinefunction(endpoint):
            raise TypeError(f"{endpoint.__name__} must be async to be answered on the event loop")


_check_endpoints()


class FastPaths:
    """ASGI middleware in front of FastAPI's router for the routes of `_ROUTES`."""

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
    if scope["type"] != "http" or scope.get("query_string"):
        return None
    method, path = scope["method"], scope["path"]
    for route_method, pattern, endpoint in _ROUTES:
        if method != route_method:
            continue
        found = pattern.fullmatch(path)
        if found is not None:
            return endpoint, {**found.groupdict(), **_DEFAULTED.get(endpoint, {})}
    return None
