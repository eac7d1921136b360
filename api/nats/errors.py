"""JetStream API errors as the NATS door answers them: the engine's error in nats-server's envelope.

`{"type": ..., "error": {"code", "err_code", "description"}}`; the paged answers (stream info, names,
lists) keep their `total`/`offset`/`limit` on an error too, as nats-server's do. Only the keys
nats.py accepts are sent (it builds its APIError from them). Counterpart: server/jetstream_errors.go.
"""

from __future__ import annotations

from typing import Any

from engine.errors import ErrorCode, JetStreamError

_PAGED = frozenset({"stream_info_response", "stream_names_response", "stream_list_response",
                    "consumer_names_response", "consumer_list_response"})


def error_body(kind: str, exc: JetStreamError) -> dict[str, Any]:
    body: dict[str, Any] = {"error": exc.to_dict()}
    if kind in _PAGED:
        body |= {"total": 0, "offset": 0, "limit": 0}
    return body


def api_error(exc: Exception) -> JetStreamError:
    """An unexpected failure, as a 500 that names only the exception's type."""
    return JetStreamError(500, ErrorCode.GENERAL, f"internal error: {type(exc).__name__}")
