"""GDPR erasure requests: `POST /v1/erasures` and `GET /v1/erasures/{id}` (API.md, "GDPR erasure")."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api import deps
from api.body import json_object
from api.responses import json_response
from engine import errors
from engine.erasures import registry

router = APIRouter(prefix="/v1/erasures")

_FIELDS = {"stream", "seq", "filter"}



@router.post("")
async def request_erasure(request: Request) -> Response:
    body = await json_object(request)
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
    engine = deps.engine(request)
    target = engine.stream(stream)
    answer = await run_in_threadpool(registry(engine.layout).erase, target, seq, filter_)
    return json_response(answer, 202)


@router.get("/{erasure_id}")
def erasure_status(request: Request, erasure_id: str) -> Response:
    return json_response(registry(deps.engine(request).layout).get(erasure_id))


def _is_seq(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**63
