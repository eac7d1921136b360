"""Consumers, pulls and acks through a real gateway, against hand-computed JetStream values.

One gateway (a real `jetlake serve` on loopback) serves the module; each test makes its own stream
`S<n>` capturing `s<n>.>` and its consumers. Nothing here is timed: how long pulls wait (no_wait, a
partial batch, a wake-up by a publish) is measured by bench/consume.py (`wait_*`).
"""

from __future__ import annotations

import base64
import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway import Gateway

NS = 1_000_000_000
_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    warehouse: Path = tmp_path_factory.mktemp("consumers-api") / "warehouse"
    warehouse.mkdir()
    gateway = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        yield gateway
    finally:
        gateway.stop()


@pytest.fixture
def c(gw: Gateway) -> Iterator[httpx.Client]:
    with gw.client() as client:
        yield client


def new_stream(c: httpx.Client, **config: Any) -> tuple[str, str]:
    """Creates `S<n>` on `s<n>.>`; returns (name, subject prefix)."""
    n = next(_numbers)
    name, prefix = f"S{n}", f"s{n}"
    resp = c.post("/v1/streams", json={"name": name, "subjects": [f"{prefix}.>"], **config})
    assert resp.status_code == 201, resp.text
    return name, prefix


def new_consumer(c: httpx.Client, stream: str, name: str = "C", **config: Any) -> dict[str, Any]:
    resp = c.post(f"/v1/streams/{stream}/consumers", json={"durable_name": name, **config})
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


def pub(c: httpx.Client, subject: str, data: bytes = b"x", **headers: str) -> int:
    resp = c.post(f"/v1/publish/{subject}", content=data, headers={k.replace("_", "-"): v for k, v in headers.items()})
    assert resp.status_code == 200, resp.text
    return int(resp.json()["seq"])


