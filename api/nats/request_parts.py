"""What the JetStream API's handlers read from a request: subject tokens, the JSON body, paging offsets.

Bodies are read as nats-server's strict decoder reads them (an unknown field is refused) and their
faults are answered with its texts; both the stream and the consumer requests read them the same way.
Counterpart: server/jetstream_api.go (the json.Unmarshal of each request).
"""

from __future__ import annotations

from typing import Any

import orjson

from api.nats.errors import go_json_error
from api.nats.messages import is_count
from engine import errors

NAMES_LIMIT = 1024  # a page of the names requests, as nats-server's JSApiNamesLimit
LIST_LIMIT = 256  # a page of the list requests (JSApiListLimit)


def token(tokens: list[str], i: int) -> str:
    """The subject's `i`th token after `$JS.API.` (a stream or consumer name); a 400 when missing."""
    if len(tokens) <= i or not tokens[i]:
        raise errors.bad_request()
    return tokens[i]


def request_json(payload: bytes, fields: set[str] | None = None) -> dict[str, Any]:
    """A request's JSON object; unknown fields are refused as nats-server's strict decoder refuses them."""
    try:
        value = orjson.loads(payload) if payload.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise errors.invalid_json(go_json_error(exc, streaming=True)) from None
    if not isinstance(value, dict):
        raise errors.invalid_json("json: cannot unmarshal into a request object")
    if fields is not None:
        unknown = set(value) - fields
        if unknown:
            raise errors.invalid_json(f'json: unknown field "{sorted(unknown)[0]}"')
    return value


def expect_empty(payload: bytes) -> None:
    """Requests that take no body (infos, deletes) refuse one, as nats-server does."""
    if payload.strip() not in (b"", b"{}"):
        raise errors.JetStreamError(400, 10038, "expected an empty request payload")


def page_offset(req: dict[str, Any]) -> int:
    offset = req.get("offset", 0)
    if not is_count(offset):
        raise errors.invalid_json("offset must be a non-negative integer")
    return offset
