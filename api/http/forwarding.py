"""Forwarding: a request for a stream another gateway owns is proxied to that gateway.

Several gateways share a warehouse and each stream has one owner (engine/cluster/ownership.py).
Any gateway serves any request: one for a stream owned elsewhere is sent on, as it came (method,
path, query, headers, body), to the owner's advertised HTTP address, and the owner's answer comes
back as it went (status, headers, body, streamed: SSE consumes too), so a client never sees which
gateway served it. Proxy, not redirect: clients (curl, nats.py over HTTP, load balancers) need not
follow a 307 with the body again, credentials stay on one connection, and one address list (or one
load balancer) is all a client needs; `GET /v1/cluster` lists the gateways for those that want to
spread their connections. The cost is one more loopback or LAN hop for requests that land on a
non-owner.

Which stream a request concerns comes from the one route declaration (api/http/operations.py,
matched by the gate, which runs first and authenticates): a `{stream}`, a KV or object `{bucket}`
(`KV_<b>`, `OBJ_<b>`), a published subject (the stream capturing it), or a create's body (the
owner-to-be by rendezvous creates it). A forwarded request carries `Jetlake-Forwarded` and is never
forwarded again (no loops while ownership moves); its gateway serves it or answers as it would.
Two kinds of request concern several streams and are not sent whole: account-wide views (the stream
list, account info, bucket lists) ask every gateway and merge (api/http/cluster_views.py), and a batch
publish spanning streams of several owners is split by owner (api/http/batch_split.py).
When no owner answers within `timeout` seconds (it died and its leases have not expired yet, or no
gateway is live) the answer is JetStream's 503 (10008, "JetStream system temporarily unavailable").
Counterpart: nats-server's route forwarding of `$JS.API` requests to the stream leader.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import httpx
import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http import batch_split, binary_batch, cluster_views
from api.http.gate import ACCESS, ROUTE
from api.http.peers import Answer, Locator, replay
from api.http.responses import json_response
from engine import errors

log = logging.getLogger(__name__)

FORWARDED = b"jetlake-forwarded"
DEFAULT_TIMEOUT = 10.0
_RETRY_PAUSE = 0.1
_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te", b"trailer",
    b"transfer-encoding", b"upgrade", b"host", b"content-length",
})
_CREATES = {"streams.create": ("name", ""), "kv.create": ("bucket", "KV_"), "objects.create": ("bucket", "OBJ_")}


def target_stream(route: str, params: dict[str, Any]) -> str | None:
    """The stream a matched route acts on, from its path parameters; None for account-wide routes."""
    if "bucket" in params and route.startswith("kv."):
        return f"KV_{params['bucket']}"
    if "bucket" in params and route.startswith("objects."):
        return f"OBJ_{params['bucket']}"
    stream = params.get("stream")
    return str(stream) if stream else None


class Forwarder:
    """Sends a request on to another gateway and relays its answer, over one pooled client."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.timeout = timeout
        # No read bound: a pull may wait for messages, an SSE consume lasts as long as the client stays.
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(connect=2.0, read=None, write=60.0, pool=timeout))

    async def forward(self, scope: Scope, body: bytes, base_url: str, send: Send) -> bool:
        """Relays the request to `base_url`; False if no connection could be made (nothing was sent,
        so the caller may locate the owner again and retry)."""
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP] + [(FORWARDED, b"1")]
        url = base_url.rstrip("/") + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        request = self.client.build_request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self.client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            log.info("forwarding %s %s to %s: %s", scope["method"], scope["path"], base_url, exc)
            return False
        try:
            relayed = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP - {b"content-length"}]
            await send({"type": "http.response.start", "status": response.status_code, "headers": relayed})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await response.aclose()
        return True

    async def fetch(self, scope: Scope, body: bytes, base_url: str, timeout: float | None = None) -> Answer | None:
        """The whole answer of another gateway to the request of `scope` with `body` (its query as in
        the scope); None when it could not be reached or did not answer within `timeout`."""
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP] + [(FORWARDED, b"1")]
        url = base_url.rstrip("/") + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        bound = httpx.Timeout(timeout) if timeout is not None else httpx.Timeout(connect=2.0, read=None, write=60.0,
                                                                                    pool=self.timeout)
        try:
            response = await self.client.request(scope["method"], url, headers=headers, content=body, timeout=bound)
        except httpx.HTTPError as exc:
            log.info("asking %s %s of %s: %s", scope["method"], scope["path"], base_url, exc)
            return None
        return Answer(response.status_code, response.content)

    async def aclose(self) -> None:
        await self.client.aclose()


