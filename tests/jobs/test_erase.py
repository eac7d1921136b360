"""GDPR erasure: the API makes messages unreadable at once, the erase job leaves no byte of them.

The end-to-end test publishes messages carrying unique markers (in the subject, payload, headers and
message id) through a real gateway, among ordinary messages, some before and some after a consumer
acks them; erases them by filter, by sequence and through `DELETE .../messages/{seq}`; runs the job;
then reads every byte and every name under the warehouse and finds no marker, while every other
message stays readable through the API (after a restart) and through Spark.
"""

from __future__ import annotations

import base64
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus, unquote

import httpx
import orjson
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream, JetStreamError, ManualClock
from engine.store.layout import Layout
from jobs import erase
from tests.gateway import Gateway

pytestmark = pytest.mark.spark

STREAM = "GDPR"


# -- the residue scanner ----------------------------------------------------------------------


def needles_for(marker: str, *texts: str) -> dict[str, bytes]:
    """The marker as bytes and in the encodings a file or folder name or a log entry could use."""
    forms = {marker: marker.encode(), f"{marker} utf-16": marker.encode("utf-16-le")}
    for text in (marker, *texts):
        forms[f"quote({text})"] = quote(text, safe="").encode()
        forms[f"quote_plus({text})"] = quote_plus(text).encode()
        forms[f"base64({text})"] = base64.b64encode(text.encode()).decode().rstrip("=").encode()
    return forms


def find_residue(root: Path, needles: dict[str, bytes]) -> list[str]:
    """Every place under `root` where a needle shows: names, raw bytes (path and offset), and the
    decoded values of Parquet files (compression could hide a repeated marker from a byte search)."""
    hits: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            for label, needle in needles.items():
                text = needle.decode(errors="ignore")
                if text and (text in name or text in unquote(name)):
                    hits.append(f"name {path} ({label})")
        for name in filenames:
            path = Path(dirpath) / name
            data = path.read_bytes()
            for label, needle in needles.items():
                for m in re.finditer(re.escape(needle), data):
                    hits.append(f"bytes {path} offset {m.start()} ({label})")
            if name.endswith(".parquet") and not name.startswith("."):
                try:
                    values = repr(pq.read_table(path).to_pylist()).encode()
                except Exception as exc:  # a file we cannot decode is itself worth reporting
                    hits.append(f"undecodable parquet {path}: {exc}")
                    continue
                for label, needle in needles.items():
                    if needle in values:
                        hits.append(f"decoded parquet {path} ({label})")
    return hits


# -- helpers ----------------------------------------------------------------------------------


