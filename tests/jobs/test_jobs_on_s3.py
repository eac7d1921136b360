"""The maintenance jobs on an S3 warehouse: retention, compaction and erasure through Spark's S3A on the
real S3 server (versitygw on loopback), beside a gateway that keeps serving, taking the tables' commit
leases in the bucket as the gateway's flusher does.

- The scheduler (`jetlake scheduler --max-runs 3`) runs the three jobs once each on the `s3://`
  warehouse while a client publishes: the tombstoned rows are gone, the small files compacted, every
  acknowledged message is there once, and the lease objects show the jobs took and released them.
- Erasure (`--wal object`: the log is in the bucket too): a message with a distinctive payload and
  header is erased through the gateway, the erase job runs, and then every object in the bucket (all
  prefixes: tables, `_delta_log` and checkpoints, the object log, index snapshots, leases, configs,
  erasure receipts) is listed and read: the marker occurs nowhere, and it did occur before.
- `jetlake sql` answers a query over the stream on the same warehouse.

Spark runs in the CLI's own process (`local[1]`: S3A's jars must be on the JVM's classpath at start,
which the run's shared session has not); tests/jobs/test_cluster_on_s3.py runs the jobs on a cluster.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable

from engine.store.layout import Layout
from engine.store.leases import LeaseRecord
from engine.store.objectstore import ObjectStore, WarehouseLocation
from tests.gateway import JETLAKE, Gateway
from tests.residue import find_residue_in_objects, needles_for
from tests.s3 import BUCKET, S3Server

pytestmark = pytest.mark.spark

STREAM = "ORDERS"
JOB_TIMEOUT = 600.0


def spark_env(s3: S3Server) -> dict[str, str]:
    env = {**os.environ, **s3.env, "SPARK_LOCAL_IP": "127.0.0.1", "JETLAKE_SPARK_DRIVER_MEMORY": "1g"}
    env.pop("JETLAKE_SPARK_DRIVER_HOST", None)  # the driver and its executors are on this machine
    return env


def jetlake(s3: S3Server, *args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A `jetlake` Spark command on the S3 warehouse, its stderr kept in `log`; fails the test if it fails."""
    with open(log, "w") as err:
        result = subprocess.run([str(JETLAKE), *args], env={**spark_env(s3), **(env or {})}, stdout=subprocess.PIPE,
                                stderr=err,
                                text=True, timeout=JOB_TIMEOUT)
    assert result.returncode == 0, log.read_text()[-5000:]
    return result


def figures_of(stdout: str) -> dict[str, dict[str, Any]]:
    """`jetlake jobs run`'s JSON lines, by job."""
    return {line["job"]: line for line in map(json.loads, stdout.strip().splitlines())}


def publish(c: httpx.Client, messages: list[dict[str, Any]]) -> list[int]:
    answer = c.post("/v1/publish", json={"messages": messages})
    assert answer.status_code == 200, answer.text
    return [ack["seq"] for ack in answer.json()["acks"]]


def table_rows(layout: Layout, stream: str) -> dict[int, bytes]:
    table = layout.stream_table_location(stream)
    rows = DeltaTable(table.uri, storage_options=table.storage_options).to_pyarrow_table(columns=["seq", "data"])
    return dict(zip(rows.column("seq").to_pylist(), rows.column("data").to_pylist(), strict=True))


def lease(layout: Layout, stream: str) -> LeaseRecord:
    key = layout.lease_key(layout.stream_table_location(stream))
    return LeaseRecord.from_bytes(layout.objects.get(key).data)


def bucket_objects(s3: S3Server) -> list[tuple[str, bytes]]:
    """Every object in the test bucket, under every prefix, with its bytes (S3A's empty folder markers,
    keys ending in `/`, are listed with no bytes)."""
    store: ObjectStore = WarehouseLocation.parse(f"s3://{BUCKET}", s3.env).open()
    out = []
    for meta in store.list():
        out.append((meta.key, b"" if meta.key.endswith("/") else store.get(meta.key).data))
    return out


