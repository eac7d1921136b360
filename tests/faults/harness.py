"""Load and checks shared by the fault-injection tests: what was answered OK must be stored exactly once.

`Load` publishes (JSON batches with message ids) and pulls and acknowledges through a real gateway,
recording every publish and ack the gateway answered OK and every answer that was not OK. `check_*`
read the Delta tables back with deltalake and the messages through the API after a restart.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.compute as pc
from deltalake import DeltaTable

from tests.gateway import Gateway

STREAM = "FAULTS"
CONSUMER = "C"
REFUSALS = {10023, 10077}  # insufficient resources; stream store failed


def create_stream(c: httpx.Client, name: str = STREAM, subjects: str = "faults.>", **config: Any) -> None:
    resp = c.post("/v1/streams", json={"name": name, "subjects": [subjects], **config})
    assert resp.status_code == 201, resp.text


def create_consumer(c: httpx.Client, stream: str = STREAM, name: str = CONSUMER) -> None:
    resp = c.post(f"/v1/streams/{stream}/consumers",
                  json={"durable_name": name, "ack_policy": "explicit", "ack_wait": 1_000_000_000})
    assert resp.status_code == 201, resp.text


@dataclass
class Load:
    """Publishers and an acknowledging consumer against one gateway, until `stop` (or the gateway dies)."""

    url: str
    publishers: int = 2
    consume: bool = True
    batch: int = 20
    max_batches: int = 150
    payload: int = 0  # bytes of incompressible padding after each message's id (Parquet shrinks repeats)
    acked: dict[str, int] = field(default_factory=dict)  # msg id -> seq, answered OK
    acks_ok: set[int] = field(default_factory=set)  # stream seqs whose ack was answered OK
    deletes: bool = True  # worker 0 deletes a message of every 4th batch (a tombstone)
    deleted: set[int] = field(default_factory=set)  # seqs whose delete was answered OK
    # seqs whose delete was sent and never answered (the gateway was killed meanwhile): either outcome
    # is right, and a message removed before its flush never reaches the table
    unanswered_deletes: set[int] = field(default_factory=set)
    generation: int = 0  # in message ids, so a load continued after a restart publishes new ones
    refused: list[dict[str, Any]] = field(default_factory=list)  # non-OK answers (ApiError bodies)
    unexpected: list[str] = field(default_factory=list)  # answers that are neither OK nor a 503 ApiError
    connection_errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        self._threads = [threading.Thread(target=self._publish, args=(w,)) for w in range(self.publishers)]
        if self.consume:
            self._threads.append(threading.Thread(target=self._consume))
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> Load:
        self._stop.set()
        return self.join()

    def restart(self, url: str) -> Load:
        """The same load against a restarted gateway, started: what was answered OK so far is kept."""
        self.stop()
        return dataclasses.replace(
            self, url=url, generation=self.generation + 1, connection_errors=0,
            _stop=threading.Event(), _lock=threading.Lock(), _threads=[],
        ).start()

    def join(self) -> Load:
        """Waits for the publishers (and consumer) to end: `max_batches` each, or `stop`."""
        for t in self._threads:
            t.join(timeout=60)
        return self

    def wait(self, published: int, timeout: float = 20.0) -> None:
        """Until `published` messages are acknowledged (or the load ended, or the deadline passed)."""
        deadline = time.monotonic() + timeout
        while len(self.acked) < published and time.monotonic() < deadline and any(t.is_alive() for t in self._threads):
            time.sleep(0.02)

    def _answer(self, resp: httpx.Response) -> bool:
        """True for a 200; records a 503 ApiError as refused and anything else as unexpected."""
        if resp.status_code == 200:
            return True
        try:
            error = resp.json()["error"]
            refused = resp.status_code == 503 and error["code"] == 503 and error["err_code"] in REFUSALS
        except (ValueError, KeyError, TypeError):
            refused = False
        with self._lock:
            if refused:
                self.refused.append(resp.json())
            else:
                self.unexpected.append(f"{resp.status_code} {resp.text[:300]}")
        return False

    def _publish(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=10.0) as client:
            for n in range(self.max_batches):
                if self._stop.is_set():
                    return
                ids = [f"w{worker}-g{self.generation}-{n}-{i}" for i in range(self.batch)]
                body = {"messages": [
                    {"subject": f"faults.{worker}.{i % 5}", "text": msg_id + _padding(self.payload),
                     "headers": {"Nats-Msg-Id": [msg_id]}}
                    for i, msg_id in enumerate(ids)
                ]}
                try:
                    resp = client.post("/v1/publish", json=body)
                except httpx.HTTPError:
                    self.connection_errors += 1
                    return
                if not self._answer(resp):
                    time.sleep(0.02)
                    continue
                with self._lock:
                    for msg_id, ack in zip(ids, resp.json()["acks"], strict=True):
                        if "seq" in ack:
                            self.acked[msg_id] = ack["seq"]
                        else:
                            self.refused.append(ack)
                if self.deletes and worker == 0 and n % 4 == 0 and ids[0] in self.acked:
                    self._delete(client, self.acked[ids[0]])

    def _delete(self, client: httpx.Client, seq: int) -> None:
        with self._lock:
            self.unanswered_deletes.add(seq)
        try:
            resp = client.delete(f"/v1/streams/{STREAM}/messages/{seq}", params={"no_erase": "true"})
        except httpx.HTTPError:
            self.connection_errors += 1
            return
        answered = self._answer(resp)
        with self._lock:
            self.unanswered_deletes.discard(seq)
            if answered:
                self.deleted.add(seq)

    def _consume(self) -> None:
        path = f"/v1/streams/{STREAM}/consumers/{CONSUMER}"
        with httpx.Client(base_url=self.url, timeout=10.0) as client:
            while not self._stop.is_set():
                try:
                    resp = client.post(f"{path}/next", json={"batch": 50, "no_wait": True})
                    if not self._answer(resp):
                        time.sleep(0.02)
                        continue
                    seqs = [m["seq"] for m in resp.json()["messages"]]
                    if not seqs:
                        time.sleep(0.01)
                        continue
                    resp = client.post(f"{path}/ack", json={"acks": [{"seqs": seqs, "type": "ack"}]})
                except httpx.HTTPError:
                    self.connection_errors += 1
                    return
                if self._answer(resp) and resp.json()["results"] == [{"ok": True}]:
                    with self._lock:
                        self.acks_ok.update(seqs)


def stream_id(warehouse: Path, stream: str = STREAM) -> str:
    record = orjson.loads((warehouse / "default" / "_system" / "streams" / f"{stream}.json").read_bytes())
    return str(record["stream_id"])


def table_rows(warehouse: Path, stream: str = STREAM) -> dict[int, str | None]:
    """seq -> msg id of every row of the stream's table; fails if a sequence is there twice."""
    table = DeltaTable(str(warehouse / "default" / "streams" / stream)).to_pyarrow_table(columns=["seq", "msg_id"])
    seqs = table.column("seq").to_pylist()
    twice = [s for s, n in Counter(seqs).items() if n > 1]
    assert not twice, f"sequences stored twice in the table: {twice[:10]}"
    return dict(zip(seqs, table.column("msg_id").to_pylist(), strict=True))


