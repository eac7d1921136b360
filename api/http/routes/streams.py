"""Streams and their messages: `$JS.API.STREAM.*` over HTTP."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.http import deps
from api.http.body import json_object
from api.http.responses import json_response
from engine import errors
from engine.info import parse_rfc3339, stored_message_json

router = APIRouter(prefix="/v1/streams")

_PURGE_FIELDS = {"filter", "seq", "keep"}



@router.post("")
async def create_stream(request: Request) -> Response:
    body = await json_object(request)
    engine = deps.authorize(request, stream=deps.text(body.get("name")))
    info, created = await run_in_threadpool(engine.add_stream, body)
    return json_response(info, 201 if created else 200)


@router.get("")
def list_streams(request: Request, subject: str | None = None, offset: int = 0, limit: int = 256) -> Response:
    return json_response(deps.engine(request).list_streams(subject, offset, limit))


@router.get("/{stream}")
def stream_info(request: Request, stream: str, subjects_filter: str | None = None, offset: int = 0) -> Response:
    return json_response(deps.engine(request).stream_info(stream, subjects_filter, offset))


@router.put("/{stream}")
async def update_stream(request: Request, stream: str) -> Response:
    body = await json_object(request)
    return json_response(await run_in_threadpool(deps.engine(request).update_stream, stream, body))


@router.delete("/{stream}")
def delete_stream(request: Request, stream: str) -> Response:
    deps.engine(request).delete_stream(stream)
    return json_response({"success": True})


@router.post("/{stream}/purge")
async def purge_stream(request: Request, stream: str) -> Response:
    body = await json_object(request, allow_empty=True)
    unknown = set(body) - _PURGE_FIELDS
    if unknown:
        raise errors.bad_request(f"unknown purge field {sorted(unknown)[0]!r}")
    filter_ = body.get("filter")
    seq, keep = body.get("seq", 0), body.get("keep", 0)
    if filter_ is not None and not isinstance(filter_, str):
        raise errors.bad_request("purge filter must be a string")
    if not _is_count(seq) or not _is_count(keep):
        raise errors.bad_request("purge seq and keep must be non-negative integers")
    purged = await run_in_threadpool(deps.engine(request).purge, stream, filter_ or None, seq, keep)
    return json_response({"success": True, "purged": purged})


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


@router.get("/{stream}/messages/{seq}")
def get_message(request: Request, stream: str, seq: int) -> Response:
    return json_response({"message": stored_message_json(deps.engine(request).get_message(stream, seq))})


@router.get("/{stream}/messages")
async def find_message(
    request: Request, stream: str, last_by_subj: str | None = None, next_by_subj: str | None = None, seq: int = 0,
    start_time: str | None = None,
) -> Response:
    """One literal subject's last message (an index lookup, then at most one row group decoded) is answered
    on the event loop, as the NATS door and a KV get answer it: a worker thread's hand-offs cost more than
    the read. The others (by sequence, by time, a wildcard's last, next_by_subj) may read a file's footer
    or many row groups, in a worker thread as before."""
    target = deps.engine(request).stream(stream)
    if start_time is not None:
        if last_by_subj is not None or seq:
            raise errors.bad_request("start_time goes alone or with next_by_subj")
        msg = await run_in_threadpool(target.at_or_after_time, _time(start_time), next_by_subj)
        return json_response({"message": stored_message_json(msg)})
    if (last_by_subj is None) == (next_by_subj is None):
        if last_by_subj is None and seq > 0:
            return json_response({"message": stored_message_json(await run_in_threadpool(target.get, seq))})
        raise errors.bad_request("give one of last_by_subj or next_by_subj (with seq), or seq")
    if last_by_subj is not None:
        if seq:
            raise errors.bad_request("seq goes with next_by_subj, not last_by_subj")
        if "*" in last_by_subj or ">" in last_by_subj:
            msg = await run_in_threadpool(target.last_by_subject, last_by_subj)
        else:
            msg = target.last_by_subject(last_by_subj)
    else:
        msg = await run_in_threadpool(target.next_by_subject, next_by_subj or "", seq)
    return json_response({"message": stored_message_json(msg)})


def _time(value: str) -> int:
    try:
        return parse_rfc3339(value)
    except ValueError:
        raise errors.bad_request(f"invalid start_time {value!r}: an RFC 3339 time") from None


@router.delete("/{stream}/messages/{seq}")
def delete_message(request: Request, stream: str, seq: int, no_erase: bool = False) -> Response:
    deps.engine(request).delete_message(stream, seq, erase=not no_erase)
    return json_response({"success": True})
