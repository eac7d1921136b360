"""The Spark commands of `jetlake`: `sql` end to end (one subprocess: it starts its own Spark), the
output formats, the scheduler's loop (with stand-in jobs, and once with the real ones), and
`serve --scheduler`'s child process, restarted after a kill -9."""

from __future__ import annotations

import base64
import csv
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from api.cli import _print_rows, build_parser
from engine import JetStream
from engine.erasures import registry
from engine.store.layout import Layout
from jobs.scheduler import JobMissing, Scheduler, intervals_from, load_job, start_delay_from
from tests.gateway import JETLAKE, Gateway


@pytest.mark.spark
def test_jetlake_sql_flushes_the_gateway_then_prints_json(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "600").start()  # only /v1/flush moves the log to the tables
    try:
        with gw.client() as c:
            c.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}).raise_for_status()
            acks = c.post("/v1/publish", json={"messages": [
                {"subject": "orders.eu", "text": "first ✓", "headers": {"Trace": ["a"]}},
                {"subject": "orders.us", "data": base64.b64encode(b"\x00\xffraw").decode()},
                {"subject": "orders.eu", "text": "deleted"},
            ]}).json()["acks"]
            assert [a["seq"] for a in acks] == [1, 2, 3]
            c.delete("/v1/streams/ORDERS/messages/3").raise_for_status()
        started = time.monotonic()
        result = subprocess.run(
            [str(JETLAKE), "sql", "SELECT seq, subject, text, data, headers, ts FROM ORDERS ORDER BY seq",
             "--warehouse", str(warehouse), "--gateway", gw.url, "--format", "json"],
            capture_output=True, text=True, timeout=400,
        )
        print(f"jetlake sql took {time.monotonic() - started:.1f}s")
    finally:
        gw.stop()
    assert result.returncode == 0, result.stderr[-5000:]
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["seq"], r["subject"], r["text"]) for r in rows] == [(1, "orders.eu", "first ✓"), (2, "orders.us", "\x00\ufffdraw")]
    assert base64.b64decode(rows[1]["data"]) == b"\x00\xffraw"
    assert rows[0]["headers"] == {"Trace": ["a"]} and rows[1]["headers"] is None
    assert rows[0]["ts"].endswith("Z")


@pytest.mark.spark
def test_output_formats(spark: SparkSession) -> None:
    df = spark.sql(
        "SELECT 1 AS seq, 'a.b' AS subject, CAST('hi, \"you\"' AS BINARY) AS data, map('K', array('v1', 'v2')) AS headers, "
        "TIMESTAMP '2024-05-01 12:00:00.5' AS ts, CAST(NULL AS STRING) AS msg_id "
        "UNION ALL SELECT 22, 'c', NULL, NULL, TIMESTAMP '2024-05-02 00:00:00', 'm'"
    )
    rows = df.collect()

    out = io.StringIO()
    _print_rows(df.columns, rows, "json", out)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0] == {"seq": 1, "subject": "a.b", "data": base64.b64encode(b'hi, "you"').decode(),
                        "headers": {"K": ["v1", "v2"]}, "ts": "2024-05-01T12:00:00.500000Z", "msg_id": None}
    assert lines[1]["data"] is None and lines[1]["ts"] == "2024-05-02T00:00:00Z"

    out = io.StringIO()
    _print_rows(df.columns, rows, "csv", out)
    parsed = list(csv.reader(io.StringIO(out.getvalue())))
    assert parsed[0] == df.columns
    assert parsed[1] == ["1", "a.b", base64.b64encode(b'hi, "you"').decode(), '{"K":["v1","v2"]}',
                         "2024-05-01T12:00:00.500000Z", ""]
    assert parsed[2][:2] == ["22", "c"] and len(parsed) == 3

    out = io.StringIO()
    _print_rows(df.columns, rows, "table", out)
    text = out.getvalue().splitlines()
    assert text[0].startswith("+-") and text[1].split("|")[1].strip() == "seq"
    assert "| 22  | c " in text[4] and "NULL" in text[4]
    assert text[-1] == "(2 rows)"
    assert len({len(line) for line in text[:-1]}) == 1, "aligned columns"


# -- the scheduler (no Spark: fake job modules) ----------------------------------------------------


class FakeSession:
    stopped = False

    def stop(self) -> None:
        self.stopped = True


def _fake_job(calls: list[str], name: str, fail_first: int = 0) -> types.ModuleType:
    module = types.ModuleType(f"jobs.{name}")
    state = {"n": 0}

    def run(spark: Any, layout: Layout, **options: Any) -> dict[str, int | float]:
        state["n"] += 1
        calls.append(name)
        if state["n"] <= fail_first:
            raise RuntimeError(f"{name} broke")
        assert isinstance(spark, FakeSession)
        return {"rows_deleted": state["n"]}

    module.run = run  # type: ignore[attr-defined]
    return module


