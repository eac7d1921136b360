"""Kill -9 during a consume-and-ack load: no acked message comes back, every unacked one does."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.gateway import Gateway

STREAM, CONSUMER, TOTAL = "WORK", "C", 3000
ACK_WAIT = 1_500_000_000
NS = 1_000_000_000


def _setup(c: httpx.Client) -> None:
    assert c.post("/v1/streams", json={"name": STREAM, "subjects": ["work.>"]}).status_code == 201
    config = {"durable_name": CONSUMER, "ack_policy": "explicit", "ack_wait": ACK_WAIT, "max_deliver": 10}
    assert c.post(f"/v1/streams/{STREAM}/consumers", json=config).status_code == 201
    for start in range(0, TOTAL, 500):
        msgs = [{"subject": f"work.{i % 5}", "text": str(i)} for i in range(start, start + 500)]
        assert all("seq" in a for a in c.post("/v1/publish", json={"messages": msgs}).json()["acks"])


def _consume(url: str, stop: threading.Event, acked: set[int], lock: threading.Lock, unanswered: set[int]) -> None:
    """Fetches and acks until stopped; `unanswered` gets the batch whose ack got no answer (the kill may have
    come after the ack was durable and before its answer: the server may rightly never deliver it again)."""
    with httpx.Client(base_url=url, timeout=5.0) as c:
        while not stop.is_set():
            msgs = []
            try:
                got = c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/next", json={"batch": 40, "expires": 200_000_000})
                msgs = got.json()["messages"]
                answer = c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/ack",
                                json={"acks": [{"token": m["ack"]} for m in msgs]}) if msgs else None
            except httpx.HTTPError:
                with lock:
                    unanswered.update(m["seq"] for m in msgs)
                return
            if answer is not None and answer.status_code == 200:
                with lock:
                    acked.update(m["seq"] for m, r in zip(msgs, answer.json()["results"], strict=True) if r.get("ok"))


def _info(c: httpx.Client, stream: str = STREAM, consumer: str = CONSUMER) -> dict[str, object]:
    info = c.get(f"/v1/streams/{stream}/consumers/{consumer}").json()
    return {k: info[k] for k in ("delivered", "ack_floor", "num_ack_pending", "num_redelivered", "num_pending")}


def test_kill9_during_consume_and_ack(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "0.3").start()
    acked: set[int] = set()
    unanswered: set[int] = set()
    lock = threading.Lock()
    try:
        with gw.client() as c:
            _setup(c)
            # A second consumer has message 1 delivered twice before the kill: its count must survive.
            twice = {"durable_name": "TWICE", "ack_policy": "explicit", "ack_wait": ACK_WAIT}
            assert c.post(f"/v1/streams/{STREAM}/consumers", json=twice).status_code == 201
            first = c.post(f"/v1/streams/{STREAM}/consumers/TWICE/next", json={"batch": 1}).json()["messages"][0]
            c.post(f"/v1/streams/{STREAM}/consumers/TWICE/ack", json={"acks": [{"token": first["ack"], "type": "nak"}]})
            again = c.post(f"/v1/streams/{STREAM}/consumers/TWICE/next", json={"batch": 1}).json()["messages"][0]
            due = time.monotonic() + ACK_WAIT / NS  # its redelivery, whatever the kill and restart take
            assert (again["seq"], again["num_delivered"]) == (1, 2)
        stop = threading.Event()
        workers = [threading.Thread(target=_consume, args=(gw.url, stop, acked, lock, unanswered)) for _ in range(3)]
        for t in workers:
            t.start()
        deadline = time.monotonic() + 30
        while len(acked) < 300:
            assert time.monotonic() < deadline and all(t.is_alive() for t in workers), f"{len(acked)} acked"
            time.sleep(0.01)
        assert all(t.is_alive() for t in workers), "the consumers run at the kill"
        gw.kill9()
        stop.set()
        for t in workers:
            t.join(timeout=10)
    finally:
        gw.stop()
    assert 0 < len(acked) < TOTAL

    gw = Gateway(warehouse, "--flush-interval", "0.3").start()
    try:
        with gw.client() as c:
            before = _info(c)
            # Acks answered OK are in the state (acks applied but cut off before their answer may be too).
            assert before["num_ack_pending"] + before["num_pending"] <= TOTAL - len(acked)  # type: ignore[operator]
            deadline = time.monotonic() + 30
            while _info(c)["num_ack_pending"] or _info(c)["num_pending"]:
                assert time.monotonic() < deadline, f"{TOTAL - len(acked)} messages were not delivered again"
                msgs = c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/next",
                              json={"batch": 200, "expires": 300_000_000}).json()["messages"]
                assert not {m["seq"] for m in msgs} & acked, "an acknowledged message was delivered again"
                results = c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/ack",
                                 json={"acks": [{"token": m["ack"]} for m in msgs]}).json()["results"] if msgs else []
                assert results == [{"ok": True}] * len(msgs)
                acked.update(m["seq"] for m in msgs)
            # Every message was acked by an answered ack, or its ack was cut off by the kill after it was durable.
            assert set(range(1, TOTAL + 1)) - acked <= unanswered, "every unacknowledged message was delivered again"
            final = _info(c)
            assert final["num_ack_pending"] == 0 and final["num_pending"] == 0
            assert final["ack_floor"]["stream_seq"] == TOTAL  # type: ignore[index]
            time.sleep(max(0.0, due + 0.2 - time.monotonic()))  # before it, a pull takes message 2, rightly
            redelivered = c.post(f"/v1/streams/{STREAM}/consumers/TWICE/next", json={"batch": 1, "expires": 10 * NS})
            assert [(m["seq"], m["num_delivered"]) for m in redelivered.json()["messages"]] == [(1, 3)], (
                "the delivery count survived the kill"
            )
    finally:
        gw.stop()


def test_consumer_info_is_the_same_after_a_kill(warehouse: Path) -> None:
    gw = Gateway(warehouse, "--flush-interval", "5").start()
    try:
        with gw.client() as c:
            _setup(c)
            for _ in range(3):
                msgs = c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/next", json={"batch": 30}).json()["messages"]
                c.post(f"/v1/streams/{STREAM}/consumers/{CONSUMER}/ack",
                       json={"acks": [{"token": m["ack"], "type": "ack" if m["seq"] % 3 else "nak"} for m in msgs]})
            before = _info(c)
        gw.kill9()
    finally:
        gw.stop()
    gw = Gateway(warehouse).start()
    try:
        with gw.client() as c:
            assert _info(c) == before
    finally:
        gw.stop()


def test_acks_after_consumers_left_the_ack_table_survive_a_kill(warehouse: Path) -> None:
    """The ack log's event numbering stays above the table's app transaction after consumers' rows are
    deleted from it (one deleted, one ephemeral expired): an event numbered at or below it would be
    taken for flushed on replay and dropped, and its ack answered OK lost."""
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": "LEFT", "subjects": ["left.>"]}).status_code == 201
            gone = [
                {"durable_name": "GONE", "ack_policy": "explicit"},
                {"ack_policy": "explicit", "inactive_threshold": NS // 5},
            ]
            names = [c.post("/v1/streams/LEFT/consumers", json=config).json()["name"] for config in gone]
            stay = {"durable_name": "STAY", "ack_policy": "explicit"}
            assert c.post("/v1/streams/LEFT/consumers", json=stay).status_code == 201
            assert all("seq" in a for a in c.post("/v1/publish", json={"messages": [{"subject": "left.a"}] * 20}).json()["acks"])
            for name in names:
                _consume_and_ack(c, "LEFT", name, 20)
            assert c.post("/v1/flush").json()["commits"] >= 1, "the 80 events are in the ack table"
            assert c.delete("/v1/streams/LEFT/consumers/GONE").json() == {"success": True}
            deadline = time.monotonic() + 10
            while c.get(f"/v1/streams/LEFT/consumers/{names[1]}").status_code != 404:
                assert time.monotonic() < deadline, "the ephemeral consumer did not expire"
                c.post("/v1/flush")  # the flusher's tick removes inactive consumers
            c.post("/v1/flush")  # deletes the removed consumers' rows from the ack table
    finally:
        gw.stop()
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            _consume_and_ack(c, "LEFT", "STAY", 20)
            before = _info(c, "LEFT", "STAY")
            assert before["ack_floor"]["stream_seq"] == 20 and before["num_ack_pending"] == 0  # type: ignore[index]
        gw.kill9()
    finally:
        gw.stop()
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            assert _info(c, "LEFT", "STAY") == before, "every ack answered OK before the kill is there"
            assert c.post("/v1/streams/LEFT/consumers/STAY/next", json={"batch": 20, "no_wait": True}).json()["messages"] == []
    finally:
        gw.stop()


def _consume_and_ack(c: httpx.Client, stream: str, consumer: str, n: int) -> None:
    msgs = c.post(f"/v1/streams/{stream}/consumers/{consumer}/next", json={"batch": n, "no_wait": True}).json()["messages"]
    assert len(msgs) == n
    results = c.post(f"/v1/streams/{stream}/consumers/{consumer}/ack", json={"acks": [{"token": m["ack"]} for m in msgs]})
    assert results.json()["results"] == [{"ok": True}] * n


def test_interest_and_workqueue_removals_survive_a_kill(warehouse: Path) -> None:
    """Messages removed by acks (work queue) or by the last interested consumer's ack (interest), and
    ones an interest stream never kept, stay removed after kill -9: some were committed to the table
    before the kill, the rest only logged."""
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            for name, retention in (("WQ", "workqueue"), ("INT", "interest")):
                config = {"name": name, "subjects": [f"{name.lower()}.>"], "retention": retention}
                assert c.post("/v1/streams", json=config).status_code == 201
            assert c.post("/v1/publish/int.a", content=b"nobody listens").json()["seq"] == 1
            for consumer, stream in (("W", "WQ"), ("A", "INT"), ("B", "INT")):
                config = {"durable_name": consumer, "ack_policy": "explicit"}
                assert c.post(f"/v1/streams/{stream}/consumers", json=config).status_code == 201
            for stream in ("WQ", "INT"):
                acks = c.post("/v1/publish", json={"messages": [{"subject": f"{stream.lower()}.a"}] * 20}).json()["acks"]
                assert all("seq" in a for a in acks)
            _consume_and_ack_seqs(c, "WQ", "W", [1, 2, 3, 4, 5])
            _consume_and_ack_seqs(c, "INT", "A", list(range(2, 22)))
            _consume_and_ack_seqs(c, "INT", "B", [2, 3, 4])
            assert c.post("/v1/flush").json()["commits"] >= 1  # these removals reach the tables
            _consume_and_ack_seqs(c, "WQ", "W", [6, 7, 8])  # these only the log
            _consume_and_ack_seqs(c, "INT", "B", [5, 6])
            before = {s: _state(c, s) for s in ("WQ", "INT")}
            assert before["WQ"] == {"messages": 12, "first_seq": 9, "last_seq": 20}
            assert before["INT"] == {"messages": 15, "first_seq": 7, "last_seq": 21}
        gw.kill9()
    finally:
        gw.stop()
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            assert {s: _state(c, s) for s in ("WQ", "INT")} == before
            for stream, gone in (("WQ", range(1, 9)), ("INT", range(1, 7))):
                for seq in gone:
                    assert c.get(f"/v1/streams/{stream}/messages/{seq}").status_code == 404, (stream, seq)
            wq = c.post("/v1/streams/WQ/consumers/W/next", json={"batch": 20, "no_wait": True}).json()["messages"]
            assert [m["seq"] for m in wq] == list(range(9, 21)), "only the unacknowledged work is delivered"
            b = c.post("/v1/streams/INT/consumers/B/next", json={"batch": 20, "no_wait": True}).json()["messages"]
            assert [m["seq"] for m in b] == list(range(7, 22))
    finally:
        gw.stop()


def _consume_and_ack_seqs(c: httpx.Client, stream: str, consumer: str, seqs: list[int]) -> None:
    """Pulls exactly `seqs` (the next ones the consumer has) and acks them."""
    pull = {"batch": len(seqs), "no_wait": True}
    msgs = c.post(f"/v1/streams/{stream}/consumers/{consumer}/next", json=pull).json()["messages"]
    assert [m["seq"] for m in msgs] == seqs
    answer = c.post(f"/v1/streams/{stream}/consumers/{consumer}/ack", json={"acks": [{"token": m["ack"]} for m in msgs]})
    assert answer.json()["results"] == [{"ok": True}] * len(seqs)


def _state(c: httpx.Client, stream: str) -> dict[str, int]:
    state = c.get(f"/v1/streams/{stream}").json()["state"]
    return {k: state[k] for k in ("messages", "first_seq", "last_seq")}
