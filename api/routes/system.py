"""Health, Prometheus metrics, JetStream's AccountInfo, and a flush for `jetlake sql`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from api import deps
from api.responses import json_response
from engine.jetstream import API_LEVEL

router = APIRouter()



@router.get("/healthz")
async def healthz(request: Request) -> Response:
    engine = deps.engine(request)
    if not engine.healthy:
        return json_response({"status": "unavailable"}, 503)
    return json_response({"status": "ok"})


@router.get("/v1/info")
def account_info(request: Request) -> Response:
    info = deps.engine(request).account_info()
    info["api"] = {"level": API_LEVEL, "total": request.app.state.api_total, "errors": request.app.state.api_errors}
    return json_response(info)


@router.post("/v1/flush")
async def flush(request: Request) -> Response:
    """Commits every stream's log (and the acks) to the tables now: `jetlake sql` calls it first, so a
    query sees every message acknowledged before it started. Waits for a flush already running."""
    commits = await run_in_threadpool(deps.engine(request).flush)
    return json_response({"success": True, "commits": commits})


@router.get("/metrics")
def metrics(request: Request) -> Response:
    engine = deps.engine(request)
    state = request.app.state
    lines = [
        "# TYPE jetlake_api_requests_total counter",
        f"jetlake_api_requests_total {state.api_total}",
        "# TYPE jetlake_api_errors_total counter",
        f"jetlake_api_errors_total {state.api_errors}",
        "# TYPE jetlake_flush_commits_total counter",
        f"jetlake_flush_commits_total {engine.flush_stats.commits}",
        "# TYPE jetlake_flush_failures_total counter",
        f"jetlake_flush_failures_total {engine.flush_stats.failures}",
        "# TYPE jetlake_flushed_messages_total counter",
        f"jetlake_flushed_messages_total {engine.flush_stats.messages}",
        "# TYPE jetlake_flush_seconds_total counter",
        f"jetlake_flush_seconds_total {engine.flush_stats.seconds:.6f}",
        "# TYPE jetlake_stream_messages gauge",
        "# TYPE jetlake_stream_bytes gauge",
        "# TYPE jetlake_stream_last_seq gauge",
        "# TYPE jetlake_stream_unflushed_bytes gauge",
    ]
    for stream in engine.streams():
        label = f'stream="{_escape(stream.name)}"'
        lines += [
            f"jetlake_stream_messages{{{label}}} {stream.index.msgs}",
            f"jetlake_stream_bytes{{{label}}} {stream.index.bytes}",
            f"jetlake_stream_last_seq{{{label}}} {stream.index.last_seq}",
            f"jetlake_stream_unflushed_bytes{{{label}}} {stream.store.pending_bytes()}",
        ]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
