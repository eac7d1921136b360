"""Health, Prometheus metrics, JetStream's AccountInfo, and a flush for `jetlake sql`.

Metrics and flush act on the caller's account; a user of the system account (or anyone when the
gateway runs without a config) sees and flushes every account, with gateway-wide counters. `/healthz`
needs no credentials: with authentication configured it reports the gateway's state without naming
accounts, streams or files.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from api.http import deps
from api.http.responses import json_response
from engine import JetStream, heap
from engine.errors import ErrorCode
from engine.flusher import FlushResult
from engine.jetstream import API_LEVEL

router = APIRouter()


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    """200 while the gateway takes writes ("ok", or "degraded" with failing flushes or failed streams
    listed), 503 when it does not (backlog bound reached, ack log read-only, not open)."""
    gate = deps.gate(request)
    health = _health(gate.accounts.engines())
    if gate.authenticator.required:
        health = _anonymous(health)
    return json_response(health, 200 if health["writes"] else 503)


def _health(engines: list[JetStream]) -> dict[str, Any]:
    """One engine's health as it reports it; several accounts' merged, each list item naming its account."""
    if len(engines) == 1:
        return engines[0].health()
    parts = [(engine.layout.account, engine.health()) for engine in engines]
    statuses = {h["status"] for _, h in parts}
    merged: dict[str, Any] = {
        "status": "unavailable" if "unavailable" in statuses else "degraded" if "degraded" in statuses else "ok",
        "writes": all(h["writes"] for _, h in parts),
        "lag": {
            "oldest_unflushed_seconds": max((h["lag"]["oldest_unflushed_seconds"] for _, h in parts), default=0.0),
            # the accounts share the gateway's backlog and its bound
            "unflushed_bytes": parts[0][1]["lag"]["unflushed_bytes"] if parts else 0,
            "max_unflushed_bytes": parts[0][1]["lag"]["max_unflushed_bytes"] if parts else 0,
        },
        "flush": {
            "failing": [{"account": a, **f} for a, h in parts for f in h["flush"]["failing"]],
            "failures_total": sum(h["flush"]["failures_total"] for _, h in parts),
        },
    }
    errors = [f"{a}: {h['error']}" for a, h in parts if "error" in h]
    if errors:
        merged["error"] = "; ".join(errors)
    for key in ("streams_failed", "log_damage"):
        items = [{"account": a, **item} for a, h in parts for item in h.get(key, ())]
        if items:
            merged[key] = items
    return merged


def _anonymous(health: dict[str, Any]) -> dict[str, Any]:
    """What anyone may learn: the gateway's state and lag, counts instead of names."""
    out = {"status": health["status"], "writes": health["writes"], "lag": health["lag"],
           "flush": {"failing": len(health["flush"]["failing"]), "failures_total": health["flush"]["failures_total"]}}
    if "error" in health:
        out["error"] = "writes are refused (details: /metrics and /v1/accounts for the system account)"
    for key in ("streams_failed", "log_damage"):
        if key in health:
            out[key] = len(health[key])
    return out


@router.get("/v1/info")
def account_info(request: Request) -> Response:
    info = deps.engine(request).account_info()
    api = deps.account(request).api
    info["api"] = {"level": API_LEVEL, "total": api.total, "errors": api.errors}
    return json_response(info)


def _engines(request: Request) -> list[JetStream]:
    """The engines the caller's metrics and flush cover: every account's for the system account."""
    access = deps.access(request)
    if access.principal.system:
        return deps.gate(request).accounts.engines()
    engine = access.account.engine
    return [engine] if engine is not None and access.account.config.jetstream is not None else []


@router.post("/v1/flush")
async def flush(request: Request) -> Response:
    """Commits every stream's log (and the acks) to the tables now: `jetlake sql` calls it first, so a
    query sees every message acknowledged before it started. Waits for a flush already running."""
    engines = _engines(request)
    results: list[tuple[str, FlushResult]] = await run_in_threadpool(
        lambda: [(engine.layout.account, engine.flush_report()) for engine in engines]
    )
    commits = sum(result.commits for _, result in results)
    several = len(results) > 1
    failed = [{"account": a, **f} if several else f for a, result in results for f in result.failed]
    if not failed:
        return json_response({"success": True, "commits": commits})
    deps.count_error(request)
    described = "; ".join(f"{f.get('stream') or f['table']}: {f['error']}" for f in failed)
    error = {"code": 503, "err_code": int(ErrorCode.INSUFFICIENT_RESOURCES), "description": f"not committed: {described}"}
    return json_response({"success": False, "commits": commits, "failed": failed, "error": error}, 503)