def ack_events(warehouse: Path) -> tuple[Counter[int], set[int]]:
    """How many `ack` rows the ack table holds per stream sequence of the consumer, and the sequences
    its latest snapshot row settles (acked before it: at most its delivered sequence, not pending).
    A snapshot folds the rows before it away (they are deleted from the table)."""
    table = DeltaTable(str(warehouse / "default" / "_system" / "acks")).to_pyarrow_table(
        columns=["event_seq", "consumer", "kind", "stream_seq", "state"])
    table = table.filter(pc.equal(table.column("consumer"), CONSUMER)).sort_by("event_seq")
    acks = table.filter(pc.equal(table.column("kind"), "ack"))
    snapshots = table.filter(pc.equal(table.column("kind"), "snapshot")).column("state").to_pylist()
    settled: set[int] = set()
    if snapshots:
        state = orjson.loads(snapshots[-1])
        pending = {p[0] for p in state["pending"]}
        settled = set(range(1, state["delivered"][1] + 1)) - pending
    return Counter(acks.column("stream_seq").to_pylist()), settled


def flush(c: httpx.Client, timeout: float = 20.0) -> dict[str, Any]:
    """`POST /v1/flush` until it commits everything (a restarted gateway may still be healing)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = c.post("/v1/flush")
        if resp.status_code == 200 or time.monotonic() > deadline:
            assert resp.status_code == 200, resp.text
            return resp.json()  # type: ignore[no-any-return]
        time.sleep(0.1)


def check_restart(warehouse: Path, load: Load, *args: str) -> Gateway:
    """Restarts a gateway (no failpoints) on the warehouse, flushes, and checks that every publish and
    ack answered OK is stored exactly once, that no sequence was given twice, and that the stream
    serves and takes writes. Returns the running gateway (the caller stops it)."""
    gw = Gateway(warehouse, "--flush-interval", "0.2", *args).start()
    try:
        with gw.client() as c:
            flush(c)
            rows = table_rows(warehouse)
            for msg_id, seq in load.acked.items():
                stored = rows.get(seq)
                if seq not in load.deleted and not (stored is None and seq in load.unanswered_deletes):
                    assert stored == msg_id, f"acknowledged {msg_id} (seq {seq}) is {stored!r} in the table"
            state = c.get(f"/v1/streams/{STREAM}").json()["state"]
            assert state["last_seq"] >= max(load.acked.values(), default=0)
            for msg_id, seq in [(m, s) for m, s in load.acked.items() if s not in load.unanswered_deletes][::23]:
                resp = c.get(f"/v1/streams/{STREAM}/messages/{seq}")
                if seq in load.deleted:
                    assert resp.status_code == 404, f"deleted seq {seq} is back"
                else:
                    assert resp.json()["message"]["headers"]["Nats-Msg-Id"] == [msg_id]
            check_tombstones(warehouse, load.deleted)
            fresh = c.post("/v1/publish/faults.fresh", content=b"after restart")
            assert fresh.status_code == 200, fresh.text
            assert fresh.json()["seq"] == state["last_seq"] + 1, "a sequence is given twice"
            if load.consume:
                check_acks(warehouse, c, load)
    except BaseException:
        gw.stop()
        raise
    return gw


def check_tombstones(warehouse: Path, deleted: set[int]) -> None:
    """Every delete answered OK is one tombstone row of the stream, not two."""
    table = DeltaTable(str(warehouse / "default" / "_system" / "tombstones")).to_pyarrow_table(
        columns=["stream_id", "first_seq", "last_seq"])
    table = table.filter(pc.equal(table.column("stream_id"), stream_id(warehouse)))
    covered: Counter[int] = Counter()
    for first, last in zip(table.column("first_seq").to_pylist(), table.column("last_seq").to_pylist(), strict=True):
        covered.update(range(first, last + 1))
    assert not [s for s in deleted if covered[s] != 1], {s: covered[s] for s in deleted if covered[s] != 1}


def check_acks(warehouse: Path, c: httpx.Client, load: Load) -> None:
    """Every ack answered OK is in the ack table exactly once, and its message is not delivered again."""
    info = c.get(f"/v1/streams/{STREAM}/consumers/{CONSUMER}").json()
    events, settled = ack_events(warehouse)
    missing = sorted(load.acks_ok - set(events) - settled)
    assert not missing, f"acks answered OK but not in the ack table: {missing[:10]}"
    twice = sorted(s for s in load.acks_ok if events[s] > 1)
    assert not twice, f"acks stored twice: {twice[:10]}"
    assert info["ack_floor"]["stream_seq"] <= info["delivered"]["stream_seq"]
    deadline = time.monotonic() + 1.5  # past ack_wait (1 s): whatever is unacknowledged comes again, acked ones never
    again: set[int] = set()
    while time.monotonic() < deadline:
        resp = c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/next", json={"batch": 500, "no_wait": True})
        assert resp.status_code == 200, resp.text
        again.update(m["seq"] for m in resp.json()["messages"])
        time.sleep(0.2)
    assert not (again & load.acks_ok), f"acknowledged messages delivered again: {sorted(again & load.acks_ok)[:10]}"


def _padding(size: int) -> str:
    return os.urandom((size + 1) // 2).hex()[:size]