def publish(c: httpx.Client, messages: list[dict[str, Any]]) -> list[int]:
    resp = c.post("/v1/publish", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    acks = resp.json()["acks"]
    assert all("seq" in a for a in acks), acks
    return [a["seq"] for a in acks]


def stream_id(warehouse: Path) -> str:
    return orjson.loads((Layout(warehouse).stream_configs / f"{STREAM}.json").read_bytes())["stream_id"]  # type: ignore[no-any-return]


def wait_flushed(warehouse: Path, seq: int, removals: bool = False, timeout: float = 15.0) -> None:
    """Until the stream's table holds `seq` (and, with `removals`, the tombstones table the removals
    made when `seq` was the last sequence)."""
    layout, sid = Layout(warehouse), stream_id(warehouse)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = DeltaTable(str(layout.stream_table(STREAM))).transaction_version(sid) or 0
        try:
            tombs = DeltaTable(str(layout.tombstones_table)).transaction_version(f"{sid}/seq") or 0
        except Exception:
            tombs = 0
        if table >= seq and (tombs >= seq or not removals):
            time.sleep(0.3)  # the flusher drops the log segments right after its commits
            return
        time.sleep(0.05)
    raise TimeoutError(f"seq {seq} not flushed within {timeout}s")


def get(c: httpx.Client, seq: int) -> httpx.Response:
    return c.get(f"/v1/streams/{STREAM}/messages/{seq}")


def check_readable(c: httpx.Client, kept: dict[int, bytes], erased: set[int]) -> None:
    for seq, data in kept.items():
        resp = get(c, seq)
        assert resp.status_code == 200, (seq, resp.text)
        assert base64.b64decode(resp.json()["message"]["data"]) == data
    for seq in erased:
        resp = get(c, seq)
        assert resp.status_code == 404 and resp.json()["error"]["err_code"] == 10037, (seq, resp.text)


# -- end to end -------------------------------------------------------------------------------


def test_erasure_leaves_no_byte_of_the_erased_messages(warehouse: Path, spark: SparkSession) -> None:
    marker_a = "zq7marker" + secrets.token_hex(8)  # in subjects, payloads, headers and a message id
    marker_b = "zq7marker" + secrets.token_hex(8)  # in payloads of ordinary subjects
    subject_a = f"users.{marker_a}.profile"
    layout = Layout(warehouse)
    kept: dict[int, bytes] = {}
    erased: set[int] = set()

    def ordinary(i: int) -> dict[str, Any]:
        return {"subject": f"orders.o{i % 3}", "text": f"order {i} of a customer"}

    def sort_out(seqs: list[int], batch: list[dict[str, Any]]) -> None:
        for seq, msg in zip(seqs, batch, strict=True):
            if msg["subject"] == subject_a:
                erased.add(seq)
            else:
                kept[seq] = msg["text"].encode()

    def secret(i: int) -> dict[str, Any]:
        return {
            "subject": subject_a,
            "text": f"name {marker_a} #{i}",
            "headers": {"X-Person": [marker_a], "Nats-Msg-Id": [f"{marker_a}-{i}"]},
        }

    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gw.client() as c:
            resp = c.post("/v1/streams", json={"name": STREAM, "subjects": ["orders.>", "users.>"]})
            assert resp.status_code == 201, resp.text
            batch = [ordinary(i) if i % 3 else secret(i) for i in range(30)]
            batch.append({"subject": "orders.o1", "text": f"note {marker_b} one"})
            batch.append({"subject": "orders.o2", "text": f"note {marker_b} two"})
            seqs = publish(c, batch)
            sort_out(seqs, batch)
            by_seq, by_delete = seqs[-2], seqs[-1]
            wait_flushed(warehouse, seqs[-1])

            # A consumer that acks everything, then more of both kinds published and acked.
            resp = c.post(f"/v1/streams/{STREAM}/consumers", json={"durable_name": "C", "ack_policy": "explicit"})
            assert resp.status_code == 201, resp.text
            batch = [secret(100 + i) if i % 2 else ordinary(100 + i) for i in range(10)]
            seqs = publish(c, batch)
            sort_out(seqs, batch)
            delivered: list[dict[str, Any]] = []
            while len(delivered) < len(kept) + len(erased):
                resp = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json={"batch": 100, "no_wait": True})
                assert resp.status_code == 200, resp.text
                got = resp.json()["messages"]
                assert got, "the consumer stopped short"
                delivered += got
            resp = c.post(f"/v1/streams/{STREAM}/consumers/C/ack", json={"acks": [{"token": m["ack"], "type": "ack"} for m in delivered]})
            assert all(r.get("ok") for r in resp.json()["results"]), resp.text
            wait_flushed(warehouse, seqs[-1])
            needles = {**needles_for(marker_a, subject_a), **needles_for(marker_b)}
            assert find_residue(warehouse, needles), "the scanner must see the markers before erasure"

            # Erase: by filter, by sequence, and by a plain delete (which queues a request too).
            resp = c.post("/v1/erasures", json={"stream": STREAM, "filter": f"users.{marker_a}.>"})
            assert resp.status_code == 202, resp.text
            by_filter = resp.json()
            assert by_filter["status"] == "pending" and by_filter["messages"] == len(erased)
            resp = c.post("/v1/erasures", json={"stream": STREAM, "seq": by_seq})
            assert resp.status_code == 202 and resp.json()["messages"] == 1, resp.text
            by_seq_id = resp.json()["id"]
            resp = c.delete(f"/v1/streams/{STREAM}/messages/{by_delete}")
            assert resp.status_code == 200, resp.text
            for seq in (by_seq, by_delete):
                erased.add(seq)
                del kept[seq]
            requests = sorted(layout.root.joinpath("_system", "erasures").glob("*.json"))
            assert len(requests) == 3
            for path in requests:  # the registry keeps sequence ranges, never a subject or a filter
                assert b"zq7marker" not in path.read_bytes() and b"users" not in path.read_bytes()

            # Gone from every read at once.
            check_readable(c, kept, erased)
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            assert state["messages"] == len(kept)
            resp = c.post(f"/v1/streams/{STREAM}/consumers", json={"name": "fresh", "deliver_policy": "all"})
            assert resp.status_code == 201, resp.text
            resp = c.post(f"/v1/streams/{STREAM}/consumers/fresh/next", json={"batch": 200, "no_wait": True})
            assert {m["seq"] for m in resp.json()["messages"]} == set(kept)
            status = c.get(f"/v1/erasures/{by_filter['id']}").json()
            assert status["status"] == "pending" and "receipt" not in status and status["requested"].endswith("Z")

            # Errors in JetStream's shape.
            resp = c.get("/v1/erasures/" + "0" * 32)
            assert resp.status_code == 404 and resp.json()["error"]["code"] == 404
            resp = c.post("/v1/erasures", json={"stream": STREAM, "seq": 1, "filter": "orders.>"})
            assert resp.status_code == 400 and resp.json()["error"]["err_code"] == 10003
            resp = c.post("/v1/erasures", json={"stream": "NOPE", "seq": 1})
            assert resp.status_code == 404 and resp.json()["error"]["err_code"] == 10059
            resp = c.post("/v1/erasures", json={"stream": STREAM, "seq": 10_000})
            assert resp.status_code == 400 and resp.json()["error"]["err_code"] == 10043

            # The job, while the gateway keeps running.
            wait_flushed(warehouse, max(max(erased), max(kept)), removals=True)
            figures = erase.run(spark, layout)
            print("erase job:", figures)
            assert figures["requests_done"] == 3 and figures["requests_pending"] == 0
            assert figures["rows_deleted"] == len(erased)
            for erasure_id in (by_filter["id"], by_seq_id):
                status = c.get(f"/v1/erasures/{erasure_id}").json()
                assert status["status"] == "done", status
                assert status["completed"] >= status["requested"]
                receipt = status["receipt"]
                assert receipt["files_rewritten"] > 0 and receipt["files_vacuumed"] > 0 and receipt["log_entries_removed"] > 0
                assert receipt["folders_removed"] >= 1
            assert erase.run(spark, layout)["requests_done"] == 0  # nothing left: a rerun is a no-op

            # The gateway reads the rewritten table and keeps publishing and flushing into it.
            check_readable(c, kept, erased)
            later = publish(c, [ordinary(200 + i) for i in range(5)])
            kept.update({seq: f"order {200 + i} of a customer".encode() for i, seq in enumerate(later)})
            wait_flushed(warehouse, later[-1])
            check_readable(c, kept, erased)
    finally:
        gw.stop()

    residue = find_residue(warehouse, needles)
    assert not residue, "erased bytes remain:\n" + "\n".join(residue)

    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gw.client() as c:
            check_readable(c, kept, erased)
            assert c.get(f"/v1/streams/{STREAM}").json()["state"]["messages"] == len(kept)
    finally:
        gw.stop()

    rows = spark.read.format("delta").load(str(layout.stream_table(STREAM))).select("seq", "data").collect()
    assert {r["seq"]: bytes(r["data"]) for r in rows} == kept
    assert not find_residue(warehouse, needles)


