"""Consumers: `$JS.API.CONSUMER.*`, pulls that long-poll, acks, and `consume()` over server-sent events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.http import delivered_batch, deps
from api.http.body import json_object
from api.http.operations import ANY
from api.http.responses import json_response
from engine import JetStream, JetStreamError, errors
from engine.consumer import Delivery
from engine.consumer_config import ConsumerConfig
from engine.info import stored_message_json
from engine.pacing import Pacer

router = APIRouter(prefix="/v1/streams/{stream}/consumers")

NS = 1_000_000_000
DEFAULT_EXPIRES = 30 * NS
MAX_EXPIRES = 300 * NS
MAX_DELAY = MAX_SEQ = 2**63 - 1  # the ack log's int64
_NEXT_FIELDS = {"batch", "expires", "no_wait", "max_bytes", "idle_heartbeat"}




@router.post("")
async def create_consumer(request: Request, stream: str) -> Response:
    body = await json_object(request)
    durable, name = deps.text(body.get("durable_name")) or None, deps.text(body.get("name")) or None
    named = durable or name
    engine = deps.authorize(
        request, consumer=named or ANY, durable=durable, unnamed=None if named else "", filter=_single_filter(body)
    )
    info, created = await run_in_threadpool(engine.add_consumer, stream, body)
    return json_response(info, 201 if created else 200)


@router.get("")
def list_consumers(request: Request, stream: str, offset: int = 0, limit: int = 256) -> Response:
    return json_response(deps.engine(request).list_consumers(stream, offset, limit))


@router.get("/{consumer}")
def consumer_info(request: Request, stream: str, consumer: str) -> Response:
    return json_response(deps.engine(request).consumer_info(stream, consumer))


@router.put("/{consumer}")
async def update_consumer(request: Request, stream: str, consumer: str) -> Response:
    body = await json_object(request)
    durable = consumer if body.get("durable_name") else None
    engine = deps.authorize(request, durable=durable, unnamed=None, filter=_single_filter(body))
    return json_response(await run_in_threadpool(engine.update_consumer, stream, consumer, body))


def _single_filter(body: dict[str, Any]) -> str | None:
    """The filter nats.go appends to the consumer create subject: a lone `filter_subject`."""
    filter_ = body.get("filter_subject")
    return filter_ if isinstance(filter_, str) and filter_ and not body.get("filter_subjects") else None


@router.delete("/{consumer}")
def delete_consumer(request: Request, stream: str, consumer: str) -> Response:
    deps.engine(request).delete_consumer(stream, consumer)
    return json_response({"success": True})


@router.post("/{consumer}/unpin")
async def unpin_consumer(request: Request, stream: str, consumer: str) -> Response:
    """`$JS.API.CONSUMER.UNPIN`'s engine call: `{"group": G}` drops the consumer's pin; the NATS door
    announces it (`…CONSUMER.UNPINNED…`, reason `admin`) and its held requests may take messages."""
    body = await json_object(request, allow_empty=True)
    group = body.get("group")
    if group is not None and not isinstance(group, str):
        raise errors.invalid_json("the group must be a string")
    engine = deps.engine(request)
    await run_in_threadpool(engine.consumers.unpin, engine.stream, stream, consumer, group or "")
    return json_response({})


def delivered_json(d: Delivery, headers_only: bool) -> dict[str, Any]:
    out = stored_message_json(d.msg)
    if headers_only:
        out["headers"] = {**(d.msg.headers or {}), "Nats-Msg-Size": [str(len(d.msg.data))]}
        out["data"] = ""
    out.update(consumer_seq=d.consumer_seq, num_delivered=d.num_delivered, num_pending=d.num_pending, ack=d.token)
    return out


def _int(body: dict[str, Any], key: str, default: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise errors.bad_request(f"{key} must be a non-negative integer")
    return value


class _Pull:
    """One pull request checked against the consumer's caps (max_batch, max_expires, max_bytes)."""

    def __init__(self, body: dict[str, Any], config: ConsumerConfig) -> None:
        unknown = set(body) - _NEXT_FIELDS
        if unknown:
            raise errors.bad_request(f"unknown pull request field {sorted(unknown)[0]!r}")
        self.batch = _int(body, "batch", 1) or 1
        self.expires = _int(body, "expires", 0)
        self.max_bytes = _int(body, "max_bytes", 0)
        no_wait = body.get("no_wait", False)
        if not isinstance(no_wait, bool):
            raise errors.bad_request("no_wait must be a boolean")
        self.no_wait = no_wait
        if config.max_batch and self.batch > config.max_batch:
            raise errors.JetStreamError(409, errors.ErrorCode.BAD_REQUEST, f"Exceeded MaxRequestBatch of {config.max_batch}")
        if config.max_expires and self.expires > config.max_expires:
            raise errors.JetStreamError(409, errors.ErrorCode.BAD_REQUEST, f"Exceeded MaxRequestExpires of {config.max_expires}")
        if config.max_bytes and self.max_bytes > config.max_bytes:
            raise errors.JetStreamError(409, errors.ErrorCode.BAD_REQUEST, f"Exceeded MaxRequestMaxBytes of {config.max_bytes}")
        if self.expires == 0:
            self.expires = config.max_expires or DEFAULT_EXPIRES
        self.expires = min(self.expires, MAX_EXPIRES)


