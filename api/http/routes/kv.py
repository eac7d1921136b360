"""Key/value buckets over HTTP: nats.go's KeyValue API as routes (see docs/api.md)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.http import deps
from api.http.body import json_object, read_body
from api.http.responses import json_response
from api.http.sse import watch_response
from engine import JetStream, errors
from engine.info import rfc3339
from engine.kv import KvEntry, Publisher
from engine.messages import InboundMessage, PublishResult

router = APIRouter(prefix="/v1/kv")


class _WouldWait(Exception):
    """The stream was busy: the write goes to the thread pool instead of the event loop."""


def _publish_now(engine: JetStream) -> Publisher:
    def send(message: InboundMessage) -> PublishResult:
        results = engine.publish_nowait([message])
        if results is None:
            raise _WouldWait
        return results[0]

    return send


def _revision_header(request: Request, name: str) -> int | None:
    raw = request.headers.get(name)
    if raw is None:
        return None
    text = raw.strip().removeprefix("W/").strip('"')
    if not (text.isascii() and text.isdigit()):  # str.isdigit() also takes "²", which int() refuses
        raise errors.bad_request(f"{name} must be a revision number, as N or \"N\"")
    return int(text)


def _key(request: Request, key: str) -> str:
    """The key as the whole rest of the path: Starlette's `{key:path}` ends its match before a trailing
    newline (`$`), so `a%0A` would otherwise be taken as key `a`."""
    if not request.scope["path"].endswith("/" + key):
        raise errors.bad_request("invalid key")
    return key


@router.post("")
async def create_bucket(request: Request) -> Response:
    body = await json_object(request)
    engine = deps.authorize(request, bucket=deps.text(body.get("bucket")))
    status, created = await run_in_threadpool(engine.kv.create, body)
    return json_response(status, 201 if created else 200)


@router.get("")
def list_buckets(request: Request) -> Response:
    return json_response(deps.engine(request).kv.list())


@router.get("/{bucket}")
def bucket_status(request: Request, bucket: str) -> Response:
    return json_response(deps.engine(request).kv.status(bucket))


@router.delete("/{bucket}")
def destroy_bucket(request: Request, bucket: str) -> Response:
    deps.engine(request).kv.destroy(bucket)
    return json_response({"success": True})


@router.put("/{bucket}/entries/{key:path}")
async def put(request: Request, bucket: str, key: str) -> Response:
    key = _key(request, key)
    value = await read_body(request)
    create = request.headers.get("if-none-match", "").strip() == "*"
    last = _revision_header(request, "if-match")
    if create and last is not None:
        raise errors.bad_request("give If-None-Match: * or If-Match, not both")
    if request.headers.get("if-none-match") is not None and not create:
        raise errors.bad_request("If-None-Match takes only *")
    kv = deps.engine(request).kv
    try:
        revision = kv.put(bucket, key, value, create=create, last_revision=last, publish=_publish_now(deps.engine(request)))
    except _WouldWait:
        revision = await run_in_threadpool(lambda: kv.put(bucket, key, value, create=create, last_revision=last))
    return json_response({"revision": revision})


@router.get("/{bucket}/entries/{key:path}")
async def get(request: Request, bucket: str, key: str, revision: int | None = None) -> Response:
    entry = deps.engine(request).kv.get(bucket, _key(request, key), revision)
    return Response(
        entry.value,
        media_type="application/octet-stream",
        headers={
            "KV-Revision": str(entry.revision),
            "KV-Operation": entry.operation,
            "KV-Created": rfc3339(entry.created),
            "ETag": f'"{entry.revision}"',
        },
    )


@router.delete("/{bucket}/entries/{key:path}")
async def delete(request: Request, bucket: str, key: str, purge: bool = False) -> Response:
    key = _key(request, key)
    last = _revision_header(request, "if-match")
    kv = deps.engine(request).kv
    revision = await run_in_threadpool(lambda: kv.delete(bucket, key, purge=purge, last_revision=last))
    return json_response({"revision": revision})


@router.get("/{bucket}/history/{key:path}")
def history(request: Request, bucket: str, key: str) -> Response:
    return json_response({"entries": [e.to_json() for e in deps.engine(request).kv.history(bucket, _key(request, key))]})


@router.get("/{bucket}/keys")
def keys(request: Request, bucket: str, filter: str = ">") -> Response:  # noqa: A002 - the API's name
    return json_response({"keys": deps.engine(request).kv.keys(bucket, filter)})


@router.get("/{bucket}/watch")
async def watch(
    request: Request,
    bucket: str,
    key: str = ">",
    include_history: bool = False,
    ignore_deletes: bool = False,
    updates_only: bool = False,
) -> Response:
    watcher = deps.engine(request).kv.watch(bucket, key, include_history, ignore_deletes, updates_only)
    return watch_response(request, watcher, KvEntry.to_json)