def wait_until(condition: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout}s")
        time.sleep(0.1)


def test_the_scheduler_runs_retention_compaction_and_erase_on_an_s3_warehouse_beside_a_publishing_gateway(
    s3a_available: None, s3_server: S3Server, tmp_path: Path
) -> None:
    warehouse = s3_server.warehouse()
    layout = Layout(WarehouseLocation.parse(warehouse, s3_server.env))
    gw = Gateway(warehouse, "--wal-dir", str(tmp_path / "state"), "--flush-interval", "0.2",
                 env=s3_server.env, log_dir=tmp_path).start(timeout=60)
    acked: dict[int, bytes] = {}
    stop = threading.Event()

    def publish_meanwhile() -> None:
        n = 0
        with gw.client() as c:
            while not stop.is_set():
                texts = [f"during-{n + i}" for i in range(5)]
                acked.update(zip(publish(c, [{"subject": "orders.9", "text": t} for t in texts]),
                                 (t.encode() for t in texts), strict=True))
                n += 5
                stop.wait(0.05)

    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            for batch in range(4):  # four flushes: several small files per partition, for compaction
                texts = [f"m-{batch}-{i}" for i in range(25)]
                seqs = publish(c, [{"subject": f"orders.{i % 3}", "text": t} for i, t in enumerate(texts)])
                acked.update(zip(seqs, (t.encode() for t in texts), strict=True))
                assert c.post("/v1/flush").status_code == 200
            assert c.post(f"/v1/streams/{STREAM}/purge", json={"keep": 60}).status_code == 200  # 1..40 tombstoned
            assert c.post("/v1/flush").status_code == 200
            assert len(table_rows(layout, STREAM)) == 100, "tombstoned rows stay in the table until retention"
            token_before = lease(layout, STREAM).token

            publisher = threading.Thread(target=publish_meanwhile)
            publisher.start()
            log = tmp_path / "scheduler.log"
            try:
                jetlake(s3_server, "scheduler", "--warehouse", warehouse, "--master", "local[1]", "--max-runs", "3",
                        log=log)
            finally:
                stop.set()
                publisher.join(timeout=30)
            text = log.read_text()
            for job in ("retention", "erase", "compact"):
                assert f"job {job}: done" in text, text[-5000:]
            assert "scheduler stopped: 3 runs, 0 failed" in text and "Traceback" not in text, text[-5000:]

            assert c.post("/v1/flush").status_code == 200
            stored = table_rows(layout, STREAM)
            assert stored == {seq: data for seq, data in acked.items() if seq > 40}, \
                "the table holds every acknowledged message after 40, once, and none before"
            assert c.get(f"/v1/streams/{STREAM}/messages/41").status_code == 200
            assert c.get(f"/v1/streams/{STREAM}/messages/40").status_code == 404
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            assert (state["first_seq"], state["last_seq"]) == (41, max(acked))
        table = layout.stream_table_location(STREAM)
        dt = DeltaTable(table.uri, storage_options=table.storage_options)
        operations = [h["operation"] for h in dt.history()]
        assert "DELETE" in operations and "OPTIMIZE" in operations, operations
        assert layout.objects.head(f"{table.key}/_delta_log/_last_checkpoint").size > 0, "compaction checkpointed"
        after = lease(layout, STREAM)
        assert after.owner == "" and after.token > token_before + 1, (token_before, after)
        tombstones = DeltaTable(layout.tombstones.uri, storage_options=layout.tombstones.storage_options)
        assert tombstones.to_pyarrow_table().num_rows == 0, "the applied tombstone went"
    finally:
        stop.set()
        gw.stop()


