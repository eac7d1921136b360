"""The fast consume path through a real gateway: binary `next` answers and `seqs` ack items.

Both are extensions of JetLake's (see API.md); each test checks what the JSON forms give for the
same messages, that ConsumerInfo stays exact, and that a malformed body changes nothing.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.http.delivered_batch import MEDIA_TYPE, decode
from tests.gateway import Gateway

NS = 1_000_000_000
BINARY = {"Accept": MEDIA_TYPE}
_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    warehouse: Path = tmp_path_factory.mktemp("consume-batches") / "warehouse"
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


def setup(c: httpx.Client, n: int, **consumer: Any) -> tuple[str, str]:
    """A stream `B<k>` on `b<k>.>` with `n` messages (`m<i>` on `b<k>.<i % 2>`) and durable `C`."""
    k = next(_numbers)
    stream, prefix = f"B{k}", f"b{k}"
    assert c.post("/v1/streams", json={"name": stream, "subjects": [f"{prefix}.>"]}).status_code == 201
    if n:
        msgs = [{"subject": f"{prefix}.{i % 2}", "text": f"m{i}"} for i in range(1, n + 1)]
        assert c.post("/v1/publish", json={"messages": msgs}).status_code == 200
    body = {"durable_name": "C", "ack_policy": "explicit", **consumer}
    assert c.post(f"/v1/streams/{stream}/consumers", json=body).status_code == 201
    return stream, f"/v1/streams/{stream}/consumers/C"


def info(c: httpx.Client, base: str) -> dict[str, Any]:
    i = c.get(base).json()
    return {k: i[k] for k in ("num_ack_pending", "num_pending", "num_redelivered")} | {
        "delivered": i["delivered"]["stream_seq"], "ack_floor": i["ack_floor"]["stream_seq"],
    }


def test_binary_next_carries_what_json_carries(c: httpx.Client) -> None:
    stream, base = setup(c, 6)
    c.post(f"/v1/publish/b{stream[1:]}.h", content=b"\x00\xffraw", headers={"Nats-Trace": "t1"})
    resp = c.post(f"{base}/next", json={"batch": 7, "no_wait": True}, headers=BINARY)
    assert resp.status_code == 200 and resp.headers["content-type"] == MEDIA_TYPE
    got = decode(resp.content)
    assert [(r.seq, r.consumer_seq, r.num_delivered, r.num_pending) for r in got] == [
        (s, s, 1, 7 - s) for s in range(1, 8)
    ]
    assert got[0].subject.endswith(".1") and got[0].data == b"m1" and got[0].headers is None
    assert got[6].data == b"\x00\xffraw" and got[6].headers == {"Nats-Trace": ["t1"]}
    stored = c.get(f"/v1/streams/{stream}/messages/7").json()["message"]
    assert base64.b64decode(stored["data"]) == got[6].data
    # the token acks as the JSON answer's token does
    assert c.post(f"{base}/ack", json={"acks": [{"token": r.ack} for r in got]}).json() == {
        "results": [{"ok": True}] * 7
    }
    assert info(c, base) == {"num_ack_pending": 0, "num_pending": 0, "num_redelivered": 0, "delivered": 7, "ack_floor": 7}


def test_binary_next_empty_and_headers_only(c: httpx.Client) -> None:
    _, base = setup(c, 0)
    resp = c.post(f"{base}/next", json={"batch": 5, "no_wait": True}, headers=BINARY)
    assert resp.status_code == 200 and resp.content == b"JLD1"
    _, base = setup(c, 2, headers_only=True)
    got = decode(c.post(f"{base}/next", json={"batch": 2, "no_wait": True}, headers=BINARY).content)
    assert [(r.data, r.headers) for r in got] == [(b"", {"Nats-Msg-Size": ["2"]})] * 2


def test_binary_next_errors_stay_json(c: httpx.Client) -> None:
    stream, _ = setup(c, 1)
    resp = c.post(f"/v1/streams/{stream}/consumers/NOPE/next", json={"batch": 1}, headers=BINARY)
    assert resp.status_code == 404 and resp.json()["error"]["err_code"] == 10014
    resp = c.post(f"/v1/streams/{stream}/consumers/C/next", json={"batch": "x"}, headers=BINARY)
    assert resp.status_code == 400 and resp.json()["error"]["err_code"] == 10003


def test_json_next_unchanged_by_default(c: httpx.Client) -> None:
    _, base = setup(c, 2)
    msgs = c.post(f"{base}/next", json={"batch": 2, "no_wait": True}).json()["messages"]
    assert [(m["seq"], base64.b64decode(m["data"])) for m in msgs] == [(1, b"m1"), (2, b"m2")]
    assert set(msgs[0]) == {"subject", "seq", "time", "data", "consumer_seq", "num_delivered", "num_pending", "ack"}


def test_seqs_ack_many_in_one_item(c: httpx.Client) -> None:
    _, base = setup(c, 10)
    c.post(f"{base}/next", json={"batch": 10, "no_wait": True}, headers=BINARY)
    resp = c.post(f"{base}/ack", json={"acks": [{"seqs": [1, 2, 3, 5], "type": "ack"}, {"seq": 4}]})
    assert resp.json() == {"results": [{"ok": True}, {"ok": True}]}
    assert info(c, base) == {"num_ack_pending": 5, "num_pending": 0, "num_redelivered": 0, "delivered": 10, "ack_floor": 5}
    # acks out of order: the floor moves only once the lowest pending one is acknowledged
    assert c.post(f"{base}/ack", json={"acks": [{"seqs": [10, 8, 6]}]}).json() == {"results": [{"ok": True}]}
    assert info(c, base)["ack_floor"] == 6
    assert c.post(f"{base}/ack", json={"acks": [{"seqs": [7, 9]}]}).json() == {"results": [{"ok": True}]}
    assert info(c, base) == {"num_ack_pending": 0, "num_pending": 0, "num_redelivered": 0, "delivered": 10, "ack_floor": 10}


def test_seqs_ack_reports_stale_and_unknown_seqs(c: httpx.Client) -> None:
    _, base = setup(c, 5)
    c.post(f"{base}/next", json={"batch": 3, "no_wait": True})
    c.post(f"{base}/ack", json={"acks": [{"seq": 1}]})
    result = c.post(f"{base}/ack", json={"acks": [{"seqs": [1, 2, 4, 3]}]}).json()["results"]
    assert result[0]["error"]["code"] == 400 and result[0]["error"]["err_code"] == 10003
    assert [(f["seq"], "already" in f["error"]["description"], "not delivered" in f["error"]["description"])
            for f in result[0]["failed"]] == [(1, True, False), (4, False, True)]
    assert info(c, base) == {"num_ack_pending": 0, "num_pending": 2, "num_redelivered": 0, "delivered": 3, "ack_floor": 3}


def test_seqs_nak_and_term(c: httpx.Client) -> None:
    _, base = setup(c, 3)
    c.post(f"{base}/next", json={"batch": 3, "no_wait": True})
    assert c.post(f"{base}/ack", json={"acks": [{"seqs": [1, 2], "type": "nak"}, {"seqs": [3], "type": "term"}]}).json() == {
        "results": [{"ok": True}, {"ok": True}]
    }
    again = decode(c.post(f"{base}/next", json={"batch": 5, "no_wait": True}, headers=BINARY).content)
    assert [(r.seq, r.num_delivered) for r in again] == [(1, 2), (2, 2)]
    assert info(c, base) == {"num_ack_pending": 2, "num_pending": 0, "num_redelivered": 2, "delivered": 3, "ack_floor": 0}


@pytest.mark.parametrize("item", [
    {"seqs": []}, {"seqs": "1,2"}, {"seqs": [1, 0]}, {"seqs": [1, -2]}, {"seqs": [1, True]}, {"seqs": [1.5]},
    {"seqs": [1], "type": "maybe"}, {"seqs": [1], "delay": -1}, {"seqs": [1], "delay": 2**63}, {"seqs": [2**63]}, {"seqs": [1], "token": "x"}, {"seqs": [1], "type": 3},
])
def test_malformed_seqs_item_refuses_the_whole_body(c: httpx.Client, item: dict[str, Any]) -> None:
    _, base = setup(c, 3)
    c.post(f"{base}/next", json={"batch": 3, "no_wait": True})
    before = info(c, base)
    resp = c.post(f"{base}/ack", json={"acks": [{"seq": 1}, item]})
    assert resp.status_code == 400
    body = resp.json()
    assert set(body) == {"type", "error"} and set(body["error"]) == {"code", "err_code", "description"}
    assert body["error"]["err_code"] == 10003
    assert info(c, base) == before  # seq 1 was not acknowledged either


def test_acks_of_a_binary_pull_survive_kill9(tmp_path: Path) -> None:
    """An acknowledged `seqs` ack and a binary pull's deliveries are in the ack log before the answer."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    gw = Gateway(warehouse, "--flush-interval", "60").start()
    try:
        with gw.client() as c:
            _, base = setup(c, 6)
            c.post(f"{base}/next", json={"batch": 6, "no_wait": True}, headers=BINARY)
            assert c.post(f"{base}/ack", json={"acks": [{"seqs": [1, 2, 4]}]}).json() == {"results": [{"ok": True}]}
            want = info(c, base)
        gw.kill9()
        gw.start()
        with gw.client() as c:
            assert info(c, base) == want == {
                "num_ack_pending": 3, "num_pending": 0, "num_redelivered": 0, "delivered": 6, "ack_floor": 2,
            }
    finally:
        gw.stop()
