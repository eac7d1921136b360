"""The one place errors become HTTP answers, in JetStream's ApiError shape.

`{"type": ..., "error": {"code", "err_code", "description"}}` with the HTTP status = `code`. Engine
errors carry their JetStream `err_code`; malformed requests, unknown routes and unexpected failures
are mapped here, so no route builds error JSON and the gateway keeps serving after any of them.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.http import deps
from api.http.responses import json_response
from engine.errors import ErrorCode, JetStreamError, StreamNotFoundError, invalid_stream_name

log = logging.getLogger(__name__)


class BodyTooLargeError(JetStreamError):
    def __init__(self, limit: int) -> None:
        super().__init__(413, ErrorCode.BAD_REQUEST, f"request body exceeds the gateway's limit of {limit} bytes")


def error_response(exc: JetStreamError) -> Response:
    return json_response({"type": "io.nats.jetstream.api.v1.error_response", "error": exc.to_dict()}, exc.code)


def answer(request: Request, exc: Exception) -> Response:
    """The answer to a route's exception: its ApiError, or a 500 for an unexpected failure (logged)."""
    deps.count_error(request)
    if isinstance(exc, JetStreamError):
        return error_response(exc)
    log.exception("unexpected failure answering %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(JetStreamError(500, ErrorCode.GENERAL, f"internal error: {type(exc).__name__}"))


def install(app: FastAPI) -> None:
    @app.exception_handler(JetStreamError)
    async def _jetstream(request: Request, exc: JetStreamError) -> Response:
        return answer(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        deps.count_error(request)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        detail = f"invalid {where}: {first.get('msg', 'bad value')}" if where else "bad request"
        return error_response(JetStreamError(400, ErrorCode.BAD_REQUEST, detail))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        deps.count_error(request)
        if exc.status_code == 404 and request.url.path.startswith("/v1/publish/"):
            # The route's path pattern stops at a newline: such a subject is invalid, not a missing route.
            return error_response(JetStreamError(400, ErrorCode.BAD_REQUEST, "invalid publish subject"))
        if exc.status_code == 404 and _stream_name_has_a_slash(request):
            return error_response(_slashed_stream_name(request))
        return error_response(JetStreamError(exc.status_code, ErrorCode.BAD_REQUEST, str(exc.detail).lower()))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        return answer(request, exc)


def _stream_name_has_a_slash(request: Request) -> bool:
    """`/v1/streams/a%2Fb...`: the router decodes the `/` and finds no route; the name is what is wrong."""
    raw: bytes = request.scope.get("raw_path") or b""
    if not raw.startswith(b"/v1/streams/"):
        return False
    return b"%2f" in raw[len(b"/v1/streams/") :].split(b"/", 1)[0].lower()


def _slashed_stream_name(request: Request) -> JetStreamError:
    """nats-server's answer for a stream name with a `/`: no such stream, or for an update its config check."""
    if request.method == "PUT" and request.scope["raw_path"].count(b"/") == 3:
        return invalid_stream_name()
    return StreamNotFoundError()