def test_scheduler_runs_each_job_on_its_interval_and_survives_failures(
    monkeypatch: pytest.MonkeyPatch, warehouse: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "jobs.retention", _fake_job(calls, "retention", fail_first=1))
    monkeypatch.setitem(sys.modules, "jobs.erase", _fake_job(calls, "erase"))
    monkeypatch.setitem(sys.modules, "jobs.compact", None)  # a job whose module is missing
    made: list[FakeSession] = []

    def factory() -> FakeSession:
        made.append(FakeSession())
        return made[-1]

    caplog.set_level("INFO", "jetlake.scheduler")
    scheduler = Scheduler(factory, Layout(warehouse), {"retention": 0.05, "erase": 0.2, "compact": 0.05}, max_runs=6)
    failures = scheduler.run_forever()
    assert failures == 1 and scheduler.runs == 6
    assert calls.count("retention") >= 3 and 1 <= calls.count("erase") <= 2, calls
    assert calls[:2] == ["retention", "erase"], "all due at start, in order"
    assert len(made) == 1 and made[0].stopped, "one session for every run, stopped at the end"
    statuses = [(name, status) for name, status, _ in scheduler.history]
    assert ("compact", "missing") in statuses and statuses.count(("compact", "missing")) == 1
    assert statuses[0] == ("retention", "failed") and ("retention", "ok") in statuses
    assert "job retention: done in" in caplog.text and "rows_deleted=2" in caplog.text
    assert "jobs.compact" in caplog.text and "skipping it" in caplog.text


def test_scheduler_stops_when_asked_and_after_its_duration(monkeypatch: pytest.MonkeyPatch, warehouse: Path) -> None:
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "jobs.retention", _fake_job(calls, "retention"))
    scheduler = Scheduler(FakeSession, Layout(warehouse), {"retention": 3600, "erase": 0, "compact": 0})
    thread = threading.Thread(target=scheduler.run_forever)
    thread.start()
    deadline = time.monotonic() + 30
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    scheduler.stop()
    thread.join(timeout=30)
    assert not thread.is_alive() and calls == ["retention"]

    timed = Scheduler(FakeSession, Layout(warehouse), {"retention": 3600, "erase": 0, "compact": 0},
                      duration=0.3, start_delay=100)
    thread = threading.Thread(target=timed.run_forever)
    thread.start()
    thread.join(timeout=30)  # far below the start delay: only the duration can have ended it
    assert not thread.is_alive(), "stopped after its duration, not at the end of the start delay"
    assert calls == ["retention"] and timed.runs == 0, "the start delay held the first run"


def test_intervals_and_job_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    env = {"JETLAKE_RETENTION_INTERVAL": "30", "JETLAKE_ERASE_INTERVAL": "0", "JETLAKE_SCHEDULER_START_DELAY": "5"}
    assert intervals_from({"retention": None, "erase": None, "compact": None}, env) == \
        {"retention": 30.0, "erase": 0.0, "compact": 3600.0}
    assert intervals_from({"retention": 7.0}, env)["retention"] == 7.0, "a flag wins"
    assert start_delay_from(None, env) == 5.0 and start_delay_from(1.0, env) == 1.0 and start_delay_from(None, {}) == 0
    with pytest.raises(ValueError):
        intervals_from({}, {"JETLAKE_COMPACT_INTERVAL": "soon"})
    with pytest.raises(ValueError):
        load_job("vacuum")
    monkeypatch.setitem(sys.modules, "jobs.compact", None)
    with pytest.raises(JobMissing):
        load_job("compact")


def test_command_line_of_the_spark_commands() -> None:
    parser = build_parser()
    args = parser.parse_args(["jobs", "run", "all", "--warehouse", "w", "--master", "spark://127.0.0.1:7077"])
    assert (args.job, args.warehouse, args.master) == ("all", "w", "spark://127.0.0.1:7077")
    args = parser.parse_args(["scheduler", "--retention-interval", "10", "--erase-interval", "0"])
    assert (args.retention_interval, args.erase_interval, args.compact_interval) == (10.0, 0.0, None)
    assert args.vacuum_window is None
    assert parser.parse_args(["jobs", "run", "retention", "--vacuum-window", "0"]).vacuum_window == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["jobs", "run", "retention", "--vacuum-window", "-1"])
    args = parser.parse_args(["sql", "SELECT 1", "--format", "csv"])
    assert (args.query, args.format, args.gateway) == ("SELECT 1", "csv", "http://127.0.0.1:4280")
    assert parser.parse_args(["serve", "--scheduler"]).scheduler is True
    assert parser.parse_args(["serve"]).scheduler is True, "the scheduled jobs run by default: disk stays bounded"
    assert parser.parse_args(["serve", "--no-scheduler"]).scheduler is False
    with pytest.raises(SystemExit):
        parser.parse_args(["jobs", "run", "vacuum"])