def nxt(c: httpx.Client, stream: str, consumer: str = "C", **body: Any) -> list[dict[str, Any]]:
    resp = c.post(f"/v1/streams/{stream}/consumers/{consumer}/next", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()["messages"]  # type: ignore[no-any-return]


def now(c: httpx.Client, stream: str, consumer: str = "C", batch: int = 10, **body: Any) -> list[dict[str, Any]]:
    return nxt(c, stream, consumer, batch=batch, no_wait=True, **body)


def acks(c: httpx.Client, stream: str, items: list[dict[str, Any]], consumer: str = "C") -> list[dict[str, Any]]:
    resp = c.post(f"/v1/streams/{stream}/consumers/{consumer}/ack", json={"acks": items})
    assert resp.status_code == 200, resp.text
    return resp.json()["results"]  # type: ignore[no-any-return]


def info(c: httpx.Client, stream: str, consumer: str = "C") -> dict[str, Any]:
    resp = c.get(f"/v1/streams/{stream}/consumers/{consumer}")
    assert resp.status_code == 200, resp.text
    return resp.json()  # type: ignore[no-any-return]


def figures(c: httpx.Client, stream: str, consumer: str = "C") -> dict[str, Any]:
    i = info(c, stream, consumer)
    return {
        "delivered": (i["delivered"]["consumer_seq"], i["delivered"]["stream_seq"]),
        "ack_floor": (i["ack_floor"]["consumer_seq"], i["ack_floor"]["stream_seq"]),
        "num_ack_pending": i["num_ack_pending"],
        "num_redelivered": i["num_redelivered"],
        "num_waiting": i["num_waiting"],
        "num_pending": i["num_pending"],
    }


def want(delivered: tuple[int, int], ack_floor: tuple[int, int], ack_pending: int = 0, redelivered: int = 0, pending: int = 0, waiting: int = 0) -> dict[str, Any]:
    return {
        "delivered": delivered,
        "ack_floor": ack_floor,
        "num_ack_pending": ack_pending,
        "num_redelivered": redelivered,
        "num_waiting": waiting,
        "num_pending": pending,
    }


def error(resp: httpx.Response, status: int, err_code: int) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert (body["code"], body["err_code"]) == (status, err_code), body
    assert body["description"]


def is_error(result: dict[str, Any], err_code: int = 10003) -> None:
    """A per-ack error (nats-server answers no error to an ack: JetLake's is a bad request)."""
    assert set(result) == {"error"}, result
    e = result["error"]
    assert (e["code"], e["err_code"]) == (400, err_code) and e["description"], e


# -- lifecycle ----------------------------------------------------------------------------------


def test_create_info_list_update_delete(c: httpx.Client) -> None:
    s, _ = new_stream(c)
    base = f"/v1/streams/{s}/consumers"
    created = new_consumer(c, s, ack_policy="explicit")
    assert (created["stream_name"], created["name"], created["config"]["ack_wait"]) == (s, "C", 30 * NS)
    again = c.post(base, json={"durable_name": "C", "ack_policy": "explicit"})
    assert again.status_code == 200 and again.json()["created"] == created["created"]
    error(c.post(base, json={"durable_name": "C", "ack_policy": "all"}), 400, 10148)
    assert figures(c, s) == want((0, 0), (0, 0))
    named = c.post(base, json={"name": "N"})
    assert named.status_code == 201 and named.json()["config"]["ack_policy"] == "none"
    listing = c.get(base).json()
    assert (listing["total"], [x["name"] for x in listing["consumers"]]) == (2, ["C", "N"])
    updated = c.put(f"{base}/C", json={"durable_name": "C", "ack_policy": "explicit", "max_ack_pending": 7})
    assert updated.status_code == 200 and updated.json()["config"]["max_ack_pending"] == 7
    error(c.put(f"{base}/C", json={"durable_name": "C", "ack_policy": "none"}), 400, 10012)
    assert c.delete(f"{base}/C").json() == {"success": True}
    error(c.get(f"{base}/C"), 404, 10014)
    error(c.post(f"{base}/C/next", json={"no_wait": True}), 404, 10014)
    error(c.delete(f"{base}/C"), 404, 10014)


def test_update_with_another_name_in_the_body_is_refused(c: httpx.Client) -> None:
    s, _ = new_stream(c)
    new_consumer(c, s)
    error(c.put(f"/v1/streams/{s}/consumers/C", json={"durable_name": "X"}), 400, 10017)
    assert info(c, s)["config"]["durable_name"] == "C"
    assert [x["name"] for x in c.get(f"/v1/streams/{s}/consumers").json()["consumers"]] == ["C"]


def test_ephemeral_gets_a_name_and_the_default_threshold(c: httpx.Client) -> None:
    s, _ = new_stream(c)
    resp = c.post(f"/v1/streams/{s}/consumers", json={"ack_policy": "explicit"})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert len(body["name"]) == 8 and body["config"]["inactive_threshold"] == 5 * NS
    assert info(c, s, body["name"])["name"] == body["name"]


def test_max_consumers(c: httpx.Client) -> None:
    s, _ = new_stream(c, max_consumers=1)
    new_consumer(c, s, "A")
    error(c.post(f"/v1/streams/{s}/consumers", json={"durable_name": "B"}), 400, 10026)


# -- pulls --------------------------------------------------------------------------------------


def test_no_wait_answers_without_waiting_for_expires(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    # Waiting for its 60 s would outlast the client's 30 s timeout.
    assert nxt(c, s, no_wait=True, expires=60 * NS) == []
    pub(c, f"{p}.a", b"hello", Nats_Msg_Id="m1")
    [m] = nxt(c, s, no_wait=True, expires=60 * NS)
    assert (m["subject"], m["seq"], base64.b64decode(m["data"]), m["headers"]) == (f"{p}.a", 1, b"hello", {"Nats-Msg-Id": ["m1"]})
    assert (m["consumer_seq"], m["num_delivered"], m["num_pending"], isinstance(m["ack"], str)) == (1, 1, 0, True)
    assert figures(c, s) == want((1, 1), (0, 0), ack_pending=1)


def _wait_until_waiting(c: httpx.Client, stream: str, n: int = 1) -> None:
    deadline = time.monotonic() + 10
    while figures(c, stream)["num_waiting"] != n:
        assert time.monotonic() < deadline, "the pull is not waiting"
        time.sleep(0.02)


def test_long_poll_is_woken_by_a_publish(gw: Gateway, c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    got: list[Any] = []

    def wait() -> None:
        with gw.client() as other:
            got.extend(nxt(other, s, batch=1, expires=20 * NS))

    puller = threading.Thread(target=wait)
    puller.start()
    _wait_until_waiting(c, s)
    assert figures(c, s) == want((0, 0), (0, 0), waiting=1)
    pub(c, f"{p}.a")
    puller.join(30)
    assert not puller.is_alive()
    assert [m["seq"] for m in got] == [1]
    assert figures(c, s) == want((1, 1), (0, 0), ack_pending=1)


def test_batch_and_expires(gw: Gateway, c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    for _ in range(3):
        pub(c, f"{p}.a")
    assert [m["seq"] for m in nxt(c, s, batch=2, expires=20 * NS)] == [1, 2], "a full batch answers before expires"
    got: list[Any] = []

    def partial() -> None:
        with gw.client() as other:
            got.extend(nxt(other, s, batch=3, expires=20 * NS))

    puller = threading.Thread(target=partial)
    puller.start()
    _wait_until_waiting(c, s)
    pub(c, f"{p}.a")  # a partial batch keeps waiting: this one joins it
    pub(c, f"{p}.a")
    puller.join(30)
    assert [m["seq"] for m in got] == [3, 4, 5], "the batch filled while it waited"
    assert nxt(c, s, batch=5, expires=NS // 5) == [], "an empty pull ends at its expires"
    assert figures(c, s) == want((5, 5), (0, 0), ack_pending=5)


def test_max_bytes_with_no_wait(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    for _ in range(5):
        pub(c, f"{p}.a", b"x" * 100)
    got = now(c, s, batch=10, max_bytes=250)
    assert [m["seq"] for m in got] == [1, 2], "a message costs more than its 100 bytes of data: two fit in 250"


def test_max_bytes_holds_for_a_waiting_pull(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    for _ in range(5):
        pub(c, f"{p}.a", b"x" * 100)
    got = nxt(c, s, batch=10, max_bytes=250, expires=NS // 2)
    assert sum(len(base64.b64decode(m["data"])) for m in got) <= 250
    assert [m["seq"] for m in got] == [1, 2]


def test_two_pullers_never_get_the_same_message(gw: Gateway, c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    resp = c.post("/v1/publish", json={"messages": [{"subject": f"{p}.a", "text": str(i)} for i in range(200)]})
    assert resp.status_code == 200
    seen: list[list[int]] = [[], []]

    def work(mine: list[int]) -> None:
        with gw.client() as other:
            while batch := now(other, s, batch=7):
                mine.extend(m["seq"] for m in batch)
                assert all(r == {"ok": True} for r in acks(other, s, [{"token": m["ack"]} for m in batch]))

    threads = [threading.Thread(target=work, args=(mine,)) for mine in seen]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(1, 201))
    assert figures(c, s) == want((200, 200), (200, 200))


def test_deleted_and_purged_messages_are_never_delivered(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    for sub in ("a", "b", "a", "b", "a"):
        pub(c, f"{p}.{sub}")
    assert c.delete(f"/v1/streams/{s}/messages/1").status_code == 200
    assert c.post(f"/v1/streams/{s}/purge", json={"filter": f"{p}.b"}).json() == {"success": True, "purged": 2}
    assert figures(c, s)["num_pending"] == 2
    assert [m["seq"] for m in now(c, s)] == [3, 5]


def test_headers_only(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, headers_only=True)
    pub(c, f"{p}.a", b"hello", Nats_Color="blue")
    [m] = now(c, s)
    assert m["data"] == ""
    assert m["headers"] == {"Nats-Color": ["blue"], "Nats-Msg-Size": ["5"]}


# -- acks ---------------------------------------------------------------------------------------


def test_acks_by_token_and_by_seq(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    for _ in range(4):
        pub(c, f"{p}.a")
    got = now(c, s, batch=3)
    assert acks(c, s, [{"token": got[1]["ack"]}, {"seq": 1, "type": "ack"}]) == [{"ok": True}, {"ok": True}]
    assert figures(c, s) == want((3, 3), (2, 2), ack_pending=1, pending=1)
    assert acks(c, s, [{"token": got[2]["ack"], "type": "nak"}]) == [{"ok": True}]
    [again] = now(c, s, batch=1)
    assert (again["seq"], again["consumer_seq"], again["num_delivered"]) == (3, 4, 2)
    assert figures(c, s) == want((4, 3), (2, 2), ack_pending=1, redelivered=1, pending=1)
    assert acks(c, s, [{"seq": 3, "type": "term", "reason": "bad"}]) == [{"ok": True}]
    assert figures(c, s) == want((4, 3), (4, 3), pending=1)


def test_bad_acks_are_per_ack_errors_and_change_nothing(c: httpx.Client) -> None:
    s, p = new_stream(c)
    new_consumer(c, s, ack_policy="explicit")
    new_consumer(c, s, "OTHER", ack_policy="explicit")
    new_consumer(c, s, "NONE", ack_policy="none")
    for _ in range(3):
        pub(c, f"{p}.a")
    mine = now(c, s, batch=2)
    theirs = now(c, s, "OTHER", batch=1)
    none = now(c, s, "NONE", batch=1)
    assert acks(c, s, [{"token": mine[0]["ack"]}]) == [{"ok": True}]
    before = figures(c, s)
    assert before == want((2, 2), (1, 1), ack_pending=1, pending=1)
    results = acks(c, s, [
        {"token": mine[0]["ack"]},  # stale: already acked
        {"token": "not-a-token"},
        {"token": theirs[0]["ack"]},
        {"seq": 3},  # not delivered yet
        {"token": mine[1]["ack"], "type": "bogus"},
        {"token": mine[1]["ack"]},  # the one good ack, after the bad ones
    ])
    for result in results[:5]:
        is_error(result)
    assert results[5] == {"ok": True}
    assert figures(c, s) == want((2, 2), (2, 2), pending=1)
    assert figures(c, s, "OTHER") == want((1, 1), (0, 0), ack_pending=1, pending=2)
    is_error(acks(c, s, [{"token": none[0]["ack"]}], "NONE")[0])
    assert figures(c, s, "NONE") == want((1, 1), (1, 1), pending=2)


# -- retention ----------------------------------------------------------------------------------


def test_workqueue_through_the_api(c: httpx.Client) -> None:
    s, p = new_stream(c, retention="workqueue")
    new_consumer(c, s, "A", ack_policy="explicit", filter_subject=f"{p}.a")
    error(c.post(f"/v1/streams/{s}/consumers", json={"durable_name": "B", "ack_policy": "explicit", "filter_subject": f"{p}.*"}), 400, 10100)
    error(c.post(f"/v1/streams/{s}/consumers", json={"durable_name": "B", "ack_policy": "explicit"}), 400, 10099)
    pub(c, f"{p}.a")
    pub(c, f"{p}.a")
    got = now(c, s, "A")
    assert acks(c, s, [{"token": got[0]["ack"]}], "A") == [{"ok": True}]
    error(c.get(f"/v1/streams/{s}/messages/1"), 404, 10037)
    assert c.get(f"/v1/streams/{s}").json()["state"]["messages"] == 1


def test_interest_through_the_api(c: httpx.Client) -> None:
    s, p = new_stream(c, retention="interest")
    assert pub(c, f"{p}.a") == 1
    assert c.get(f"/v1/streams/{s}").json()["state"]["messages"] == 0
    new_consumer(c, s, "A", ack_policy="explicit")
    new_consumer(c, s, "B", ack_policy="explicit")
    assert pub(c, f"{p}.a") == 2
    assert acks(c, s, [{"token": now(c, s, "A")[0]["ack"]}], "A") == [{"ok": True}]
    assert c.get(f"/v1/streams/{s}").json()["state"]["messages"] == 1, "B still needs it"
    assert c.delete(f"/v1/streams/{s}/consumers/B").status_code == 200
    assert c.get(f"/v1/streams/{s}").json()["state"]["messages"] == 0
