"""A batch publish whose subjects belong to streams of several owners, split by owner.

`POST /v1/publish` (JSON, NDJSON or binary) may carry messages for streams owned by different
gateways. The batch is cut into one part per owner, each in the batch's own format, with the
messages in their order; the parts go out at once (this gateway's own part through its app, the
others to their owners, marked forwarded), and the answers are put back in the batch's order, so
each message is answered as a single gateway would answer it: its ack, or its own error (a subject
no stream captures, a refused message). A message whose subject cannot be read (a bad item) stays in
this gateway's part, which reports it as a single gateway does. A part whose owner cannot be reached
is split again after a pause (ownership may have moved), until the deadline; its messages are then
answered with JetStream's 503 (10008). A part answered with an error as a whole (the owner refused
the request) gives that error to each of its messages.
A body that does not parse as a batch is not split (the route refuses it whole, as one gateway does).
Counterpart: a NATS client publishing each message to its subject, each routed to its stream leader.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import ASGIApp, Receive, Scope

from api.http import binary_batch
from api.http.peers import Ask, Locator, capture
from engine import errors

RETRY_PAUSE = 0.1
_RECORD = struct.Struct(">III")


@dataclass
class Batch:
    """A batch body cut into its messages (raw, in the body's format) and their subjects."""

    items: list[Any]
    subjects: list[str | None]
    join: Callable[[list[Any]], bytes]


def parse(content_type: str, body: bytes) -> Batch | None:
    """The batch's messages; None when the body is not a batch (the route answers it)."""
    media = content_type.partition(";")[0].strip().lower()
    try:
        if media == binary_batch.MEDIA_TYPE:
            return _binary(body)
        if "ndjson" in media:
            lines = [line for line in body.splitlines() if line.strip()]
            return Batch(lines, [_subject(orjson.loads(line)) for line in lines], b"\n".join)
        messages = orjson.loads(body)["messages"]
        if not isinstance(messages, list):
            return None
        return Batch(messages, [_subject(m) for m in messages], lambda items: orjson.dumps({"messages": items}))
    except (ValueError, KeyError, TypeError):
        return None


def _binary(body: bytes) -> Batch | None:
    if body[:4] != binary_batch.MAGIC:
        return None
    records: list[bytes] = []
    subjects: list[str | None] = []
    at = 4
    while at < len(body):
        if at + _RECORD.size > len(body):
            return None
        subject_len, headers_len, data_len = _RECORD.unpack_from(body, at)
        end = at + _RECORD.size + subject_len + headers_len + data_len
        if end > len(body):
            return None
        subjects.append(body[at + _RECORD.size : at + _RECORD.size + subject_len].decode())
        records.append(body[at:end])
        at = end
    return Batch(records, subjects, lambda items: binary_batch.MAGIC + b"".join(items))


def _subject(item: Any) -> str | None:
    subject = item.get("subject") if isinstance(item, dict) else None
    return subject if isinstance(subject, str) else None


def owners(locator: Locator, account: str, subjects: list[str | None]) -> dict[str | None, list[int]]:
    """The positions of the messages by owner (None: this gateway; "": an owner not reachable now)."""
    by_subject: dict[str | None, str | None] = {None: None}
    grouped: dict[str | None, list[int]] = {}
    for pos, subject in enumerate(subjects):
        if subject not in by_subject:
            stream = locator.stream_for_subject(account, subject)  # type: ignore[arg-type]
            by_subject[subject] = None if stream is None else locator.owner_url(account, stream)
        grouped.setdefault(by_subject[subject], []).append(pos)
    return grouped


async def publish(app: ASGIApp, locator: Locator, ask: Ask, account: str, scope: Scope, receive: Receive,
                  batch: Batch, deadline: float) -> list[Any]:
    """Every message's answer (`{"stream", "seq"}`, or `{"error": ...}`), in the batch's order."""
    groups = await asyncio.to_thread(owners, locator, account, batch.subjects)
    results: list[Any] = [None] * len(batch.items)

    async def run(owner: str | None, positions: list[int]) -> None:
        part = Batch([batch.items[p] for p in positions], [batch.subjects[p] for p in positions], batch.join)
        body = part.join(part.items)
        if owner is None:
            answer = await capture(app, _with_length(scope, body), body, receive)
        else:
            answer = await ask(scope, body, owner, None) if owner else None
        if answer is None:
            if time.monotonic() + RETRY_PAUSE < deadline:
                await asyncio.sleep(RETRY_PAUSE)
                acks = await publish(app, locator, ask, account, scope, receive, part, deadline)
            else:
                exc = errors.cluster_unavailable("no gateway owning the stream answered")
                acks = [{"error": exc.to_dict()}] * len(positions)
        elif answer.status == 200:
            acks = orjson.loads(answer.body)["acks"]
        else:
            acks = [{"error": _error(answer.body, answer.status)}] * len(positions)
        for pos, ack in zip(positions, acks, strict=True):
            results[pos] = ack

    await asyncio.gather(*(run(owner, positions) for owner, positions in groups.items()))
    return results


def _with_length(scope: Scope, body: bytes) -> Scope:
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
    return dict(scope, headers=[*headers, (b"content-length", str(len(body)).encode())])


def _error(body: bytes, status: int) -> dict[str, Any]:
    try:
        found = orjson.loads(body)["error"]
        if isinstance(found, dict):
            return found
    except (ValueError, KeyError, TypeError):
        pass
    return {"code": status, "err_code": 10008, "description": body.decode("utf-8", "replace")[:200]}