@router.get("/metrics")
def metrics(request: Request) -> Response:
    access = deps.access(request)
    if access.principal.system:
        stats = deps.gate(request).stats
        lines = _counters(stats.api_total, stats.api_errors, stats.denied)
        lines += ["# TYPE jetlake_auth_failures_total counter", f"jetlake_auth_failures_total {stats.unauthorized}"]
    else:
        api = access.account.api
        lines = _counters(api.total, api.errors, api.denied)
    engines = _engines(request)
    lines += _flush_lines(engines)
    lines += [
        "# TYPE jetlake_stream_messages gauge",
        "# TYPE jetlake_stream_bytes gauge",
        "# TYPE jetlake_stream_last_seq gauge",
        "# TYPE jetlake_stream_unflushed_bytes gauge",
        "# TYPE jetlake_stream_index_bytes gauge",
        "# TYPE jetlake_stream_subjects gauge",
        "# TYPE jetlake_stream_log_bytes gauge",
        "# TYPE jetlake_stream_unflushed_age_seconds gauge",
        "# TYPE jetlake_stream_flush_consecutive_failures gauge",
        "# TYPE jetlake_stream_failed gauge",
    ]
    now = time.monotonic()
    # A gateway with a config labels each stream with its account; without one (a single account) as before.
    with_account = deps.gate(request).authenticator.config.configured
    for engine in engines:
        failing = engine.flusher.failing()
        account = f'account="{_escape(engine.layout.account)}",' if with_account else ""
        for stream in engine.streams():
            label = f'{account}stream="{_escape(stream.name)}"'
            health = failing.get(stream.name)
            lines += [
                f"jetlake_stream_messages{{{label}}} {stream.index.msgs}",
                f"jetlake_stream_bytes{{{label}}} {stream.index.bytes}",
                f"jetlake_stream_last_seq{{{label}}} {stream.index.last_seq}",
                f"jetlake_stream_unflushed_bytes{{{label}}} {stream.store.pending_bytes()}",
                f"jetlake_stream_index_bytes{{{label}}} {stream.index.memory_bytes}",
                f"jetlake_stream_subjects{{{label}}} {stream.index.num_subjects}",
                f"jetlake_stream_log_bytes{{{label}}} {stream.store.log_bytes()}",
                f"jetlake_stream_unflushed_age_seconds{{{label}}} {stream.store.unflushed_age(now):.3f}",
                f"jetlake_stream_flush_consecutive_failures{{{label}}} {health.consecutive_failures if health else 0}",
                f"jetlake_stream_failed{{{label}}} {int(stream.failure is not None or stream.unavailable is not None)}",
            ]
    return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")


def _counters(total: int, errors: int, denied: int) -> list[str]:
    return [
        "# TYPE jetlake_api_requests_total counter",
        f"jetlake_api_requests_total {total}",
        "# TYPE jetlake_api_errors_total counter",
        f"jetlake_api_errors_total {errors}",
        "# TYPE jetlake_permission_denied_total counter",
        f"jetlake_permission_denied_total {denied}",
    ]


def _flush_lines(engines: list[JetStream]) -> list[str]:
    """The flusher's counters and the logs' sizes, summed over the engines (the backlog is shared)."""
    stats = [engine.flush_stats for engine in engines]
    backlog = engines[0].backlog if engines else None
    return [
        "# TYPE jetlake_flush_commits_total counter",
        f"jetlake_flush_commits_total {sum(s.commits for s in stats)}",
        "# TYPE jetlake_flush_failures_total counter",
        f"jetlake_flush_failures_total {sum(s.failures for s in stats)}",
        "# TYPE jetlake_flush_lease_waits_total counter",
        f"jetlake_flush_lease_waits_total {sum(s.lease_waits for s in stats)}",
        "# TYPE jetlake_flushed_messages_total counter",
        f"jetlake_flushed_messages_total {sum(s.messages for s in stats)}",
        "# TYPE jetlake_flush_seconds_total counter",
        f"jetlake_flush_seconds_total {sum(s.seconds for s in stats):.6f}",
        "# TYPE jetlake_publish_waits_total counter",
        f"jetlake_publish_waits_total {sum(engine.backpressure.waits for engine in engines)}",
        "# TYPE jetlake_publish_wait_seconds_total counter",
        f"jetlake_publish_wait_seconds_total {sum(engine.backpressure.wait_seconds for engine in engines):.6f}",
        "# TYPE jetlake_flush_failing_tables gauge",
        f"jetlake_flush_failing_tables {sum(len(engine.flusher.failing()) for engine in engines)}",
        "# TYPE jetlake_log_bytes gauge",
        f"jetlake_log_bytes {backlog.total if backlog else 0}",
        "# TYPE jetlake_log_bytes_limit gauge",
        f"jetlake_log_bytes_limit {backlog.max_total_bytes if backlog else 0}",
        "# TYPE jetlake_ack_log_bytes gauge",
        f"jetlake_ack_log_bytes {sum(a.log_bytes() for engine in engines for a in engine.consumers.ack_stores())}",
        *(line for name, value in heap.stats().items()
          for line in (f"# TYPE jetlake_heap_{name}_bytes gauge", f"jetlake_heap_{name}_bytes {value}")),
        "# TYPE jetlake_writes_accepted gauge",
        f"jetlake_writes_accepted {int(all(engine.write_refusal() is None for engine in engines))}",
    ]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
