"""GDPR erasure: the API makes messages unreadable at once, the erase job leaves no byte of them.

The end-to-end test publishes messages carrying unique markers (in the subject, payload, headers and
message id) through a real gateway, among ordinary messages, some before and some after a consumer
acks them; erases them by filter, by sequence and through `DELETE .../messages/{seq}`; runs the job;
then reads every byte and every name under the warehouse and finds no marker, while every other
message stays readable through the API (after a restart) and through Spark.
"""

from __future__ import annotations

import base64
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream, JetStreamError, ManualClock
from engine.erasures import registry
from engine.store.layout import Layout
from engine.store.rows import KIND_ARROW, KIND_PACKED, decode
from engine.store.wal import read_segment
from jobs import erase, retention
from jobs.tables import read_stream, read_tombstones
from tests.gateway import Gateway
from tests.residue import find_residue, needles_for

pytestmark = pytest.mark.spark

STREAM = "GDPR"


# -- helpers ----------------------------------------------------------------------------------


def publish(c: httpx.Client, messages: list[dict[str, Any]]) -> list[int]:
    resp = c.post("/v1/publish", json={"messages": messages})
    assert resp.status_code == 200, resp.text
    acks = resp.json()["acks"]
    assert all("seq" in a for a in acks), acks
    return [a["seq"] for a in acks]


def stream_id(warehouse: Path, stream: str = STREAM) -> str:
    entry = read_stream(Layout(warehouse), stream)
    assert entry is not None
    return entry.stream_id


def logged_seqs(layout: Layout, stream: str) -> set[int]:
    """The message sequences the stream's log segments still hold (the engine's own reader)."""
    found: set[int] = set()
    for path in sorted(layout.wal_dir(stream).glob("*.wal")):
        try:
            records, _ = read_segment(path)
        except FileNotFoundError:
            continue
        for record in records:
            if record.kind in (KIND_ARROW, KIND_PACKED):
                rows = decode(record.kind, record.payload)
                found.update(range(rows.first_seq, rows.last_seq + 1))
    return found


def wait_flushed(
    warehouse: Path, seq: int, removals: bool = False, timeout: float = 30.0, stream: str = STREAM
) -> None:
    """Until the stream's table holds `seq` (with `removals`, the tombstones table the removals made
    when `seq` was the last sequence) and no log segment holds a sequence up to `seq`."""
    layout, sid = Layout(warehouse), stream_id(warehouse, stream)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        table = DeltaTable(str(layout.stream_table(stream))).transaction_version(sid) or 0
        try:
            tombs = DeltaTable(str(layout.tombstones_table)).transaction_version(f"{sid}/seq") or 0
        except Exception:
            tombs = 0
        if table >= seq and (tombs >= seq or not removals) and not {s for s in logged_seqs(layout, stream) if s <= seq}:
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
                assert receipt["folders_removed"] >= 1 and receipt["tombstones_removed"] >= 1
                checked = receipt["verification"]
                assert checked["verified"] is True and checked["rows_found"] == 0 and checked["files_read"] >= 1
                assert checked["files_checked"] >= checked["files_read"]
                assert checked["log_entries_before_checkpoint"] == 0
                assert checked["checkpoint_version"] == receipt["checkpoint_version"] <= checked["table_version"]
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
    answer = registry(js.layout).erase(js.stream("M"), seq=1)
    assert js.stream("M").state()["messages"] == 0
    assert erase.run(spark, js.layout)["requests_done"] == 1
    assert registry(js.layout).get(answer["id"])["status"] == "done"


# -- every stored copy ----------------------------------------------------------------------------


def _marker() -> str:
    return "zq7marker" + secrets.token_hex(8)


