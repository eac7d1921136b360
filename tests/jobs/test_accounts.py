"""The Spark side of accounts: `jetlake sql --account` sees one account's streams, the jobs process every account."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine import EngineOptions, JetStream
from engine.store.layout import Layout, account_names
from jobs.scheduler import Scheduler
from jobs.sql import register_views
from tests.gateway import JETLAKE

pytestmark = pytest.mark.spark


def _two_accounts(warehouse: Path) -> None:
    """Accounts A and B, each with its own ORDERS on the same subjects, and a stream only B has."""
    for account, streams in (("A", ["ORDERS"]), ("B", ["ORDERS", "BONLY"])):
        engine = JetStream(warehouse, EngineOptions(account=account))
        engine.open(start_flusher=False)
        try:
            for name in streams:
                engine.add_stream({"name": name, "subjects": ["orders.>" if name == "ORDERS" else "bonly.>"]})
            for i in range(3):
                engine.publish_one("orders.eu", f"{account}{i}".encode())
            if "BONLY" in streams:
                engine.publish_one("bonly.x", b"B only")
        finally:
            engine.close()


def test_sql_registers_one_accounts_views(warehouse: Path, spark: SparkSession) -> None:
    _two_accounts(warehouse)
    assert account_names(warehouse) == ["A", "B"]
    assert register_views(spark, Layout(warehouse, "A")) == ["ORDERS"]
    assert [r.text for r in spark.sql("SELECT text FROM ORDERS ORDER BY seq").collect()] == ["A0", "A1", "A2"]
    spark.catalog.dropTempView("ORDERS")
    assert register_views(spark, Layout(warehouse, "B")) == ["BONLY", "ORDERS"]
    assert [r.text for r in spark.sql("SELECT text FROM ORDERS ORDER BY seq").collect()] == ["B0", "B1", "B2"]
    for view in ("ORDERS", "BONLY"):
        spark.catalog.dropTempView(view)


def test_the_scheduler_runs_each_job_on_every_account(warehouse: Path, spark: SparkSession) -> None:
    _two_accounts(warehouse)
    scheduler = Scheduler(spark, Layout(warehouse), {"retention": 3600, "erase": 0, "compact": 0}, max_runs=2, all_accounts=True)
    assert scheduler.run_forever() == 0
    assert [(name, outcome) for name, outcome, _ in scheduler.history] == [("retention", "ok"), ("retention", "ok")]


def test_jobs_run_reports_per_account(warehouse: Path) -> None:
    _two_accounts(warehouse)
    done = subprocess.run([str(JETLAKE), "jobs", "run", "compact", "--warehouse", str(warehouse), "--master", "local[1]"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(line["job"], line["account"]) for line in lines] == [("compact", "A"), ("compact", "B")]
