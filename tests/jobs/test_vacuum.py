"""Storage is freed: retention and compaction vacuum the data files they replaced once the vacuum
window has passed (readers of older snapshots keep them until then), and a running gateway whose
file list predates the rewrite reads on."""

from __future__ import annotations

import base64
import time
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream
from engine.store.layout import Layout
from jobs import compact, retention
from jobs.tables import list_streams, read_tombstones
from tests.gateway import Gateway

pytestmark = pytest.mark.spark


def _data_files(table: Path) -> dict[Path, int]:
    return {p: p.stat().st_size for p in table.rglob("*.parquet")
            if "_delta_log" not in p.parts and not p.name.startswith(".")}


def _named(table: Path) -> set[Path]:
    """The data files the table's latest snapshot names."""
    actions = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True))
    return {table / unquote(p) for p in actions.column("path").to_pylist()}


def test_retention_and_compaction_free_what_they_replaced_after_the_window(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "V", "subjects": ["v.*"]})
    live: dict[int, bytes] = {}
    for round_ in range(3):
        for i in range(10):
            data = f"{round_}-{i}-".encode() * 50
            live[js.publish_one(f"v.{i % 3}", data).seq] = data
        js.flush()
    purged = js.purge("V", "v.0")
    live = {s: d for s, d in live.items() if js.stream("V").index.is_live(s)}
    js.flush()
    path = js.layout.stream_table("V")
    version = DeltaTable(str(path)).version()
    disk_before = sum(_data_files(path).values())

    kept = retention.run(spark, js.layout)  # the default window, an hour: nothing old enough yet
    assert kept["rows_deleted"] == purged and kept["files_rewritten"] > 0 and kept["files_vacuumed"] == 0, kept
    assert set(_data_files(path)) > _named(path), "the replaced files stay for readers of older snapshots"
    assert DeltaTable(str(path), version=version).to_pyarrow_table(columns=["seq"]).num_rows == 30

    freed = retention.run(spark, js.layout, vacuum_window=0)
    assert freed["files_vacuumed"] >= kept["files_rewritten"] and freed["bytes_vacuumed"] > 0, freed
    assert set(_data_files(path)) == _named(path), "every data file left on disk is a live one"
    assert sum(_data_files(path).values()) < disk_before
    tombstones = js.layout.tombstones_table
    assert set(_data_files(tombstones)) == _named(tombstones), "the tombstones table's replaced files go too"
    assert read_tombstones(js.layout) == []
    for seq, data in live.items():
        assert js.get_message("V", seq).data == data

    before = len(_named(path))
    compacted = compact.run(spark, js.layout, vacuum_window=0)
    assert compacted["files_removed"] > compacted["files_added"] > 0
    assert compacted["files_vacuumed"] >= compacted["files_removed"]
    assert set(_data_files(path)) == _named(path) and len(_named(path)) < before
    for seq, data in live.items():
        assert js.get_message("V", seq).data == data

    # A table's own longer deletedFileRetentionDuration wins over the window.
    js.purge("V", "v.1")
    js.flush()
    DeltaTable(str(path)).alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 2 days"})
    held = retention.run(spark, js.layout, vacuum_window=0)
    assert held["rows_deleted"] > 0 and held["files_rewritten"] > 0, held
    assert set(_data_files(path)) > _named(path), "the files replaced now stay two days"


def test_a_running_gateway_reads_on_after_a_rewrite_and_a_vacuum(gateway: Gateway, spark: SparkSession) -> None:
    layout = Layout(gateway.warehouse)
    with gateway.client() as c:
        assert c.post("/v1/streams", json={"name": "READ", "subjects": ["read.*"]}).status_code == 201
        sent: dict[int, bytes] = {}
        subjects: dict[int, str] = {}
        for round_ in range(3):
            messages = [{"subject": f"read.{i % 3}", "text": f"r{round_}-{i}"} for i in range(20)]
            acks = c.post("/v1/publish", json={"messages": messages}).json()["acks"]
            sent.update({a["seq"]: m["text"].encode() for a, m in zip(acks, messages, strict=True)})
            subjects.update({a["seq"]: m["subject"] for a, m in zip(acks, messages, strict=True)})
            assert c.post("/v1/flush").json()["success"] is True
        entry = next(s for s in list_streams(layout) if s.name == "READ")
        assert (DeltaTable(str(entry.path)).transaction_version(entry.stream_id) or 0) == max(sent)
        assert c.post("/v1/streams/READ/consumers", json={"durable_name": "C", "ack_policy": "none"}).status_code == 201
        first = c.post("/v1/streams/READ/consumers/C/next", json={"batch": 10, "no_wait": True}).json()["messages"]
        assert [m["seq"] for m in first] == list(range(1, 11))
        for seq in sent:  # every file and row group is in the gateway's caches now
            assert c.get(f"/v1/streams/READ/messages/{seq}").status_code == 200
        purged = c.post("/v1/streams/READ/purge", json={"filter": "read.0"}).json()["purged"]
        assert c.post("/v1/flush").json()["success"] is True
        live = {s: d for s, d in sent.items() if subjects[s] != "read.0"}
        assert purged == len(sent) - len(live)

        figures = retention.run(spark, layout, vacuum_window=0)
        assert figures["rows_deleted"] == purged and figures["files_vacuumed"] > 0, figures
        assert set(_data_files(entry.path.local_path)) == _named(entry.path.local_path)

        for seq, data in live.items():  # point reads: the cached file list names vacuumed files
            resp = c.get(f"/v1/streams/READ/messages/{seq}")
            assert resp.status_code == 200, (seq, resp.text)
            assert base64.b64decode(resp.json()["message"]["data"]) == data
        rest: list[dict] = []
        deadline = time.monotonic() + 30
        while len(rest) < len([s for s in live if s > 10]) and time.monotonic() < deadline:  # windowed reads
            got = c.post("/v1/streams/READ/consumers/C/next", json={"batch": 50, "no_wait": True}).json()["messages"]
            assert got, "the consumer reads on"
            rest += got
        assert {m["seq"]: base64.b64decode(m["data"]) for m in rest} == {s: d for s, d in live.items() if s > 10}