def test_every_stored_copy_is_erased_not_only_the_live_ones(js: JetStream, spark: SparkSession) -> None:
    """Purged (before and after a retention run), `no_erase`-deleted, KV history past its limit,
    work-queue and interest removals and a replaced object: each erased by filter, key or object
    while its rows sit in the table unapplied; after the job, no byte of any marker anywhere."""
    reg = registry(js.layout)
    markers: dict[str, str] = {}
    kept: dict[tuple[str, int], bytes] = {}

    def keep(stream: str, subject: str, data: bytes) -> None:
        ack = js.publish_one(subject, data)
        kept[(stream, ack.seq)] = data

    # Purge, then erase; and purge, retention (the rows go from the snapshot, not from the old
    # files, whose window has not passed), then erase.
    js.add_stream({"name": "PURGED", "subjects": ["p.>"]})
    for key in ("purged_applied", "purged"):
        markers[key] = m = _marker()
        for i in range(3):
            js.publish_one(f"p.{m}", f"{m} #{i}".encode())
        keep("PURGED", "p.other", b"kept")
        js.flush()
        js.purge("PURGED", f"p.{m}")
        js.flush()
        if key == "purged_applied":
            assert retention.run(spark, js.layout)["rows_deleted"] == 3
    # Deleted with no_erase, then erased by filter.
    js.add_stream({"name": "NOERASE", "subjects": ["n.>"]})
    markers["no_erase"] = m = _marker()
    seq = js.publish_one(f"n.{m}", m.encode()).seq
    keep("NOERASE", "n.other", b"kept")
    js.flush()
    js.delete_message("NOERASE", seq, erase=False)
    # KV history past the limit (history 2, three revisions): every revision.
    js.kv.create({"bucket": "people", "history": 2})
    markers["kv"] = m = _marker()
    for i in range(3):
        js.kv.put("people", f"p.{m}", f"{m} revision {i}".encode())
        js.flush()
    kept[("KV_people", js.kv.put("people", "p.other", b"kept"))] = b"kept"
    # Work-queue and interest removals, acknowledged, not yet applied by retention.
    for name, retention_policy in (("WQ", "workqueue"), ("INTEREST", "interest")):
        js.add_stream({"name": name, "subjects": [f"{name.lower()}.>"], "retention": retention_policy})
        js.add_consumer(name, {"durable_name": "C", "ack_policy": "explicit"})
        markers[name] = m = _marker()
        seq = js.publish_one(f"{name.lower()}.{m}", m.encode()).seq
        js.flush()
        assert [d.msg.seq for d in js.fetch(name, "C", 5)] == [seq]
        assert js.ack(name, "C", [(seq, "ack", 0)]) == [None]
    # An object replaced once: both versions' chunks and infos.
    js.objects.create({"bucket": "docs"})
    markers["object"] = m = _marker()
    first = js.objects.put("docs", f"{m}.pdf", f"first {m} ".encode() * 40, chunk_size=64)
    js.flush()
    second = js.objects.put("docs", f"{m}.pdf", f"second {m} ".encode() * 30, chunk_size=64)
    other = js.objects.put("docs", "other.pdf", b"kept object", chunk_size=64)
    js.flush()

    needles = {key: needles_for(m, f"{m}.pdf") for key, m in markers.items()}
    before = {key: bool(find_residue(js.layout.warehouse, n)) for key, n in needles.items()}
    assert all(before.values()), f"the scanner must see every marker first: {before}"

    answers = {
        "purged": reg.erase(js.stream("PURGED"), filter_=f"p.{markers['purged']}"),
        "purged_applied": reg.erase(js.stream("PURGED"), filter_=f"p.{markers['purged_applied']}"),
        "no_erase": reg.erase(js.stream("NOERASE"), filter_=f"n.{markers['no_erase']}"),
        "kv": reg.erase_key(js.kv, "people", f"p.{markers['kv']}"),
        "WQ": reg.erase(js.stream("WQ"), filter_=f"wq.{markers['WQ']}"),
        "INTEREST": reg.erase(js.stream("INTEREST"), filter_=f"interest.{markers['INTEREST']}"),
        "object": reg.erase_object(js.objects, "docs", f"{markers['object']}.pdf"),
    }
    assert {k: a["messages"] for k, a in answers.items()} == {
        # applied by retention: no row in the table, and no copy in memory (a stream nobody reads keeps
        # none of what it committed); the bytes left in the replaced files go with the job's vacuum
        "purged": 3, "purged_applied": 0,
        "no_erase": 1, "kv": 3, "WQ": 1, "INTEREST": 1,
        "object": first.chunks + second.chunks + 2,
    }
    js.flush()

    figures = erase.run(spark, js.layout)
    assert figures["errors"] == 0 and figures["requests_pending"] == 0, figures
    assert figures["requests_done"] == len(answers), figures
    for key, answer in answers.items():
        status = reg.get(answer["id"])
        assert status["status"] == "done" and status["receipt"]["verification"]["verified"], (key, status)

    left = {key: hits for key, n in needles.items() if (hits := find_residue(js.layout.warehouse, n))}
    assert not left, "erased bytes remain:\n" + "\n".join(f"{k}: {h[:5]}" for k, h in left.items())
    assert not [t for t in read_tombstones(js.layout) if t.erase], "the job removes the erase tombstones it applied"
    for (stream, seq), data in kept.items():
        assert js.get_message(stream, seq).data == data
    assert js.objects.info("docs", "other.pdf").nuid == other.nuid


