"""Retention: tombstones become rewritten files, keyed by sequence only; idempotent, safe to kill, and
run beside a live gateway without losing, duplicating or changing an acknowledged message."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import JetStream
from engine.store.layout import Layout
from jobs import retention
from jobs.tables import LeaseTimes, list_streams, read_tombstones
from tests.gateway import Gateway
from tests.jobs.test_both_writers import assert_both_writers_protocol, spark_rows, table_rows

pytestmark = pytest.mark.spark


def _publish(js: JetStream, subject: str, n: int, tag: str) -> dict[int, tuple[str, bytes]]:
    out = {}
    for i in range(n):
        data = f"{tag}-{i}".encode()
        out[js.publish_one(subject, data).seq] = (subject, data)
    return out


def test_retention_applies_tombstones_by_sequence_and_a_rerun_does_nothing(
    js: JetStream, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    js.add_stream({"name": "A", "subjects": ["a.>"]})
    js.add_stream({"name": "MANY", "subjects": ["many"]})
    js.add_stream({"name": "GONE", "subjects": ["gone"]})
    live: dict[str, dict[int, tuple[str, bytes]]] = {"A": {}, "MANY": {}}
    for subject in ("a.x", "a.y", "a.secret-subject"):
        live["A"].update(_publish(js, subject, 6, subject))
    live["MANY"].update(_publish(js, "many", 40, "many"))
    _publish(js, "gone", 3, "gone")
    js.flush()
    for seq in (2, 3, 4):  # one coalesced range in A
        js.delete_message("A", seq, erase=False)
        live["A"].pop(seq)
    js.purge("A", "a.secret-subject")
    for seq in [s for s, (subj, _) in live["A"].items() if subj == "a.secret-subject"]:
        live["A"].pop(seq)
    for seq in range(1, 41, 3):  # 14 separate ranges in MANY: over the threshold, a MERGE
        js.delete_message("MANY", seq, erase=False)
        live["MANY"].pop(seq)
    js.delete_message("A", 1, erase=True)  # GDPR: left to the erase job
    live["A"].pop(1)
    js.delete_message("GONE", 1, erase=False)
    js.flush()
    gone_id = next(s.stream_id for s in list_streams(js.layout) if s.name == "GONE")
    js.delete_stream("GONE")

    # Killed after the DELETEs committed, before the tombstones went: a rerun finishes the work.
    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(retention, "_remove_tombstones", killed)
    with pytest.raises(KeyboardInterrupt):
        retention.run(spark, js.layout, merge_threshold=4)
    monkeypatch.undo()
    assert [r[0] for r in table_rows(js.layout.stream_table("A"))] == sorted([1, *live["A"]])
    assert [r[0] for r in table_rows(js.layout.stream_table("MANY"))] == sorted(live["MANY"])
    assert len(read_tombstones(js.layout)) == 3 + 1 + 14 + 1 + 1, "the killed run removed no tombstone"

    figures = retention.run(spark, js.layout, merge_threshold=4)
    assert figures["errors"] == 0
    assert figures["rows_deleted"] == 0, "the rows went in the killed run; the rerun finds none"
    assert figures["orphan_tombstones_removed"] == 1 and figures["erase_ranges_left"] == 1
    assert figures["tombstones_removed"] == 3 + 1 + 14 + 1

    path_a, path_many = js.layout.stream_table("A"), js.layout.stream_table("MANY")
    # A keeps seq 1 (erase pending); MANY has exactly its live rows.
    assert [r[0] for r in table_rows(path_a)] == sorted([1, *live["A"]])
    assert table_rows(path_many) == sorted((s, subj, d) for s, (subj, d) in live["MANY"].items())
    assert spark_rows(spark, path_many) == table_rows(path_many)
    left = read_tombstones(js.layout)
    assert [(t.first_seq, t.last_seq, t.erase) for t in left] == [(1, 1, True)]
    assert all(t.stream_id != gone_id for t in left)
    for path in (path_a, path_many, js.layout.tombstones_table):
        assert_both_writers_protocol(path)
    # Deletes were keyed by sequence: no subject reached a commit's predicate.
    for entry in DeltaTable(str(path_a)).history():
        assert "secret" not in str(entry.get("operationParameters")), entry
    # The engine still reads what it holds, from the files Spark wrote.
    for name in ("A", "MANY"):
        for seq, (subject, data) in live[name].items():
            msg = js.get_message(name, seq)
            assert (msg.subject, msg.data) == (subject, data)

    versions = {p: DeltaTable(str(p)).version() for p in (path_a, path_many, js.layout.tombstones_table)}
    again = retention.run(spark, js.layout, merge_threshold=4)
    assert again["tombstone_ranges_applied"] == 0 and again["tombstones_removed"] == 0 and again["rows_deleted"] == 0
    assert {p: DeltaTable(str(p)).version() for p in versions} == versions, "a rerun commits nothing"


# -- under a live gateway ---------------------------------------------------------------------------


@dataclass
class GatewayLoad:
    """Publishes (with per-publish latency) and fetch-and-acks from threads against a real gateway."""

    gateway: Gateway
    stream: str
    subjects: list[str]
    consumer: str
    max_messages: int = 1200
    stop: threading.Event = field(default_factory=threading.Event)
    acked: dict[int, tuple[str, bytes]] = field(default_factory=dict)
    publishes: list[tuple[float, float]] = field(default_factory=list)  # (start, end) wall clock
    consumer_acks: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._threads = [threading.Thread(target=self._publisher, args=(k,)) for k in range(2)]
        self._threads.append(threading.Thread(target=self._acker))

    def _publisher(self, k: int) -> None:
        with self.gateway.client() as client:
            i = 0
            while not self.stop.is_set():
                with self._lock:
                    if self._count >= self.max_messages:
                        return
                    self._count += 1
                subject = self.subjects[(i + k) % len(self.subjects)]
                data = f"live-{k}-{i}".encode()
                start = time.time()
                try:
                    r = client.post(f"/v1/publish/{subject}", content=data)
                except httpx.HTTPError as exc:
                    self.errors.append(f"publish: {exc!r}")
                    return
                end = time.time()
                if r.status_code != 200:
                    self.errors.append(f"publish {r.status_code}: {r.text}")
                    return
                with self._lock:
                    self.acked[r.json()["seq"]] = (subject, data)
                    self.publishes.append((start, end))
                i += 1
                time.sleep(0.02)

    def _acker(self) -> None:
        with self.gateway.client() as client:
            while not self.stop.is_set():
                r = client.post(f"/v1/streams/{self.stream}/consumers/{self.consumer}/next", json={"batch": 20, "no_wait": True})
                if r.status_code != 200:
                    self.errors.append(f"next {r.status_code}: {r.text}")
                    return
                messages = r.json()["messages"]
                if messages:
                    acks = [{"token": m["ack"], "type": "ack"} for m in messages]
                    a = client.post(f"/v1/streams/{self.stream}/consumers/{self.consumer}/ack", json={"acks": acks})
                    if a.status_code != 200 or not all(x.get("ok") for x in a.json()["results"]):
                        self.errors.append(f"ack {a.status_code}: {a.text}")
                        return
                    self.consumer_acks += len(acks)
                else:
                    time.sleep(0.05)

    def wait_for(self, publishes: int, acks: int, timeout: float = 60.0) -> None:
        """Until that many publishes and consumer acks have succeeded (or the load failed)."""
        deadline = time.monotonic() + timeout
        while (len(self.publishes) < publishes or self.consumer_acks < acks) and not self.errors:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.publishes)} publishes and {self.consumer_acks} acks after {timeout}s")
            time.sleep(0.01)

    def __enter__(self) -> GatewayLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=60)


def _wait_flushed(layout: Layout, stream: str, seq: int, timeout: float = 30.0) -> None:
    entry = next(s for s in list_streams(layout) if s.name == stream)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (DeltaTable(str(entry.path)).transaction_version(entry.stream_id) or 0) >= seq:
            return
        time.sleep(0.1)
    raise TimeoutError(f"stream {stream} not flushed up to {seq}")


def _wait_tombstones(layout: Layout, count: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(read_tombstones(layout)) >= count:
            return
        time.sleep(0.1)
    raise TimeoutError("tombstones not flushed")


def _api_messages(client: httpx.Client, stream: str, last_seq: int) -> dict[int, tuple[str, bytes]]:
    out = {}
    for seq in range(1, last_seq + 1):
        r = client.get(f"/v1/streams/{stream}/messages/{seq}")
        if r.status_code == 404:
            continue
        assert r.status_code == 200, r.text
        m = r.json()["message"]
        out[seq] = (m["subject"], base64.b64decode(m["data"]))
    return out


def run_job_under_load(
    gateway: Gateway, spark: SparkSession, job: Callable[[SparkSession, Layout, LeaseTimes], dict[str, Any]]
) -> dict[str, Any]:
    """Preloads a stream in several flushes, deletes and purges some, runs `job` under a publish-and-ack
    load, then checks every acknowledged live message against the table and the API."""
    layout = Layout(gateway.warehouse)
    stream, subjects = "LOAD", ["load.a", "load.b", "load.c", "load.d"]
    result: dict[str, Any] = {}
    with gateway.client() as client:
        assert client.post("/v1/streams", json={"name": stream, "subjects": ["load.>"]}).status_code == 201
        r = client.post(f"/v1/streams/{stream}/consumers", json={"durable_name": "C", "ack_policy": "explicit"})
        assert r.status_code == 201, r.text
        preloaded: dict[int, tuple[str, bytes]] = {}
        for b in range(6):  # six flushes: several small files per partition
            msgs = [(subjects[i % 4], f"pre-{b}-{i}".encode()) for i in range(25)]
            r = client.post("/v1/publish", json={"messages": [{"subject": s, "text": d.decode()} for s, d in msgs]})
            for ack, msg in zip(r.json()["acks"], msgs, strict=True):
                preloaded[ack["seq"]] = msg
            _wait_flushed(layout, stream, max(preloaded))
        deleted = {3, 10, 11, 12, 77}
        for seq in deleted:
            assert client.delete(f"/v1/streams/{stream}/messages/{seq}", params={"no_erase": "true"}).status_code == 200
        purged = {s for s, (subj, _) in preloaded.items() if subj == "load.d"}
        assert client.post(f"/v1/streams/{stream}/purge", json={"filter": "load.d"}).json()["purged"] == len(purged - deleted)
        tombstoned = deleted | purged
        _wait_tombstones(layout, len(deleted) + 1)

        times = LeaseTimes()
        with GatewayLoad(gateway, stream, subjects[:3], "C") as load:
            load.wait_for(publishes=5, acks=1)  # the load runs before the job starts
            started = time.monotonic()
            result["figures"] = job(spark, layout, times)
            result["job_seconds"] = time.monotonic() - started
        assert not load.errors, load.errors[:5]
        last = max(load.acked)
        _wait_flushed(layout, stream, last)

        api = _api_messages(client, stream, last)
    path = layout.stream_table(stream)
    rows = table_rows(path)
    seqs = [r[0] for r in rows]
    assert len(seqs) == len(set(seqs)), "a message is duplicated in the table"
    expected = {s: m for s, m in preloaded.items() if s not in tombstoned} | load.acked
    # Every acknowledged live message is in the table and the API, unchanged; nothing else is live.
    assert api == expected
    table_live = {s: (subj, d) for s, subj, d in rows if s not in tombstoned}
    assert table_live == expected
    # Publishes and acks kept succeeding while the job held the lease (how fast: bench/jobs.py's load phase).
    latencies = [end - start for start, end in load.publishes]
    during = [
        (start, end) for start, end in load.publishes
        if any(w0 <= start and end <= w1 for w0, w1 in times.windows)
    ]
    result.update(
        rows=rows, tombstoned=tombstoned, times=times, latencies=latencies, during_lease=len(during),
        published=len(load.acked), consumer_acks=load.consumer_acks, path=path, layout=layout,
    )
    assert times.count > 0 and times.max_held > 0
    assert load.acked and load.consumer_acks > 0
    return result


def test_retention_under_a_publish_and_ack_load(gateway: Gateway, spark: SparkSession) -> None:
    out = run_job_under_load(gateway, spark, lambda s, layout, times: retention.run(s, layout, lease_times=times))
    figures = out["figures"]
    assert figures["errors"] == 0 and figures["rows_deleted"] == len(out["tombstoned"])
    assert not {r[0] for r in out["rows"]} & out["tombstoned"], "a tombstoned message remains in the table"
    assert_both_writers_protocol(out["path"])
    print(
        f"\nretention under load: {figures} job {out['job_seconds']:.1f}s, {out['published']} publishes, "
        f"{out['during_lease']} during the lease, max latency {max(out['latencies']):.3f}s, "
        f"{out['consumer_acks']} consumer acks"
    )
