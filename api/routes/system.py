"""Health, Prometheus metrics, JetStream's AccountInfo, and a flush for `jetlake sql`."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from api import deps
from api.responses import json_response
from engine.errors import ErrorCode
from engine.jetstream import API_LEVEL

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    """200 while the gateway takes writes ("ok", or "degraded" with failing flushes or failed streams
    listed), 503 when it does not (backlog bound reached, ack log read-only, not open)."""
    health = deps.engine(request).health()
    return json_response(health, 200 if health["writes"] else 503)


@router.get("/v1/info")
def account_info(request: Request) -> Response:
    info = deps.engine(request).account_info()
    info["api"] = {"level": API_LEVEL, "total": request.app.state.api_total, "errors": request.app.state.api_errors}
    return json_response(info)


@router.post("/v1/flush")
async def flush(request: Request) -> Response:
    """Commits every stream's log (and the acks) to the tables now: `jetlake sql` calls it first, so a
    query sees every message acknowledged before it started. Waits for a flush already running."""
    result = await run_in_threadpool(deps.engine(request).flush_report)
    if not result.failed:
        return json_response({"success": True, "commits": result.commits})
    request.app.state.api_errors += 1
    described = "; ".join(f"{f.get('stream') or f['table']}: {f['error']}" for f in result.failed)
    error = {"code": 503, "err_code": int(ErrorCode.INSUFFICIENT_RESOURCES),
             "description": f"not committed: {described}"}
    return json_response({"success": False, "commits": result.commits, "failed": result.failed, "error": error}, 503)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    engine = deps.engine(request)
    state = request.app.state
    stats = engine.flush_stats
    failing = engine.flusher.failing()
    now = time.monotonic()
    acks_log = engine.consumers.acks.log_bytes()
    lines = [
        "# TYPE jetlake_api_requests_total counter",
        f"jetlake_api_requests_total {state.api_total}",
        "# TYPE jetlake_api_errors_total counter",
        f"jetlake_api_errors_total {state.api_errors}",
        "# TYPE jetlake_flush_commits_total counter",
        f"jetlake_flush_commits_total {stats.commits}",
        "# TYPE jetlake_flush_failures_total counter",
        f"jetlake_flush_failures_total {stats.failures}",
        "# TYPE jetlake_flush_lease_waits_total counter",
        f"jetlake_flush_lease_waits_total {stats.lease_waits}",
        "# TYPE jetlake_flushed_messages_total counter",
        f"jetlake_flushed_messages_total {stats.messages}",
        "# TYPE jetlake_flush_seconds_total counter",
        f"jetlake_flush_seconds_total {stats.seconds:.6f}",
        "# TYPE jetlake_flush_failing_tables gauge",
        f"jetlake_flush_failing_tables {len(failing)}",
        "# TYPE jetlake_log_bytes gauge",
        f"jetlake_log_bytes {engine.backlog.total}",
        "# TYPE jetlake_log_bytes_limit gauge",
        f"jetlake_log_bytes_limit {engine.backlog.max_total_bytes}",
        "# TYPE jetlake_ack_log_bytes gauge",
        f"jetlake_ack_log_bytes {acks_log}",
        "# TYPE jetlake_writes_accepted gauge",
        f"jetlake_writes_accepted {int(engine.write_refusal() is None)}",
        "# TYPE jetlake_stream_messages gauge",
        "# TYPE jetlake_stream_bytes gauge",
        "# TYPE jetlake_stream_last_seq gauge",
        "# TYPE jetlake_stream_unflushed_bytes gauge",
        "# TYPE jetlake_stream_log_bytes gauge",
        "# TYPE jetlake_stream_unflushed_age_seconds gauge",
        "# TYPE jetlake_stream_flush_consecutive_failures gauge",
        "# TYPE jetlake_stream_failed gauge",
    ]
    for stream in engine.streams():
        label = f'stream="{_escape(stream.name)}"'
        health = failing.get(stream.name)
        lines += [
            f"jetlake_stream_messages{{{label}}} {stream.index.msgs}",
            f"jetlake_stream_bytes{{{label}}} {stream.index.bytes}",
            f"jetlake_stream_last_seq{{{label}}} {stream.index.last_seq}",
            f"jetlake_stream_unflushed_bytes{{{label}}} {stream.store.pending_bytes()}",
            f"jetlake_stream_log_bytes{{{label}}} {stream.store.log_bytes()}",
            f"jetlake_stream_unflushed_age_seconds{{{label}}} {stream.store.unflushed_age(now):.3f}",
            f"jetlake_stream_flush_consecutive_failures{{{label}}} {health.consecutive_failures if health else 0}",
            f"jetlake_stream_failed{{{label}}} {int(stream.failure is not None or stream.unavailable is not None)}",
        ]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
