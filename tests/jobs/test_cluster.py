"""A job on a real Spark standalone cluster: master and worker from the installed pyspark, on loopback.

The job runs as `jetlake jobs run retention --master spark://127.0.0.1:<port>`: a driver process of
its own, executors on the worker; the test reads the table with delta-rs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyspark
import pytest
from deltalake import DeltaTable

from engine import JetStream
from tests.gateway import free_port

pytestmark = pytest.mark.spark

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
JETLAKE = Path(sys.prefix) / "bin" / "jetlake"
START_TIMEOUT = 120.0
JOB_TIMEOUT = 400.0


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in (log.read_text(errors="replace") if log.exists() else ""):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[1]} exited with {proc.returncode}: {log.read_text()[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"no {text!r} in {log} after {timeout}s: {log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()  # spark-class execs java: this PID is the JVM
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


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

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path), "SPARK_NO_DAEMONIZE": "1"}
    env.pop("JETLAKE_SPARK_DRIVER_HOST", None)
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master_log, worker_log, job_log = tmp_path / "master.log", tmp_path / "worker.log", tmp_path / "job.log"
    master = worker = None
    try:
        with open(master_log, "wb") as out:
            master = subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master",
                 "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )
        _wait_for(master_log, "I have been elected leader", master, START_TIMEOUT)
        with open(worker_log, "wb") as out:
            worker = subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                 "--host", "127.0.0.1", "--webui-port", str(worker_ui), "--cores", "1", "--memory", "1g",
                 "--work-dir", str(tmp_path / "work")],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )
        _wait_for(master_log, "Registering worker", master, START_TIMEOUT)

        with open(job_log, "wb") as err:
            job = subprocess.run(
                [str(JETLAKE), "jobs", "run", "retention", "--master", f"spark://127.0.0.1:{port}",
                 "--warehouse", str(js.layout.warehouse)],
                stdout=subprocess.PIPE, stderr=err, env=env, timeout=JOB_TIMEOUT,
            )
        assert job.returncode == 0, job_log.read_text()[-5000:]
        figures = [json.loads(line) for line in job.stdout.decode().splitlines()]
        assert [f["job"] for f in figures] == ["retention"], job.stdout
        # It ran there: the master registered the application and the worker launched its executor.
        assert "Registering app jetlake-jobs-retention" in master_log.read_text(), master_log.read_text()[-3000:]
        assert "Asked to launch executor" in worker_log.read_text(), worker_log.read_text()[-3000:]
        assert f"spark://127.0.0.1:{port}" in master_log.read_text()
    finally:
        _stop(worker)
        _stop(master)

    rows = DeltaTable(table).to_pyarrow_table(columns=["seq", "data"]).to_pylist()
    assert sorted(r["seq"] for r in rows) == [1, 2, 4, 7, 8, 10, 11, 12], "the tombstoned rows are gone, the others stay"
    assert all(bytes(r["data"]) == f"order-{r['seq'] - 1}".encode() for r in rows)
