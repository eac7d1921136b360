"""Defect 6: when commits keep failing, the backlog is bounded and the gateway says so.

Before, a gateway whose commits failed (here: a maintenance job holds the table's commit lease) kept
acknowledging into an unbounded log and memory, `/healthz` stayed 200 and `POST /v1/flush` answered
success with 0 commits. Now past `--max-unflushed-bytes` (per log) and `--max-unflushed-total` (the
gateway) publishes get a 503 ApiError (10023, insufficient resources), `/healthz` reports the failing
flush, the lag and answers 503 once the gateway takes no writes, `/v1/flush` lists what it could not
commit, `/metrics` has the figures; and everything is committed once the lease is free.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from engine.store.layout import Layout
from engine.store.lease import commit_lease
from tests.faults.harness import STREAM, Load, check_restart, create_consumer, create_stream
from tests.gateway import Gateway

KIB = 1024


def _publish_until_refused(c: httpx.Client, subject: str, acked: dict[str, int], tag: str) -> dict[str, object]:
    """Publishes 8 KiB batches until one is refused; returns the refusal (bounded: at most 200 requests)."""
    for n in range(200):
        ids = [f"{tag}-{n}-{i}" for i in range(8)]
        messages = [{"subject": subject, "text": msg_id.ljust(1000, "."), "headers": {"Nats-Msg-Id": [msg_id]}}
                    for msg_id in ids]
        resp = c.post("/v1/publish", json={"messages": messages})
        if resp.status_code != 200:
            assert resp.status_code == 503, resp.text
            return resp.json()  # type: ignore[no-any-return]
        acked.update(zip(ids, (a["seq"] for a in resp.json()["acks"]), strict=True))
    raise AssertionError("publishes were never refused")


def _healthz_once_the_flusher_tried(c: httpx.Client, timeout: float = 10.0) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        health = c.get("/healthz")
        if health.json()["flush"]["failing"] or time.monotonic() > deadline:
            return health
        time.sleep(0.05)


def _metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def test_failing_commits_bound_the_backlog_and_are_reported(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.2", "--max-unflushed-bytes", str(64 * KIB),
                 "--max-unflushed-total", str(100 * KIB)).start()
    load = Load(gw.url, consume=False)
    try:
        with gw.client() as c:
            create_stream(c)
            create_stream(c, "OTHER", "other.>")
            create_consumer(c)
            lease = Layout(warehouse).lease_file(Layout(warehouse).stream_table(STREAM))
            with commit_lease(lease, timeout=10):  # a maintenance job commits: the flusher cannot
                refused = _publish_until_refused(c, "faults.a", load.acked, "a")
                error = refused["error"]
                assert (error["code"], error["err_code"]) == (503, 10023)  # type: ignore[index]
                assert "insufficient resources" in error["description"]  # type: ignore[index]
                other = c.post("/v1/publish/other.x", content=b"another stream still takes writes")
                assert other.status_code == 200, other.text

                health = _healthz_once_the_flusher_tried(c)
                assert health.status_code == 200, health.text
                body = health.json()
                assert body["status"] == "degraded" and body["writes"] is True
                failing = {f["table"]: f for f in body["flush"]["failing"]}
                assert failing[f"streams/{STREAM}"]["consecutive_failures"] >= 1
                assert "lease" in failing[f"streams/{STREAM}"]["last_error"]
                assert failing[f"streams/{STREAM}"]["failing_since"].endswith("Z")
                assert body["lag"]["oldest_unflushed_seconds"] > 0 and body["lag"]["unflushed_bytes"] >= 64 * KIB

                flushed = c.post("/v1/flush")
                assert flushed.status_code == 503, flushed.text
                answer = flushed.json()
                assert answer["success"] is False and answer["error"]["err_code"] == 10023
                assert [f["stream"] for f in answer["failed"] if "stream" in f] == [STREAM]

                metrics = c.get("/metrics").text
                assert _metric(metrics, f'jetlake_stream_log_bytes{{stream="{STREAM}"}}') >= 64 * KIB
                assert _metric(metrics, f'jetlake_stream_unflushed_age_seconds{{stream="{STREAM}"}}') > 0
                assert _metric(metrics, f'jetlake_stream_flush_consecutive_failures{{stream="{STREAM}"}}') >= 1
                assert _metric(metrics, "jetlake_flush_failing_tables") >= 1
                assert _metric(metrics, "jetlake_publish_waits_total") == 0  # failing commits: refused, not waited on
                assert _metric(metrics, "jetlake_log_bytes") >= 64 * KIB

                with commit_lease(Layout(warehouse).lease_file(Layout(warehouse).stream_table("OTHER")), timeout=10):
                    _publish_until_refused(c, "other.y", {}, "o")
                    health = c.get("/healthz")
                    assert health.status_code == 503 and health.json()["writes"] is False, health.text
                    assert "unflushed bytes" in health.json()["error"]
                    acks = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json={"batch": 1, "no_wait": True})
                    assert acks.status_code == 503 and acks.json()["error"]["err_code"] == 10023, acks.text
            deadline = time.monotonic() + 15
            while c.post("/v1/publish/faults.b", content=b"committed again").status_code != 200:
                assert time.monotonic() < deadline, "publishes still refused after the lease was released"
                time.sleep(0.05)
            assert c.post("/v1/flush").json()["success"] is True
            health = c.get("/healthz").json()
            assert health["status"] == "ok" and health["lag"]["oldest_unflushed_seconds"] == 0
    finally:
        gw.stop()
    check_restart(warehouse, load).stop()
