"""`GET /v1/cluster`: the gateways serving this warehouse, for clients that spread their connections.

Any gateway serves every request (forwarding to a stream's owner), so a client needs one address;
this lists the live ones (id, HTTP and NATS addresses) and which one answered. A single gateway
lists itself alone.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.http.responses import json_response

router = APIRouter()


@router.get("/v1/cluster")
def cluster(request: Request) -> Response:
    running = request.app.state.cluster
    if running is None:
        return json_response({"mode": "single", "gateways": [{"http": str(request.base_url).rstrip("/")}]})
    members = running.members()
    me = running.membership.me
    return json_response({
        "mode": "cluster",
        "me": me.id,
        "gateways": [{"id": m.id, "http": m.http, "nats": m.nats} for m in members],
    })
