"""GDPR erasure requests: `POST /v1/erasures` and `GET /v1/erasures/{id}` (API.md, "GDPR erasure").

Beyond API.md (an extension): `{"bucket", "key"}` erases every stored revision of a KV key and
`{"bucket", "object"}` every stored version of an object, its chunks included; either needs the
right to purge the bucket's stream, as a filter erasure does.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.http import deps
from api.http.body import json_object
from api.http.responses import json_response
from engine import JetStream, errors
from engine.buckets import check_bucket
from engine.erasures import registry
from engine.kv import stream_name as kv_stream
from engine.objects import stream_name as object_stream

router = APIRouter(prefix="/v1/erasures")

_FIELDS = {"stream", "seq", "filter"}
_BUCKET_FIELDS = {"bucket", "key", "object"}


@router.post("")
async def request_erasure(request: Request) -> Response:
    body = await json_object(request)
    if "bucket" in body:
        bucket, key, name = parse_bucket_request(body)
        stream = kv_stream(bucket) if key is not None else object_stream(bucket)
        engine = deps.authorize(request, stream=stream, by_seq=None, by_filter="")
        return json_response(await erase_in_bucket(engine, bucket, key, name), 202)
    stream, seq, filter_ = parse_request(body)
    engine = deps.authorize(request, stream=stream, by_seq="" if seq is not None else None, by_filter="" if filter_ is not None else None)
    return json_response(await erase(engine, stream, seq, filter_), 202)


def parse_bucket_request(body: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """`{"bucket", "key" | "object"}`, checked: (bucket, key, object name)."""
    unknown = set(body) - _BUCKET_FIELDS
    if unknown:
        raise errors.bad_request(f"unknown erasure field {sorted(unknown)[0]!r} (a stream or a bucket, not both)")
    bucket, key, name = body.get("bucket"), body.get("key"), body.get("object")
    if not isinstance(bucket, str) or not bucket:
        raise errors.bad_request("erasure bucket must be a bucket name")
    check_bucket(bucket)
    if (key is None) == (name is None):
        raise errors.bad_request("give one of key or object with a bucket")
    if key is not None and not isinstance(key, str):
        raise errors.bad_request("erasure key must be a string")
    if name is not None and not isinstance(name, str):
        raise errors.bad_request("erasure object must be an object name")
    return bucket, key, name


async def erase_in_bucket(engine: JetStream, bucket: str, key: str | None, name: str | None) -> dict[str, Any]:
    erasures = registry(engine.layout)
    if key is not None:
        return await run_in_threadpool(erasures.erase_key, engine.kv, bucket, key)  # type: ignore[no-any-return]
    assert name is not None
    return await run_in_threadpool(erasures.erase_object, engine.objects, bucket, name)  # type: ignore[no-any-return]


def parse_request(body: dict[str, Any]) -> tuple[str, int | None, str | None]:
    """`{"stream", "seq" | "filter"}`, checked."""
    unknown = set(body) - _FIELDS
    if unknown:
        raise errors.bad_request(f"unknown erasure field {sorted(unknown)[0]!r}")
    stream, seq, filter_ = body.get("stream"), body.get("seq"), body.get("filter")
    if not isinstance(stream, str) or not stream:
        raise errors.bad_request("erasure needs a stream name")
    if seq is not None and not _is_seq(seq):
        raise errors.bad_request("erasure seq must be a positive integer")
    if filter_ is not None and (not isinstance(filter_, str) or not filter_):
        raise errors.bad_request("erasure filter must be a subject")
    if (seq is None) == (filter_ is None):
        raise errors.bad_request("give one of seq or filter")
    return stream, seq, filter_


async def erase(engine: JetStream, stream: str, seq: int | None, filter_: str | None) -> dict[str, Any]:
    target = engine.stream(stream)
    return await run_in_threadpool(registry(engine.layout).erase, target, seq, filter_)  # type: ignore[no-any-return]


@router.get("/{erasure_id}")
def erasure_status(request: Request, erasure_id: str) -> Response:
    answer = registry(deps.lookup(request).layout).get(erasure_id)
    deps.authorize(request, stream=answer["stream"])
    return json_response(answer)


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63