@router.post("/{consumer}/next")
async def next_messages(request: Request, stream: str, consumer: str) -> Response:
    engine = deps.engine(request)
    body = await json_object(request, allow_empty=True)
    target = engine.consumers.get(engine.stream(stream), consumer)
    config = target.config
    pull = _Pull(body, config)
    if target.waiting >= (config.max_waiting or 512):
        raise errors.JetStreamError(409, errors.ErrorCode.BAD_REQUEST, "Exceeded MaxWaiting")
    deadline = time.monotonic() + pull.expires / NS
    got: list[Delivery] = []
    budget = pull.max_bytes
    target.waiting += 1
    try:
        while True:
            try:
                batch = await _fetch(engine, stream, consumer, pull.batch - len(got), budget)
            except JetStreamError:
                if got:
                    break
                raise
            got += batch
            if pull.max_bytes:
                budget = pull.max_bytes - sum(d.size for d in got)
                if budget <= 0 or target.budget_exhausted:
                    break
            if len(got) >= pull.batch or pull.no_wait or target.deleted:
                break
            left = deadline - time.monotonic()
            if left <= 0 or await request.is_disconnected():
                break
            await deps.waiters(request).wait(stream, min(left, _redelivery_wait(target)))
    finally:
        target.waiting -= 1
    headers_only = bool(config.headers_only)
    if delivered_batch.wants_binary(request.headers.get("accept", "")):
        return Response(delivered_batch.encode(got, headers_only), media_type=delivered_batch.MEDIA_TYPE)
    return Response(orjson.dumps({"messages": [delivered_json(d, headers_only) for d in got]}), media_type="application/json")


async def _fetch(engine: JetStream, stream: str, consumer: str, batch: int, max_bytes: int) -> list[Delivery]:
    """On the event loop when the engine needs no waiting, else in a worker thread."""
    got = engine.fetch_nowait(stream, consumer, batch, max_bytes)
    if got is None:
        got = await run_in_threadpool(engine.fetch, stream, consumer, batch, max_bytes)
    return got


def _redelivery_wait(target: Any) -> float:
    deadline = target.next_deadline()
    if deadline is None:
        return 1.0
    return max(min((deadline - time.time_ns()) / NS, 1.0), 0.001)


@router.post("/{consumer}/ack")
async def ack(request: Request, stream: str, consumer: str) -> Response:
    body = await json_object(request)
    items = body.get("acks")
    if set(body) != {"acks"} or not isinstance(items, list) or not items:
        raise errors.bad_request('an ack body is {"acks": [{"token" or "seq" or "seqs", "type", "delay"?}]}')
    flat, spans = _flatten_acks(items)
    engine = deps.engine(request)
    results: list[JetStreamError | None] = []
    if flat:
        found = engine.ack_nowait(stream, consumer, flat)
        results = found if found is not None else await run_in_threadpool(engine.ack, stream, consumer, flat)
    return json_response({"results": [_ack_result(span, flat, results) for span in spans]})


Span = tuple[int, int, bool] | JetStreamError  # (first, end) in the flat list and whether it is a `seqs` item, or its error


def _flatten_acks(items: list[Any]) -> tuple[list[tuple[str | int, str, int]], list[Span]]:
    """Every ack the items name, in order, and where each item's acks are.

    A malformed `seqs` item refuses the whole request (400, nothing applied); other malformed items
    are reported in their own result, as before the `seqs` form existed.
    """
    flat: list[tuple[str | int, str, int]] = []
    spans: list[Span] = []
    for item in items:
        if isinstance(item, dict) and "seqs" in item:
            seqs, kind, delay = _seqs_item(item)
            spans.append((len(flat), len(flat) + len(seqs), True))
            flat += [(seq, kind, delay) for seq in seqs]
            continue
        try:
            flat.append(_ack_item(item))
            spans.append((len(flat) - 1, len(flat), False))
        except JetStreamError as exc:
            spans.append(exc)
    return flat, spans