# -- the registry and the job's waiting, in-process ---------------------------------------------


def test_requests_wait_for_the_flush_and_hold_no_subject(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "W", "subjects": ["w.>"]})
    secret = "zq7marker" + secrets.token_hex(8)
    for i in range(4):
        js.publish_one(f"w.{secret}", f"{i} {secret}".encode()) if i % 2 else js.publish_one("w.plain", b"plain")
    js.flush()
    js.publish_one(f"w.{secret}", b"not flushed yet")  # seq 5: erased before it reaches the table
    from engine.erasures import registry

    reg = registry(js.layout)
    answer = reg.erase(js.stream("W"), filter_=f"w.{secret}")
    assert answer["messages"] == 3 and answer["status"] == "pending"
    assert js.stream("W").state()["messages"] == 2
    with pytest.raises(JetStreamError):
        js.get_message("W", 2)
    record = (js.layout.root / "_system" / "erasures" / f"{answer['id']}.json").read_bytes()
    assert secret.encode() not in record and b"w." not in record
    assert orjson.loads(record)["ranges"] == [[2, 2], [4, 5]]

    figures = erase.run(spark, js.layout)  # seq 5 is not flushed yet: the request waits
    assert figures["requests_pending"] == 1 and figures["requests_done"] == 0
    assert reg.get(answer["id"])["status"] == "pending"
    js.flush()  # seq 5 never reaches the table; its app transaction does
    figures = erase.run(spark, js.layout)
    assert figures["requests_done"] == 1 and figures["rows_deleted"] == 2
    assert reg.get(answer["id"])["status"] == "done"
    table = js.layout.stream_table("W")
    assert not find_residue(table, needles_for(secret))
    assert sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["seq"]).column("seq").to_pylist()) == [1, 3]
    assert DeltaTable(str(table)).metadata().configuration.get("delta.deletedFileRetentionDuration") is None


def test_an_erasure_of_a_memory_stream_is_done_without_files(js: JetStream, clock: ManualClock, spark: SparkSession) -> None:
    js.add_stream({"name": "M", "subjects": ["m.>"], "storage": "memory"})
    js.publish_one("m.a", b"x")
    from engine.erasures import registry

    answer = registry(js.layout).erase(js.stream("M"), seq=1)
    assert js.stream("M").state()["messages"] == 0
    assert erase.run(spark, js.layout)["requests_done"] == 1
    assert registry(js.layout).get(answer["id"])["status"] == "done"
