"""The jobs on a Spark standalone cluster against an S3 warehouse: the deployment of issue 12.

A master and a worker on loopback (tests/jobs/spark_cluster.py), a gateway serving `s3://` with its log
in the bucket (`--wal object`), and `jetlake jobs run all --master spark://…`: a driver of its own
whose executors run on the worker, reaching the bucket through S3A with the jars the driver ships them
(`spark.jars`). Retention makes a purge physical, erasure removes one message to the last byte,
compaction bin-packs the flusher's small files; the test reads the results with delta-rs and the
object store, never with Spark.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest

from engine.store.layout import Layout
from engine.store.objectstore import WarehouseLocation
from tests.gateway import Gateway
from tests.jobs.spark_cluster import SparkCluster
from tests.jobs.test_jobs_on_s3 import (
    STREAM,
    bucket_objects,
    figures_of,
    jetlake,
    lease,
    publish,
    table_rows,
    wait_until,
)
from tests.residue import find_residue_in_objects, needles_for
from tests.s3 import S3Server

pytestmark = pytest.mark.spark


def test_retention_erasure_and_compaction_run_on_a_standalone_cluster_against_s3(
    s3a_available: None, s3_server: S3Server, tmp_path: Path
) -> None:
    warehouse = s3_server.warehouse()
    layout = Layout(WarehouseLocation.parse(warehouse, s3_server.env))
    marker = "zq7cluster" + secrets.token_hex(8)
    needles = needles_for(marker)
    gw = Gateway(warehouse, "--wal", "object", "--wal-dir", str(tmp_path / "state"), "--flush-interval", "0.2",
                 env=s3_server.env, log_dir=tmp_path).start(timeout=60)
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            sent: dict[int, bytes] = {}
            for batch in range(4):  # four flushes: several small files per partition
                texts = [f"m-{batch}-{i}" for i in range(10)]
                seqs = publish(c, [{"subject": f"orders.{i % 2}", "text": t} for i, t in enumerate(texts)])
                sent.update(zip(seqs, (t.encode() for t in texts), strict=True))
                assert c.post("/v1/flush").status_code == 200
            secret = publish(c, [{"subject": "orders.0", "text": f"card {marker}"}])[0]
            assert c.post("/v1/flush").status_code == 200
            assert find_residue_in_objects(bucket_objects(s3_server), needles), "the marker is in the bucket"
            assert c.post(f"/v1/streams/{STREAM}/purge", json={"seq": 11}).status_code == 200  # 1..10 tombstoned
            erasure = c.post("/v1/erasures", json={"stream": STREAM, "seq": secret})
            assert erasure.status_code == 202, erasure.text
            assert c.post("/v1/flush").status_code == 200
            wait_until(lambda: not list(layout.objects.list(layout.object_log_key(STREAM))),
                       "the flushed log objects are removed")

            with SparkCluster(tmp_path) as cluster:
                env = {"JETLAKE_SPARK_DRIVER_MEMORY": "1g", "JETLAKE_SPARK_EXECUTOR_MEMORY": "512m"}
                result = jetlake(s3_server, "jobs", "run", "all", "--warehouse", warehouse, "--master", cluster.url,
                                 log=tmp_path / "jobs.log", env=env)
                master_log = cluster.master_log.read_text()
                worker_log = cluster.worker_log.read_text()
            assert "Registering app jetlake-jobs-all" in master_log, master_log[-3000:]
            assert "Asked to launch executor" in worker_log, worker_log[-3000:]

            figures = figures_of(result.stdout)
            assert set(figures) == {"retention", "erase", "compact"}, result.stdout
            assert all(f["errors"] == 0 for f in figures.values()), figures
            assert figures["retention"]["rows_deleted"] == 10, figures["retention"]
            assert figures["erase"]["requests_done"] == 1, figures["erase"]
            assert figures["compact"]["tables_compacted"] >= 1, figures["compact"]
            assert c.get(f"/v1/erasures/{erasure.json()['id']}").json()["status"] == "done"

            expected = {seq: data for seq, data in sent.items() if seq > 10}
            assert table_rows(layout, STREAM) == expected, "retention and erasure removed exactly their rows"
            assert lease(layout, STREAM).owner == "", "every lease the jobs took is released"
            assert c.get(f"/v1/streams/{STREAM}/messages/11").status_code == 200
    finally:
        gw.stop()
    hits = find_residue_in_objects(bucket_objects(s3_server), needles)
    assert hits == [], hits