def _ack_result(span: Span, flat: list[tuple[str | int, str, int]], results: list[JetStreamError | None]) -> dict[str, Any]:
    if isinstance(span, JetStreamError):
        return {"error": span.to_dict()}
    first, end, many = span
    if not many:
        err = results[first]
        return {"ok": True} if err is None else {"error": err.to_dict()}
    failed = [(first + i, err) for i, err in enumerate(results[first:end]) if err is not None]
    if not failed:
        return {"ok": True}
    summary = errors.bad_request(f"{len(failed)} of {end - first} sequences failed")
    return {"error": summary.to_dict(), "failed": [{"seq": flat[at][0], "error": err.to_dict()} for at, err in failed]}


def _seqs_item(item: dict[str, Any]) -> tuple[list[int], str, int]:
    """`{"seqs": [stream sequences], "type"?, "delay"?}`: one ack type for many sequences."""
    if not set(item) <= {"seqs", "type", "delay"}:
        raise errors.bad_request("a seqs ack is {seqs, type?, delay?}")
    seqs = item["seqs"]
    if not isinstance(seqs, list) or not seqs or not all(type(s) is int and 0 < s <= MAX_SEQ for s in seqs):
        raise errors.bad_request("seqs must be a non-empty list of positive integers")
    kind = item.get("type", "ack")
    if kind not in ("ack", "nak", "wpi", "term"):
        raise errors.bad_request("type must be one of ack, nak, wpi, term")
    delay = item.get("delay", 0)
    if type(delay) is not int or not 0 <= delay <= MAX_DELAY:
        raise errors.bad_request("delay must be a non-negative integer of nanoseconds")
    return seqs, kind, delay


def _ack_item(item: Any) -> tuple[str | int, str, int]:
    if not isinstance(item, dict) or not set(item) <= {"token", "seq", "type", "delay", "reason"}:
        raise errors.bad_request("each ack is {token or seq, type, delay?, reason?}")
    ref = item.get("token", item.get("seq"))
    if ("token" in item) == ("seq" in item):
        raise errors.bad_request("give token or seq")
    if "token" in item and not isinstance(ref, str):
        raise errors.bad_request("token must be a string")
    if "seq" in item and (not isinstance(ref, int) or isinstance(ref, bool) or not 0 < ref <= MAX_SEQ):
        raise errors.bad_request("seq must be a positive integer")
    kind = item.get("type", "ack")
    delay = item.get("delay", 0)
    if not isinstance(delay, int) or isinstance(delay, bool) or not 0 <= delay <= MAX_DELAY:
        raise errors.bad_request("delay must be a non-negative integer of nanoseconds")
    if not isinstance(kind, str):
        raise errors.bad_request("type must be one of ack, nak, wpi, term")
    return ref, kind, delay  # type: ignore[return-value]


@router.get("/{consumer}/messages")
async def consume(request: Request, stream: str, consumer: str, max_messages: int = 100, idle_heartbeat: int = 5 * NS) -> Response:
    engine = deps.engine(request)
    target = engine.consumers.get(engine.stream(stream), consumer)
    if max_messages <= 0 or max_messages > 10_000:
        raise errors.bad_request("max_messages must be between 1 and 10000")
    if idle_heartbeat < 100_000_000:
        raise errors.bad_request("idle_heartbeat must be at least 100ms")
    return StreamingResponse(
        _events(request, engine, stream, consumer, target, max_messages, idle_heartbeat / NS),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _events(
    request: Request, engine: JetStream, stream: str, consumer: str, target: Any, max_messages: int, heartbeat: float
) -> AsyncIterator[bytes]:
    headers_only = bool(target.config.headers_only)
    config = target.config
    max_msg_size = target.stream.config.max_msg_size
    burst = max_msg_size if max_msg_size and max_msg_size > 0 else engine.options.max_payload
    pacer = Pacer(config.replay_policy == "original", config.rate_limit_bps, burst)  # as the NATS door paces
    last_beat = time.monotonic()
    target.waiting += 1
    try:
        while not target.deleted and not await request.is_disconnected():
            try:
                batch = await run_in_threadpool(engine.fetch, stream, consumer, 1 if pacer.active else max_messages, 0)
            except JetStreamError:
                break
            for d in batch:
                if pacer.active:
                    delay = pacer.delay_ns(d.msg.ts, d.size, time.monotonic_ns())
                    if delay:
                        await asyncio.sleep(delay / NS)
                    pacer.delivered(d.msg.ts, d.size, time.monotonic_ns())
                yield b"event: message\ndata: " + orjson.dumps(delivered_json(d, headers_only)) + b"\n\n"
            if batch:
                last_beat = time.monotonic()
                continue
            if time.monotonic() - last_beat >= heartbeat:
                yield b"event: heartbeat\ndata: {}\n\n"
                last_beat = time.monotonic()
            await deps.waiters(request).wait(stream, min(heartbeat, _redelivery_wait(target)))
    finally:
        target.waiting -= 1