class ForwardingMiddleware:
    """Inside the gate: serves here what this gateway owns, proxies the rest to the owner."""

    def __init__(self, app: ASGIApp, locator: Locator, forwarder: Forwarder | None = None) -> None:
        self.app = app
        self.locator = locator
        self.forwarder = forwarder or Forwarder()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        access = scope.get(ACCESS) if scope["type"] == "http" else None
        if access is None or any(k == FORWARDED for k, _ in scope["headers"]):
            await self.app(scope, receive, send)
            return
        route, params = scope[ROUTE]
        body: bytes | None = None  # None: not read yet (the route reads it if served here)
        stream = target_stream(route.name, params)
        if route.name == "publish.raw":
            stream = await asyncio.to_thread(self.locator.stream_for_subject, access.account.name, params["subject"])
        elif route.name == "publish.batch":
            body = await _read_body(receive)
            if await self._publish_split(scope, receive, send, access.account.name, body):
                return
            subject = _first_subject(scope, body)
            if subject is not None:
                stream = await asyncio.to_thread(self.locator.stream_for_subject, access.account.name, subject)
        elif route.name in cluster_views.VIEWS:
            await cluster_views.answer(self.app, self.locator, self.forwarder.fetch, access.account.name, scope,
                                       receive, send)
            return
        elif route.name in _CREATES:
            body = await _read_body(receive)
            stream = _created_name(route.name, body)
        if stream is None:
            await self.app(scope, receive if body is None else replay(body, receive), send)
            return
        await self._serve(scope, receive, send, access.account.name, stream, body)

    async def _publish_split(self, scope: Scope, receive: Receive, send: Send, account: str, body: bytes) -> bool:
        """A batch for streams of several owners, split by owner (api/http/batch_split.py); False when
        it has one owner (or does not parse), to be served or forwarded whole."""
        content_type = next((v for k, v in scope["headers"] if k.lower() == b"content-type"), b"").decode("latin-1")
        batch = batch_split.parse(content_type, body)
        if batch is None:
            return False
        groups = await asyncio.to_thread(batch_split.owners, self.locator, account, batch.subjects)
        if len(groups) < 2:
            return False
        deadline = time.monotonic() + self.forwarder.timeout
        acks = await batch_split.publish(self.app, self.locator, self.forwarder.fetch, account, scope, receive, batch,
                                         deadline)
        await json_response({"acks": acks}, 200)(scope, receive, send)
        return True

    async def _serve(self, scope: Scope, receive: Receive, send: Send, account: str, stream: str,
                     body: bytes | None) -> None:
        """Serves here or forwards, locating the owner again after each failed connection until the
        bound: a stream moving (its owner died, another claims it) is served once it has moved."""
        deadline = time.monotonic() + self.forwarder.timeout
        while True:
            owner = await asyncio.to_thread(self.locator.owner_url, account, stream)
            if owner is None:
                await self.app(scope, receive if body is None else replay(body, receive), send)
                return
            if body is None:
                body = await _read_body(receive)
            if owner and await self.forwarder.forward(scope, body, owner, send):
                return
            if time.monotonic() + _RETRY_PAUSE >= deadline:
                break
            await asyncio.sleep(_RETRY_PAUSE)
        exc = errors.cluster_unavailable(f"no gateway owning stream {stream} answered")
        response = json_response({"type": "io.nats.jetstream.api.v1.error_response", "error": exc.to_dict()}, exc.code)
        await response(scope, receive, send)


def _first_subject(scope: Scope, body: bytes) -> str | None:
    """The subject of a batch's first message (JSON, NDJSON or binary): a batch whose messages all have
    one owner goes to the owner of the stream that captures it. None when the body does not parse: the
    route answers it here."""
    content_type = next((v for k, v in scope["headers"] if k.lower() == b"content-type"), b"").decode("latin-1")
    try:
        if content_type.partition(";")[0].strip().lower() == binary_batch.MEDIA_TYPE:
            if body[:4] != binary_batch.MAGIC:
                return None
            length = int.from_bytes(body[4:8], "big")
            return body[16 : 16 + length].decode()
        if "ndjson" in content_type:
            first = next((line for line in body.splitlines() if line.strip()), b"")
            return str(orjson.loads(first)["subject"])
        return str(orjson.loads(body)["messages"][0]["subject"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


def _created_name(route: str, body: bytes) -> str | None:
    """The stream a create makes, from its body; None when the body is not a JSON object (the route answers)."""
    field, prefix = _CREATES[route]
    try:
        value = orjson.loads(body).get(field) if body else None
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return f"{prefix}{value}" if isinstance(value, str) and value else None


async def _read_body(receive: Receive) -> bytes:
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)
