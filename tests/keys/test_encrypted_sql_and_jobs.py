"""Encrypted streams under real Spark: key holders' SQL views decrypt, a plain read sees ciphertext, the
jobs (retention, erase, compact) work on sealed tables, and the proof: after every job no marker is
left in clear in any byte or file name under the warehouse, protected subjects included (a stream and
a KV bucket whose subjects hold the marker, one key rotation for compaction to re-encrypt them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import EngineOptions, JetStream, ManualClock
from engine.encryption import PROTECTED_SUBJECTS_KEY
from engine.erasures import registry
from engine.keys import MasterKey, MissingMasterKeyError, WrongMasterKeyError
from engine.messages import InboundMessage
from jobs.scheduler import run_job
from jobs.sql import register_views

pytestmark = pytest.mark.spark

KEY = MasterKey.from_config("sql-and-jobs-key-0123456789abcdef", "chachapoly")
MARKER = "Kx9-proof-marker"
PROTECTED = {PROTECTED_SUBJECTS_KEY: "true"}
# partitions by `h.<marker>`: a plain stream's folder names would carry the marker
HIDDEN = {"name": "HIDDEN", "subjects": ["h.>"], "metadata": {**PROTECTED, "jetlake.partition_tokens": "2"}}


def open_engine(warehouse: Path, clock: ManualClock, key: MasterKey | None = KEY) -> JetStream:
    engine = JetStream(warehouse, EngineOptions(key=key), clock=clock)
    engine.open(start_flusher=False)
    return engine


def scan(warehouse: Path, needle: bytes) -> list[Path]:
    """Every file under the warehouse whose bytes or name (folders included) hold `needle`."""
    return [p for p in sorted(warehouse.rglob("*"))
            if needle.decode() in str(p.relative_to(warehouse)) or (p.is_file() and needle in p.read_bytes())]


def fill(js: JetStream) -> None:
    """Markers in payloads and headers of a stream, a KV bucket and an object store; a delete for the
    retention job, an erasure for the erase job, all flushed, and one more message left in the log."""
    js.add_stream({"name": "ORDERS", "subjects": ["orders.>"]})
    js.publish([InboundMessage(f"orders.{i % 2}", f"{MARKER} payload {i}".encode(),
                               {"Nats-Msg-Id": [f"id-{i}"], "X-Secret": [f"{MARKER} header {i}"]})
                for i in range(1, 7)])
    js.kv.create({"bucket": "cfg"})
    js.kv.put("cfg", "db", f"{MARKER} kv value".encode())
    js.objects.create({"bucket": "files"})
    js.objects.put("files", "report", MARKER.encode() * 3000, chunk_size=4096)
    js.add_stream(HIDDEN)  # protected subjects: seqs 1-4 under epoch 1, 5-6 under epoch 2
    js.publish([InboundMessage(f"h.{MARKER}.{i}", f"hidden {i}".encode()) for i in range(1, 5)])
    js.kv.create({"bucket": "vault", "metadata": PROTECTED})
    js.kv.put("vault", MARKER, b"vault value")
    js.flush()
    js.rotate_key("HIDDEN")
    js.publish([InboundMessage(f"h.{MARKER}.{i}", f"hidden {i}".encode()) for i in range(5, 7)])
    js.stream("ORDERS").delete_message(2, False)  # a tombstone for the retention job
    js.stream("HIDDEN").delete_message(1, False)
    registry(js.layout).erase(js.stream("ORDERS"), seq=3)  # a request for the erase job
    registry(js.layout).erase(js.stream("HIDDEN"), filter_=f"h.{MARKER}.2")  # by subject, found in the table
    js.flush()
    js.publish_one("orders.7", f"{MARKER} in the log".encode(), {"X-Secret": [MARKER]})
    js.publish_one(f"h.{MARKER}.7", b"hidden 7")


def test_sql_decrypts_for_key_holders_jobs_run_and_no_marker_is_left_in_clear(
        spark: SparkSession, warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    try:
        fill(js)
        assert not scan(warehouse, MARKER.encode())

        names = register_views(spark, js.layout, js.keyring)
        assert {"ORDERS", "KV_cfg", "kv_cfg_values", "HIDDEN", "kv_vault_values"} <= set(names)
        hidden = spark.sql(f"SELECT seq, subject, text FROM HIDDEN WHERE subject LIKE 'h.{MARKER}.%' ORDER BY seq")
        assert [tuple(r) for r in hidden.collect()] == [(i, f"h.{MARKER}.{i}", f"hidden {i}") for i in (3, 4, 5, 6)]
        assert [tuple(r) for r in spark.sql("SELECT key, text FROM kv_vault_values").collect()] == [
            (MARKER, "vault value")]
        sealed_subjects = spark.sql(f"SELECT subject FROM delta.`{js.layout.stream_table('HIDDEN')}`").collect()
        assert len(sealed_subjects) == 6 and not [r for r in sealed_subjects if MARKER.encode() in bytes(r.subject)]
        rows = spark.sql("SELECT seq, msg_id, text, headers['X-Secret'][0] AS secret FROM ORDERS ORDER BY seq").collect()
        assert [(r.seq, r.msg_id, r.text, r.secret) for r in rows] == [
            (i, f"id-{i}", f"{MARKER} payload {i}", f"{MARKER} header {i}") for i in (1, 4, 5, 6)]
        assert [tuple(r) for r in spark.sql("SELECT key, text FROM kv_cfg_values").collect()] == [("db", f"{MARKER} kv value")]

        raw = spark.sql(f"SELECT data, headers FROM delta.`{js.layout.stream_table('ORDERS')}`").collect()
        assert raw and not [r for r in raw if MARKER.encode() in bytes(r.data) + bytes(r.headers or b"")]
        register_views(spark, js.layout)  # no keyring: ciphertext, no values view
        blind = spark.sql("SELECT data, text FROM ORDERS").collect()
        assert len(blind) == 4 and all(r.text is None and MARKER.encode() not in bytes(r.data) for r in blind)
        blind = spark.sql("SELECT subject FROM HIDDEN").collect()
        assert len(blind) == 4 and all(MARKER.encode() not in bytes(r.subject) for r in blind)

        jobs = {"retention": {}, "erase": {}, "compact": {"keyring": js.keyring}}  # compaction re-encrypts
        figures = {name: run_job(spark, js.layout, name, **options) for name, options in jobs.items()}
        assert figures["erase"]["requests_done"] == 2, figures
        assert figures["compact"]["streams_rekeyed"] == 1 and figures["compact"]["rekey_errors"] == 0, figures
        js.flush()
        DeltaTable(str(js.layout.stream_table("HIDDEN"))).create_checkpoint()  # partition values and statistics
        assert not scan(warehouse, MARKER.encode()), "a marker in clear after the jobs"
        assert js.get_message("ORDERS", 4).headers["X-Secret"] == [f"{MARKER} header 4"]
        assert js.get_message("ORDERS", 7).data == f"{MARKER} in the log".encode()
        register_views(spark, js.layout, js.keyring)  # the subjects re-encrypted under epoch 2 still open
        assert [tuple(r) for r in spark.sql("SELECT seq, subject FROM HIDDEN ORDER BY seq").collect()] == [
            (i, f"h.{MARKER}.{i}") for i in (3, 4, 5, 6, 7)]
    finally:
        js.close()

    with pytest.raises(WrongMasterKeyError):
        open_engine(warehouse, clock, MasterKey.from_config("wrong-key-for-the-proof-0123456789", "chachapoly"))
    with pytest.raises(MissingMasterKeyError):
        open_engine(warehouse, clock, None)
    js.layout.objects.delete(js.layout.index_snapshot_key("HIDDEN"))  # rebuilt from the re-encrypted subjects
    js = open_engine(warehouse, clock)
    try:
        assert js.stream("HIDDEN").last_by_subject(f"h.{MARKER}.4").data == b"hidden 4"
        assert [m.subject for m in js.stream("HIDDEN").load_many(list(range(1, 8)))] == [
            f"h.{MARKER}.{i}" for i in (3, 4, 5, 6, 7)]
        assert js.kv.get("vault", MARKER).value == b"vault value"
        assert [m.seq for m in js.stream("ORDERS").load_many(list(range(1, 8)))] == [1, 4, 5, 6, 7]
        assert js.kv.get("cfg", "db").value == f"{MARKER} kv value".encode()
        register_views(spark, js.layout, js.keyring)
        assert spark.sql("SELECT count(*) FROM ORDERS WHERE text LIKE '%payload%'").collect()[0][0] == 4
    finally:
        js.close()
    assert not scan(warehouse, MARKER.encode())
