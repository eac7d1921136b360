"""Each job in a fresh Spark session (`jetlake jobs run <job>`, its own process) rewrites files the
gateway still reads with the right message times: Spark writes `TIMESTAMP_MICROS` from the session
factory on, not only where a job prepares its session; checked after each job's rewrite, in the
files themselves, and after a restart of the gateway."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from urllib.parse import unquote

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import engine.store.failpoints as failpoints
from engine.info import parse_rfc3339
from engine.store.layout import Layout
from jobs.tables import read_stream
from tests.gateway import JETLAKE, Gateway

pytestmark = pytest.mark.spark

STREAM = "TIMES"


def run_job(warehouse: Path, job: str) -> dict:
    """`jetlake jobs run <job>` as a process of its own: a fresh Spark session; its JSON line."""
    env = {k: v for k, v in os.environ.items() if k != failpoints.ENV}
    result = subprocess.run(
        [str(JETLAKE), "jobs", "run", job, "--warehouse", str(warehouse), "--vacuum-window", "0"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    (line,) = [json.loads(x) for x in result.stdout.splitlines() if x.startswith("{")]
    assert line["job"] == job and line["errors"] == 0, line
    return line


def flushed_times(layout: Layout) -> dict[int, int]:
    """seq -> time in microseconds, as delta-rs flushed them (the reference)."""
    table = DeltaTable(str(layout.stream_table(STREAM))).to_pyarrow_table(columns=["seq", "ts"])
    micros = table.column("ts").cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
    return dict(zip(table.column("seq").to_pylist(), micros, strict=True))


def api_times(c: httpx.Client, seqs: list[int]) -> dict[int, int]:
    out = {}
    for seq in seqs:
        resp = c.get(f"/v1/streams/{STREAM}/messages/{seq}")
        assert resp.status_code == 200, (seq, resp.text)
        out[seq] = parse_rfc3339(resp.json()["message"]["time"]) // 1000
    return out


def pulled_times(c: httpx.Client, consumer: str) -> dict[int, int]:
    """Every live message through a new consumer: the windowed read path."""
    assert c.post(f"/v1/streams/{STREAM}/consumers", json={"name": consumer, "ack_policy": "none"}).status_code == 201
    resp = c.post(f"/v1/streams/{STREAM}/consumers/{consumer}/next", json={"batch": 500, "no_wait": True})
    got = resp.json()["messages"]
    return {m["seq"]: parse_rfc3339(m["time"]) // 1000 for m in got}


def assert_micros_in_files(table: Path) -> None:
    """Every live data file stores `ts` as INT64 microseconds (INT96 would read back as garbage)."""
    actions = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True))
    for path in actions.column("path").to_pylist():
        schema = pq.read_metadata(table / unquote(path)).schema
        (column,) = [schema.column(i) for i in range(len(schema)) if schema.column(i).path == "ts"]
        assert column.physical_type == "INT64", (path, column)
        assert "MICROS" in str(column.logical_type).upper(), (path, column.logical_type)


def test_each_job_in_a_fresh_session_keeps_the_message_times(warehouse: Path) -> None:
    layout = Layout(warehouse)
    gw = Gateway(warehouse, "--flush-interval", "600").start()
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["times.*"]}).status_code == 201
            for round_ in range(6):  # six flushes: small files for compaction
                messages = [{"subject": f"times.{i % 2}", "text": f"r{round_}-{i}"} for i in range(8)]
                assert all("seq" in a for a in c.post("/v1/publish", json={"messages": messages}).json()["acks"])
                assert c.post("/v1/flush").json()["success"] is True
            reference = flushed_times(layout)
            assert len(reference) == 48 and len(set(reference.values())) > 1
            assert c.delete(f"/v1/streams/{STREAM}/messages/2", params={"no_erase": "true"}).status_code == 200
            assert c.post("/v1/erasures", json={"stream": STREAM, "seq": 5}).status_code == 202
            assert c.post("/v1/flush").json()["success"] is True
            live = sorted(set(reference) - {2, 5})
            assert api_times(c, live) == {s: reference[s] for s in live}

            table = layout.stream_table(STREAM)
            entry = read_stream(layout, STREAM)
            assert entry is not None
            figures = {}
            for job in ("retention", "erase", "compact"):
                version = DeltaTable(str(table)).version()
                figures[job] = run_job(warehouse, job)
                assert DeltaTable(str(table)).version() > version, f"{job} rewrote the table"
                assert_micros_in_files(table)
                assert api_times(c, live) == {s: reference[s] for s in live}, f"message times after {job}"
                assert pulled_times(c, f"after-{job}") == {s: reference[s] for s in live}
                assert base64.b64decode(c.get(f"/v1/streams/{STREAM}/messages/1").json()["message"]["data"]) == b"r0-0"
            assert figures["retention"]["rows_deleted"] == 1
            assert figures["erase"]["requests_done"] == 1 and figures["erase"]["rows_deleted"] == 1
            assert figures["compact"]["files_removed"] > figures["compact"]["files_added"] > 0
        gw.stop()
        gw.start()
        with gw.client() as c:
            assert api_times(c, live) == {s: reference[s] for s in live}, "message times after a restart"
            assert pulled_times(c, "after-restart") == {s: reference[s] for s in live}
    finally:
        gw.stop()
