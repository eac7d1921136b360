"""JetStream API errors as the NATS door answers them: the engine's error in nats-server's envelope.

`{"type": ..., "error": {"code", "err_code", "description"}}`; the paged answers (stream info, names,
lists) keep their `total`/`offset`/`limit` on an error too, as nats-server's do. Only the keys
nats.py accepts are sent (it builds its APIError from them). Where the engine answers 400 for what
nats-server calls a 500 (an invalid config, a refused rollup: a client's mistake over HTTP), the wire
gets nats-server's code, so a NATS client sees exactly what nats-server would send.
Counterpart: server/jetstream_errors.go and errors.json.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ErrorCode, JetStreamError

_PAGED = frozenset({"stream_info_response", "stream_names_response", "stream_list_response",
                    "consumer_names_response", "consumer_list_response"})


# err_code -> nats-server's `code` where the engine's differs (errors.json).
NATS_SERVER_CODES = {10012: 500, 10051: 500, 10052: 500, 10057: 500, 10074: 500, 10110: 500, 10111: 500}


def wire_error(exc: JetStreamError) -> dict[str, Any]:
    """The error object as nats-server writes it."""
    return {"code": NATS_SERVER_CODES.get(exc.err_code, exc.code), "err_code": exc.err_code, "description": exc.description}


def error_body(kind: str, exc: JetStreamError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": wire_error(exc)}
    if kind in _PAGED:
        body |= {"total": 0, "offset": 0, "limit": 0}
    return body


def api_error(exc: Exception) -> JetStreamError:
    """An unexpected failure, as a 500 that names only the exception's type."""
    return JetStreamError(500, ErrorCode.GENERAL, f"internal error: {type(exc).__name__}")


def go_json_error(exc: ValueError, streaming: bool = False) -> str:
    """A JSON decoding error in the words of Go's encoding/json where they are easy to match:
    json.Unmarshal says "unexpected end of JSON input", a json.Decoder (`streaming`) "unexpected EOF"."""
    text = str(exc)
    if "unexpected end of data" in text or "Input is a zero-length" in text:
        return "unexpected EOF" if streaming else "unexpected end of JSON input"
    return text
