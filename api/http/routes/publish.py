"""Publishing: one raw message, or a batch as JSON, NDJSON or binary records, answered with PubAcks after the log write."""

from __future__ import annotations

import binascii
from typing import Any

import orjson
import pybase64
from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from api.http import binary_batch, deps
from api.http.body import parse_json, read_body
from api.http.errors import error_response
from api.http.responses import json_response
from engine import AckRun, InboundMessage, JetStreamError, PlainBatch, PubAck, errors
from engine.messages import PublishResult
from engine import headers as hdr

router = APIRouter(prefix="/v1/publish")

_MESSAGE_FIELDS = frozenset({"subject", "data", "text", "headers"})
Slots = list[dict[str, Any] | None]  # a batch's answers by position; None until published



def _request_headers(request: Request) -> dict[str, list[str]] | None:
    """Every `Nats-*` request header, under JetStream's spelling for the control headers."""
    found: dict[str, list[str]] = {}
    for raw_name, raw_value in request.headers.raw:
        name = raw_name.decode("latin-1")
        if not name.lower().startswith("nats-"):
            continue
        key = hdr.canonical_name(name)
        if key == name:
            key = "-".join(part.capitalize() for part in name.split("-"))
        found.setdefault(key, []).append(raw_value.decode("latin-1"))
    return found or None


@router.post("/{subject:path}")
async def publish_raw(request: Request, subject: str) -> Response:
    data = await read_body(request)
    engine = deps.engine(request)
    message = InboundMessage(subject, data, _request_headers(request))
    results = engine.publish_nowait([message]) or await run_in_threadpool(engine.publish, [message])
    result = results[0]
    if isinstance(result, JetStreamError):
        deps.count_error(request)
        return error_response(result)
    return json_response(result.to_dict())


@router.post("")
async def publish_batch(request: Request) -> Response:
    raw = await read_body(request)
    content_type = request.headers.get("content-type", "")
    if content_type.partition(";")[0].strip().lower() == binary_batch.MEDIA_TYPE:
        plain = binary_batch.decode_plain(raw)
        if plain is not None:
            return await _publish_columns(request, plain)
        messages, positions, results = _split(binary_batch.decode(raw, _headers))
    else:
        messages, positions, results = _json_messages(_parse_ndjson(raw) if "ndjson" in content_type else _parse_batch(raw))
    engine = deps.authorize(request, subject=[m.subject for m in messages])
    acks = (engine.publish_nowait(messages) or await run_in_threadpool(engine.publish, messages)) if messages else []
    for pos, ack in zip(positions, acks, strict=True):
        if type(ack) is PubAck and not ack.duplicate:
            results[pos] = {"stream": ack.stream, "seq": ack.seq}  # PubAck.to_dict inlined: 1,000 a batch
        else:
            results[pos] = {"error": ack.to_dict()} if isinstance(ack, JetStreamError) else ack.to_dict()
    return Response(orjson.dumps({"acks": results}), media_type="application/json")


async def _publish_columns(request: Request, batch: PlainBatch) -> Response:
    """A binary batch without headers, published as columns; a run accepted whole is answered in one join."""
    engine = deps.authorize(request, subject=batch.subjects)
    answer = engine.publish_batch_nowait(batch) or await run_in_threadpool(engine.publish_batch, batch)
    if isinstance(answer, AckRun):
        return Response(_ack_run_json(answer), media_type="application/json")
    return Response(orjson.dumps({"acks": [_answer(ack) for ack in answer]}), media_type="application/json")


_ACK_FORMATS: dict[tuple[str, int], bytes] = {}


def _ack_run_json(run: AckRun) -> bytes:
    """`{"acks": [{"stream": S, "seq": n}, ...]}` for consecutive seqs, as orjson would write it: one
    %-format of the sequences into a template kept per (stream, batch size), the cheapest in CPython."""
    template = _ACK_FORMATS.get((run.stream, run.count))
    if template is None:
        if len(_ACK_FORMATS) > 64:
            _ACK_FORMATS.clear()
        ack = b'{"stream":' + orjson.dumps(run.stream).replace(b"%", b"%%") + b',"seq":%d}'
        template = _ACK_FORMATS[(run.stream, run.count)] = b'{"acks":[' + b",".join([ack] * run.count) + b"]}"
    return template % tuple(range(run.first_seq, run.first_seq + run.count))


