"""Reading request bodies: size-limited, JSON-parsed with orjson, errors in JetStream's shape."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request

from api.http.errors import BodyTooLargeError
from engine import errors


async def read_body(request: Request) -> bytes:
    limit: int = request.app.state.max_body
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise errors.bad_request("invalid Content-Length")
        if int(length) > limit:
            raise BodyTooLargeError(limit)
        return await request.body()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLargeError(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json(raw: bytes, *, allow_empty: bool = False) -> Any:
    if not raw.strip():
        if allow_empty:
            return {}
        raise errors.invalid_json("empty request body")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise errors.invalid_json(str(exc)) from None


async def json_object(request: Request, *, allow_empty: bool = False) -> dict[str, Any]:
    value = parse_json(await read_body(request), allow_empty=allow_empty)
    if not isinstance(value, dict):
        raise errors.invalid_json("the request body must be a JSON object")
    return value
