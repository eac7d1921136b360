"""GDPR erasure requests: `POST /v1/erasures` and `GET /v1/erasures/{id}` (API.md, "GDPR erasure")."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api import deps
from api.body import json_object
from api.responses import json_response
from engine import JetStream, errors
from engine.erasures import registry

router = APIRouter(prefix="/v1/erasures")

_FIELDS = {"stream", "seq", "filter"}



@router.post("")
async def request_erasure(request: Request) -> Response:
    stream, seq, filter_ = parse_request(await json_object(request))
    engine = deps.authorize(request, stream=stream, by_seq="" if seq is not None else None, by_filter="" if filter_ is not None else None)
    return json_response(await erase(engine, stream, seq, filter_), 202)


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
