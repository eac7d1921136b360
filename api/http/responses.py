"""JSON answers serialised with orjson: the publish path cannot afford the stdlib encoder."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi.responses import Response


def json_response(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")
