"""A job on a real Spark standalone cluster: master and worker from the installed pyspark, on loopback.

The job runs as `jetlake jobs run retention --master spark://127.0.0.1:<port>`: a driver process of
its own, executors on the worker; the test reads the table with delta-rs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from deltalake import DeltaTable

from engine import JetStream
from tests.jobs.spark_cluster import SparkCluster

pytestmark = pytest.mark.spark

JETLAKE = Path(sys.prefix) / "bin" / "jetlake"
JOB_TIMEOUT = 400.0


def test_retention_runs_on_a_standalone_cluster(js: JetStream, tmp_path: Path) -> None:
    """Spark runs only on the cluster: the table is read with delta-rs before and after (the test keeps
    out of the run's local Spark session, so it can run beside the tests that use it)."""
    js.add_stream({"name": "ORDERS", "subjects": ["orders.>"]})
    for i in range(12):
        js.publish_one(f"orders.{i % 3}", f"order-{i}".encode())
    js.flush()
    js.delete_message("ORDERS", 5, erase=False)
    js.purge("ORDERS", "orders.2", keep=1)  # orders.2 holds seqs 3, 6, 9, 12: 3, 6 and 9 go
    js.flush()
    table = str(js.layout.stream_table("ORDERS"))
    assert DeltaTable(table).to_pyarrow_table(columns=["seq"]).num_rows == 12, "deleted rows stay until the job runs"

    job_log = tmp_path / "job.log"
    with SparkCluster(tmp_path) as cluster:
        with open(job_log, "wb") as err:
            job = subprocess.run(
                [str(JETLAKE), "jobs", "run", "retention", "--master", cluster.url,
                 "--warehouse", str(js.layout.warehouse)],
                stdout=subprocess.PIPE, stderr=err, env={**cluster.env, "JETLAKE_SPARK_DRIVER_MEMORY": "1g"},
                timeout=JOB_TIMEOUT,
            )
        assert job.returncode == 0, job_log.read_text()[-5000:]
        figures = [json.loads(line) for line in job.stdout.decode().splitlines()]
        assert [f["job"] for f in figures] == ["retention"], job.stdout
        # It ran there: the master registered the application and the worker launched its executor.
        master_log = cluster.master_log.read_text()
        assert "Registering app jetlake-jobs-retention" in master_log, master_log[-3000:]
        assert "Asked to launch executor" in cluster.worker_log.read_text(), cluster.worker_log.read_text()[-3000:]
        assert cluster.url in master_log

    rows = DeltaTable(table).to_pyarrow_table(columns=["seq", "data"]).to_pylist()
    assert sorted(r["seq"] for r in rows) == [1, 2, 4, 7, 8, 10, 11, 12], "the tombstoned rows are gone, the others stay"
    assert all(bytes(r["data"]) == f"order-{r['seq'] - 1}".encode() for r in rows)