def test_serve_with_scheduler_runs_it_as_a_child_and_stops_it(monkeypatch: pytest.MonkeyPatch, warehouse: Path) -> None:
    # A long start delay: the child scheduler waits and starts no JVM during this test.
    monkeypatch.setenv("JETLAKE_SCHEDULER_START_DELAY", "600")
    gw = Gateway(warehouse, "--scheduler").start()
    try:
        assert httpx.post(f"{gw.url}/v1/flush").json() == {"success": True, "commits": 0}
        deadline = time.monotonic() + 20
        pid = None
        while pid is None and time.monotonic() < deadline:
            for line in gw.log.read_text().splitlines():
                if "scheduler started beside the gateway (pid " in line:
                    pid = int(line.rsplit("(pid ", 1)[1].rstrip(")"))
            time.sleep(0.1)
        assert pid is not None, gw.log.read_text()
        while "first runs in 600s" not in gw.log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "first runs in 600s" in gw.log.read_text(), gw.log.read_text()
        os.kill(pid, 0)  # alive
    finally:
        gw.stop()
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


# -- the real jobs, and the child process of `serve --scheduler` ---------------------------------


@pytest.mark.spark
def test_the_scheduler_runs_the_real_jobs(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "SCHED", "subjects": ["sched.*"]})
    for i in range(12):
        js.publish_one(f"sched.{i % 2}", f"m{i}".encode())
        js.flush()  # one small file per flush: something to compact
    js.delete_message("SCHED", 3, erase=False)
    answer = registry(js.layout).erase(js.stream("SCHED"), seq=4)
    js.flush()
    scheduler = Scheduler(spark, js.layout, {"retention": 3600, "erase": 3600, "compact": 3600}, max_runs=3)
    assert scheduler.run_forever() == 0
    runs = {name: (status, figures) for name, status, figures in scheduler.history}
    assert [name for name, _, _ in scheduler.history] == ["retention", "erase", "compact"]
    assert all(status == "ok" for status, _ in runs.values()), scheduler.history
    assert runs["retention"][1]["rows_deleted"] == 1 and runs["retention"][1]["erase_ranges_left"] == 1
    assert runs["erase"][1]["requests_done"] == 1 and runs["erase"][1]["rows_deleted"] == 1
    assert runs["compact"][1]["files_removed"] > runs["compact"][1]["files_added"] > 0
    assert registry(js.layout).get(answer["id"])["status"] == "done"
    seqs = DeltaTable(str(js.layout.stream_table("SCHED"))).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()
    assert sorted(seqs) == [s for s in range(1, 13) if s not in (3, 4)]


def _scheduler_pids(log: Path) -> list[int]:
    text = log.read_text() if log.exists() else ""
    return [int(line.rsplit("(pid ", 1)[1].rstrip(")")) for line in text.splitlines()
            if "scheduler started beside the gateway (pid " in line]


def _alive(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text().lower()
    except FileNotFoundError:
        return False


def test_serve_with_scheduler_restarts_its_child_after_a_kill_9(
    monkeypatch: pytest.MonkeyPatch, warehouse: Path
) -> None:
    monkeypatch.setenv("JETLAKE_SCHEDULER_START_DELAY", "600")  # the child waits: no JVM during this test
    gw = Gateway(warehouse, "--scheduler").start()
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not (pids := _scheduler_pids(gw.log)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids, gw.log.read_text()
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 60  # the gateway waits 5 s before the restart
        while len(pids := _scheduler_pids(gw.log)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(pids) == 2 and pids[1] != pids[0], gw.log.read_text()
        assert "exited with -9; restarting" in gw.log.read_text()
        assert _alive(pids[1]) and not _alive(pids[0])
        assert httpx.get(f"{gw.url}/healthz").status_code == 200, "the gateway kept serving"
        assert httpx.post(f"{gw.url}/v1/streams", json={"name": "S", "subjects": ["s"]}).status_code == 201
    finally:
        gw.stop()
    assert pids and not any(_alive(pid) for pid in pids), "the gateway stops its child with itself"


def test_serve_with_no_scheduler_starts_no_child(warehouse: Path) -> None:
    gw = Gateway(warehouse).start()  # the test gateway passes --no-scheduler
    try:
        assert httpx.post(f"{gw.url}/v1/flush").json() == {"success": True, "commits": 0}
        assert gw.proc is not None
        children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text().split()
        assert children == [], "no scheduler child beside the gateway"
        assert "scheduler started beside the gateway" not in gw.log.read_text()
    finally:
        gw.stop()