def test_a_deleted_and_recreated_stream(js: JetStream, spark: SparkSession) -> None:
    """A request for a stream deleted and re-created since: done, nothing of the old stream left,
    the namesake untouched (its sequences overlap the request's)."""
    js.add_stream({"name": "AGAIN", "subjects": ["again.>"]})
    marker = _marker()
    for i in range(5):
        js.publish_one(f"again.{marker}", f"{marker} {i}".encode())
    js.flush()
    answer = registry(js.layout).erase(js.stream("AGAIN"), filter_=f"again.{marker}")
    assert answer["messages"] == 5
    js.delete_stream("AGAIN")
    js.add_stream({"name": "AGAIN", "subjects": ["again.>"]})
    new = {js.publish_one("again.new", f"new {i}".encode()).seq: f"new {i}".encode() for i in range(8)}
    js.flush()

    figures = erase.run(spark, js.layout)

    assert figures["requests_done"] == 1 and figures["errors"] == 0 and figures["rows_deleted"] == 0, figures
    receipt = registry(js.layout).get(answer["id"])["receipt"]
    assert receipt["stream_deleted"] is True
    assert not find_residue(js.layout.warehouse, needles_for(marker))
    table = DeltaTable(str(js.layout.stream_table("AGAIN"))).to_pyarrow_table(columns=["seq", "data"])
    assert dict(zip(table.column("seq").to_pylist(), table.column("data").to_pylist(), strict=True)) == new
    for seq, data in new.items():
        assert js.get_message("AGAIN", seq).data == data


def test_a_crash_between_the_commit_and_the_removal_of_the_log_segment(warehouse: Path, spark: SparkSession) -> None:
    """The gateway is killed after a flush committed the messages but before it removed the log
    segment holding them: the job must wait while that segment is there, and finish once the gateway
    (restarted) has dropped it; then no byte of the marker is left, in `_wal` included."""
    layout = Layout(warehouse)
    marker = _marker()
    gw = Gateway(warehouse, "--flush-interval", "600").start()  # only /v1/flush moves the log to the table
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["crash.>"]}).status_code == 201
            publish(c, [{"subject": f"crash.{marker}", "text": f"{marker} {i}"} for i in range(4)]
                    + [{"subject": "crash.kept", "text": "kept"}])
            segments = sorted(layout.wal_dir(STREAM).glob("*.wal"))
            assert segments and logged_seqs(layout, STREAM) == {1, 2, 3, 4, 5}
            saved = warehouse.parent / "saved-segments"
            saved.mkdir()
            for path in segments:
                shutil.copy2(path, saved / path.name)
            assert c.post("/v1/flush").json()["success"] is True
            resp = c.post("/v1/erasures", json={"stream": STREAM, "filter": f"crash.{marker}"})
            assert resp.status_code == 202 and resp.json()["messages"] == 4, resp.text
            erasure_id = resp.json()["id"]
            assert c.post("/v1/flush").json()["success"] is True
            assert not logged_seqs(layout, STREAM), "the flush dropped the segments"
        gw.kill9()
        for path in sorted(saved.iterdir()):  # the unlink that the crash cut short
            shutil.copy2(path, layout.wal_dir(STREAM) / path.name)
        assert logged_seqs(layout, STREAM) == {1, 2, 3, 4, 5}

        figures = erase.run(spark, layout)
        assert figures["requests_pending"] == 1 and figures["requests_done"] == 0, figures
        assert figures["per_stream"][STREAM]["status"] == "waiting"
        assert registry(layout).get(erasure_id)["status"] == "pending"

        gw.start()  # the restarted gateway drops the flushed segment (at recovery, or at its next flush)
        with gw.client() as c:
            later = publish(c, [{"subject": "crash.kept", "text": "after the restart"}])
            assert c.post("/v1/flush").json()["success"] is True
            wait_flushed(warehouse, later[-1])
            assert not logged_seqs(layout, STREAM) & {1, 2, 3, 4}
            figures = erase.run(spark, layout)
            assert figures["requests_done"] == 1 and figures["rows_deleted"] == 4, figures
            check_readable(c, {5: b"kept", later[-1]: b"after the restart"}, {1, 2, 3, 4})
    finally:
        gw.stop()
    residue = find_residue(warehouse, needles_for(marker))
    assert not residue, "erased bytes remain:\n" + "\n".join(residue)