def test_erasure_on_s3_leaves_no_byte_of_the_message_in_any_object_of_the_bucket(
    s3a_available: None, s3_server: S3Server, tmp_path: Path
) -> None:
    warehouse = s3_server.warehouse()
    layout = Layout(WarehouseLocation.parse(warehouse, s3_server.env))
    marker = "zq7s3erase" + secrets.token_hex(8)
    needles = needles_for(marker)
    gw = Gateway(warehouse, "--wal", "object", "--wal-dir", str(tmp_path / "state"), "--flush-interval", "0.2",
                 env=s3_server.env, log_dir=tmp_path).start(timeout=60)
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            before = publish(c, [{"subject": f"orders.{i % 2}", "text": f"order {i}"} for i in range(20)])
            secret = publish(c, [{"subject": "orders.0", "text": f"card {marker} of a customer",
                                  "headers": {"X-Note": [marker]}}])[0]
            after = publish(c, [{"subject": f"orders.{i % 2}", "text": f"order {i}"} for i in range(20, 40)])
            assert c.post("/v1/flush").status_code == 200
            assert c.post(f"/v1/streams/{STREAM}/consumers",
                          json={"durable_name": "C", "ack_policy": "explicit"}).status_code == 201
            assert find_residue_in_objects(bucket_objects(s3_server), needles), \
                "the marker is in the bucket before the erasure (the scan can find it)"

            answer = c.post("/v1/erasures", json={"stream": STREAM, "seq": secret})
            assert answer.status_code == 202, answer.text
            erasure = answer.json()["id"]
            assert c.post("/v1/flush").status_code == 200
            log_prefix = layout.object_log_key(STREAM)
            wait_until(lambda: not list(layout.objects.list(log_prefix)), "the flushed log objects are removed")

            result = jetlake(s3_server, "jobs", "run", "erase", "--warehouse", warehouse, "--master", "local[1]",
                             log=tmp_path / "erase.log")
            figures = figures_of(result.stdout)["erase"]
            assert figures["requests_done"] == 1 and figures["errors"] == 0, figures
            assert figures["rows_deleted"] >= 1 and figures["files_vacuumed"] >= 1, figures
            status = c.get(f"/v1/erasures/{erasure}").json()
            assert status["status"] == "done" and status["receipt"]["verification"]["verified"], status

            hits = find_residue_in_objects(bucket_objects(s3_server), needles)
            assert hits == [], hits
            assert c.get(f"/v1/streams/{STREAM}/messages/{secret}").status_code == 404
            for seq in (*before, *after):
                message = c.get(f"/v1/streams/{STREAM}/messages/{seq}").json()["message"]
                assert marker not in base64.b64decode(message["data"]).decode()
            assert sorted(table_rows(layout, STREAM)) == sorted([*before, *after]), "only the erased message went"
            assert lease(layout, STREAM).owner == "", "the job released the table's lease"
    finally:
        gw.stop()
    assert find_residue_in_objects(bucket_objects(s3_server), needles) == [], "nor after the gateway's shutdown"


def test_sql_queries_the_streams_of_an_s3_warehouse(s3a_available: None, s3_server: S3Server, tmp_path: Path) -> None:
    warehouse = s3_server.warehouse()
    gw = Gateway(warehouse, "--wal-dir", str(tmp_path / "state"), "--flush-interval", "0.2",
                 env=s3_server.env, log_dir=tmp_path).start(timeout=60)
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>"]}).status_code == 201
            publish(c, [{"subject": f"orders.{i % 3}", "text": f"order-{i}"} for i in range(30)])
            assert c.delete(f"/v1/streams/{STREAM}/messages/7").status_code == 200  # hidden by its tombstone
            result = jetlake(s3_server, "sql", "SELECT subject, count(*) AS n, max(seq) AS top FROM ORDERS "
                             "GROUP BY subject ORDER BY subject", "--warehouse", warehouse, "--master", "local[1]",
                             "--gateway", gw.url, "--format", "json", log=tmp_path / "sql.log")
    finally:
        gw.stop()
    rows = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert rows == [{"subject": "orders.0", "n": 9, "top": 28}, {"subject": "orders.1", "n": 10, "top": 29},
                    {"subject": "orders.2", "n": 10, "top": 30}], rows