def _answer(ack: PublishResult) -> dict[str, Any]:
    if type(ack) is PubAck and not ack.duplicate:
        return {"stream": ack.stream, "seq": ack.seq}
    return {"error": ack.to_dict()} if isinstance(ack, JetStreamError) else ack.to_dict()


def _json_messages(items: list[Any]) -> tuple[list[InboundMessage], list[int], Slots]:
    """The messages of a JSON batch to publish, their positions, and the answers of the refused ones."""
    results: Slots = [None] * len(items)
    messages = _plain_messages(items)
    if messages is not None:
        return messages, list(range(len(items))), results
    messages, positions = [], []
    for i, item in enumerate(items):
        try:
            messages.append(_message(item))
            positions.append(i)
        except JetStreamError as exc:
            results[i] = {"error": exc.to_dict()}
    return messages, positions, results


def _split(items: list[InboundMessage | JetStreamError]) -> tuple[list[InboundMessage], list[int], Slots]:
    """As `_json_messages`, for decoded binary records (an error in place of a refused one)."""
    results: Slots = [None] * len(items)
    if not any(type(item) is not InboundMessage for item in items):
        return items, list(range(len(items))), results  # type: ignore[return-value]
    messages, positions = [], []
    for i, item in enumerate(items):
        if isinstance(item, JetStreamError):
            results[i] = {"error": item.to_dict()}
        else:
            messages.append(item)
            positions.append(i)
    return messages, positions, results


def _parse_batch(raw: bytes) -> list[Any]:
    body = parse_json(raw)
    if not isinstance(body, dict) or set(body) != {"messages"} or not isinstance(body["messages"], list):
        # A wrong type or an unknown field is invalid JSON, as nats-server's decoder says of requests.
        raise errors.invalid_json('a batch body is {"messages": [...]}')
    return body["messages"]  # type: ignore[no-any-return]


def _parse_ndjson(raw: bytes) -> list[Any]:
    return [parse_json(line) for line in raw.splitlines() if line.strip()]


def _plain_messages(items: list[Any]) -> list[InboundMessage] | None:
    """The common batch, every message `{"subject", "data"}` with valid base64, decoded in bulk; else None."""
    try:
        if not all(type(item) is dict and len(item) == 2 for item in items):
            return None
        subjects = [item["subject"] for item in items]
        data = [pybase64.b64decode(item["data"], validate=True) for item in items]
    except (KeyError, TypeError, ValueError, binascii.Error):
        return None
    if not all(type(s) is str for s in subjects):
        return None
    return list(map(InboundMessage, subjects, data))


def _message(item: Any) -> InboundMessage:
    if type(item) is dict and len(item) == 2:
        subject, data = item.get("subject"), item.get("data")
        if type(subject) is str and type(data) is str:
            try:
                return InboundMessage(subject, pybase64.b64decode(data, validate=True))
            except (binascii.Error, ValueError):
                raise errors.bad_request("data is not valid base64") from None
    return _checked_message(item)


def _checked_message(item: Any) -> InboundMessage:
    if not isinstance(item, dict):
        raise errors.bad_request("each message must be a JSON object")
    if not _MESSAGE_FIELDS.issuperset(item):
        unknown = sorted(set(item) - _MESSAGE_FIELDS)[0]
        raise errors.bad_request(f"unknown message field {unknown!r}")
    subject = item.get("subject")
    if not isinstance(subject, str):
        raise errors.bad_request("a message needs a subject")
    data, text = item.get("data"), item.get("text")
    if data is not None and text is not None:
        raise errors.bad_request("give data or text, not both")
    if data is not None:
        if not isinstance(data, str):
            raise errors.bad_request("data must be base64 text")
        try:
            payload = pybase64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise errors.bad_request("data is not valid base64") from None
    elif text is not None:
        if not isinstance(text, str):
            raise errors.bad_request("text must be a string")
        payload = text.encode()
    else:
        payload = b""
    return InboundMessage(subject, payload, _headers(item.get("headers")))


def _headers(raw: Any) -> dict[str, list[str]] | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise errors.bad_request('headers are a map of lists: {"Name": ["value"]}')
    for name, values in raw.items():
        if not hdr.is_valid_name(name):
            raise errors.bad_request(f"invalid header name {name[:64]!r}")
        if isinstance(values, str):
            values = [values]
        if not isinstance(values, list) or not all(isinstance(v, str) and hdr.is_valid_value(v) for v in values):
            raise errors.bad_request(f"header {name!r} must be a list of single-line strings")
    return hdr.normalize(raw)
