"""The binary batch body of `POST /v1/publish` (`application/x-jetlake-batch`) through a real gateway.

A batch means the same as the JSON batch of the same messages: one answer per record in order, errors
per message. A body that is not a sequence of whole records is refused whole (400 in JetStream's
ApiError shape) and stores nothing.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from api.http.binary_batch import MEDIA_TYPE, encode
from tests.gateway import Gateway

BINARY = {"content-type": MEDIA_TYPE}
BAD_REQUEST, INVALID_JSON, NOT_FOUND, TOO_LARGE, WRONG_LAST_SEQ = 10003, 10025, 10059, 10054, 10071


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    warehouse: Path = tmp_path_factory.mktemp("binary-batch") / "warehouse"
    warehouse.mkdir()
    gateway = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gateway.client() as client:
            config = {"name": "BIN", "subjects": ["bin.>"], "max_msg_size": 128}
            assert client.post("/v1/streams", json=config).status_code == 201
            yield client
    finally:
        gateway.stop()


def post(c: httpx.Client, body: bytes, content_type: str = MEDIA_TYPE) -> httpx.Response:
    return c.post("/v1/publish", content=body, headers={"content-type": content_type})


def state(c: httpx.Client) -> dict[str, Any]:
    return c.get("/v1/streams/BIN").json()["state"]  # type: ignore[no-any-return]


def record(subject: bytes, data: bytes, headers: bytes = b"") -> bytes:
    return struct.pack(">III", len(subject), len(headers), len(data)) + subject + headers + data


def test_good_batch(c: httpx.Client) -> None:
    last = state(c)["last_seq"]
    body = encode([("bin.a", b"one", None), ("bin.b", b"", None), ("bin.a", bytes(range(40)), {"Nats-Msg-Id": ["b1"]})])
    resp = post(c, body)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"acks": [{"stream": "BIN", "seq": last + i} for i in (1, 2, 3)]}
    third = c.get(f"/v1/streams/BIN/messages/{last + 3}").json()["message"]
    assert third["subject"] == "bin.a" and base64.b64decode(third["data"]) == bytes(range(40))
    assert third["headers"] == {"Nats-Msg-Id": ["b1"]}
    assert c.get(f"/v1/streams/BIN/messages/{last + 2}").json()["message"]["data"] == ""
    again = post(c, encode([("bin.c", b"dup", {"Nats-Msg-Id": ["b1"]})]))
    assert again.json() == {"acks": [{"stream": "BIN", "seq": last + 3, "duplicate": True}]}


def test_same_answers_as_the_json_batch(c: httpx.Client) -> None:
    """Each message once as JSON, once as binary: the same shape of answer, sequences one apart."""
    messages = [("bin.j", b"x" * 10, None), ("nobody.here", b"y", None), ("bin.*", b"z", None), ("bin.k", b"w" * 129, None)]
    as_json = {"messages": [{"subject": s, "data": base64.b64encode(d).decode()} for s, d, _ in messages]}
    json_acks = c.post("/v1/publish", json=as_json).json()["acks"]
    binary_acks = post(c, encode(messages)).json()["acks"]
    assert binary_acks[0]["seq"] == json_acks[0]["seq"] + 1
    assert binary_acks[1:] == json_acks[1:]
    assert [a["error"]["err_code"] for a in binary_acks[1:]] == [NOT_FOUND, BAD_REQUEST, TOO_LARGE]


@pytest.mark.parametrize("per_subject", [True, False], ids=["discard_new_per_subject", "drops_the_oldest"])
def test_max_msgs_per_subject_on_the_columnar_path(c: httpx.Client, per_subject: bool) -> None:
    """discard new with discard_new_per_subject refuses a subject's message past its limit (503 10077);
    without it the limit drops the subject's oldest. Binary batches (the columnar path) answer and store
    exactly as JSON batches of the same messages do, on twin streams."""
    messages = [("a", b"1"), ("a", b"2"), ("a", b"3"), ("b", b"4"), ("a", b"5")]
    answers, kept = [], []
    for encoding in ("binary", "json"):
        name = f"PS_{encoding}_{per_subject}"
        config = {"name": name, "subjects": [f"{name}.>"], "discard": "new", "max_msgs_per_subject": 2,
                  "discard_new_per_subject": per_subject}
        assert c.post("/v1/streams", json=config).status_code == 201
        batch = [(f"{name}.{s}", d, None) for s, d in messages]
        if encoding == "binary":
            resp = post(c, encode(batch))
        else:
            as_json = [{"subject": s, "data": base64.b64encode(d).decode()} for s, d, _ in batch]
            resp = c.post("/v1/publish", json={"messages": as_json})
        assert resp.status_code == 200, resp.text
        answers.append([a.get("seq", a.get("error")) for a in resp.json()["acks"]])
        info = c.get(f"/v1/streams/{name}", params={"subjects_filter": ">"}).json()["state"]
        kept.append(({k.rsplit(".", 1)[1]: n for k, n in info["subjects"].items()}, info["messages"]))
    full = {"code": 503, "err_code": 10077, "description": "maximum messages per subject exceeded"}
    assert answers[0] == answers[1] == ([1, 2, full, 3, full] if per_subject else [1, 2, 3, 4, 5])
    assert kept[0] == kept[1] == ({"a": 2, "b": 1}, 3)


def test_per_message_errors(c: httpx.Client) -> None:
    before = state(c)
    els = "Nats-Expected-Last-Sequence"
    body = b"JLB1" + b"".join([
        record(b"bin.ok", b"first"),
        record(b"bin.bad..subject", b"x"),
        record(b"other.stream", b"x"),
        record(b"bin.big", b"x" * 129),
        record(b"bin.h", b"x", b'{"Nats-Msg-Id": ["m-1"'),  # headers not JSON
        record(b"bin.h", b"x", b'["not", "a", "map"]'),
        record(b"bin.h", b"x", b'{"bad name": ["v"]}'),
        record(b"bin.h", b"x", f'{{"{els}": ["1"]}}'.encode()),
        record(b"bin.ok", b"last"),
    ])
    acks = post(c, body).json()["acks"]
    assert acks[0] == {"stream": "BIN", "seq": before["last_seq"] + 1}
    assert [a["error"]["err_code"] for a in acks[1:8]] == [
        BAD_REQUEST, NOT_FOUND, TOO_LARGE, INVALID_JSON, BAD_REQUEST, BAD_REQUEST, WRONG_LAST_SEQ,
    ]
    assert all(a["error"]["code"] == (404 if a["error"]["err_code"] == NOT_FOUND else 400) for a in acks[1:8])
    assert acks[8] == {"stream": "BIN", "seq": before["last_seq"] + 2}  # refused messages took no sequence
    assert state(c)["messages"] == before["messages"] + 2


def test_empty_batch(c: httpx.Client) -> None:
    before = state(c)
    resp = post(c, b"JLB1", MEDIA_TYPE + "; charset=binary")
    assert resp.status_code == 200 and resp.json() == {"acks": []}
    assert state(c) == before


GOOD = record(b"bin.fine", b"payload")
MALFORMED = {
    "uniform records, the last cut short": b"JLB1" + GOOD * 3 + GOOD[:-2],
    "uniform records, subject not UTF-8": b"JLB1" + record(b"bin.\xff", b"x") * 2,
    "empty body": b"",
    "wrong magic": b"JLB2" + GOOD,
    "json body": b'{"messages": []}',
    "record header cut short": b"JLB1" + GOOD + GOOD[:7],
    "payload cut short": b"JLB1" + GOOD + GOOD[:-1],
    "subject length past the end": b"JLB1" + GOOD + struct.pack(">III", 1 << 31, 0, 0) + b"bin.x",
    "payload length past the end": b"JLB1" + struct.pack(">III", 8, 0, 1 << 20) + b"bin.fine" + b"short",
    "headers length past the end": b"JLB1" + struct.pack(">III", 8, 4096, 1) + b"bin.fine" + b"{}x",
    "subject not UTF-8": b"JLB1" + GOOD + record(b"bin.\xff\xfe", b"x"),
    "trailing garbage": b"JLB1" + GOOD + b"\x00\x00",
}


@pytest.mark.parametrize("body", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_body_stores_nothing(c: httpx.Client, body: bytes) -> None:
    before = state(c)
    resp = post(c, body)
    assert resp.status_code == 400, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    error = resp.json()["error"]
    assert error == {"code": 400, "err_code": BAD_REQUEST, "description": error["description"]}
    assert error["description"]
    assert state(c) == before
    assert c.get("/healthz").status_code == 200


# -- batches without headers: the columnar path ------------------------------------------------


def test_uniform_plain_batch_is_one_run(c: httpx.Client) -> None:
    """Same subject and payload length in every record (a producer's usual batch): consecutive acks,
    byte for byte the JSON the per-message answer would be, readable before and after the flush."""
    last = state(c)["last_seq"]
    payloads = [bytes([i % 251]) * 100 for i in range(300)]
    resp = post(c, encode([("bin.run", p, None) for p in payloads]))
    assert resp.status_code == 200, resp.text
    assert resp.content == orjson.dumps({"acks": [{"stream": "BIN", "seq": last + 1 + i} for i in range(300)]})
    assert state(c)["last_seq"] == last + 300
    for i in (0, 150, 299):
        message = c.get(f"/v1/streams/BIN/messages/{last + 1 + i}").json()["message"]
        assert message["subject"] == "bin.run" and base64.b64decode(message["data"]) == payloads[i]
        assert "headers" not in message or not message["headers"]


def test_varied_plain_batch_with_oversize_payloads(c: httpx.Client) -> None:
    last = state(c)["last_seq"]
    messages = [("bin.v1", b"a"), ("bin.v2", b"b" * 129), ("bin.ü", b""), ("bin.v1", b"c" * 128), ("bin.v3", b"d" * 500)]
    acks = post(c, encode([(s, d, None) for s, d in messages])).json()["acks"]
    assert acks[0] == {"stream": "BIN", "seq": last + 1}
    assert acks[1]["error"]["err_code"] == TOO_LARGE and acks[4]["error"]["err_code"] == TOO_LARGE
    assert acks[2] == {"stream": "BIN", "seq": last + 2} and acks[3] == {"stream": "BIN", "seq": last + 3}
    assert state(c)["last_seq"] == last + 3
    third = c.get(f"/v1/streams/BIN/messages/{last + 3}").json()["message"]
    assert base64.b64decode(third["data"]) == b"c" * 128
    assert c.get(f"/v1/streams/BIN/messages/{last + 2}").json()["message"]["subject"] == "bin.ü"


def test_plain_batch_over_two_streams_and_no_stream(c: httpx.Client) -> None:
    assert c.post("/v1/streams", json={"name": "BIN2", "subjects": ["two.>"]}).status_code == 201
    last = state(c)["last_seq"]
    body = encode([("bin.x", b"1", None), ("two.y", b"2", None), ("none.z", b"3", None), ("bin.x", b"4", None)])
    acks = post(c, body).json()["acks"]
    assert acks[0] == {"stream": "BIN", "seq": last + 1} and acks[1] == {"stream": "BIN2", "seq": 1}
    assert acks[2]["error"]["err_code"] == NOT_FOUND and acks[3] == {"stream": "BIN", "seq": last + 2}


def test_plain_records_then_one_with_headers(c: httpx.Client) -> None:
    """One record with headers sends the whole batch the per-message way: same answers."""
    last = state(c)["last_seq"]
    body = encode([("bin.p", b"1", None), ("bin.p", b"2", None), ("bin.p", b"3", {"Nats-Msg-Id": ["ph-1"]})])
    assert post(c, body).json() == {"acks": [{"stream": "BIN", "seq": last + i} for i in (1, 2, 3)]}
    assert c.get(f"/v1/streams/BIN/messages/{last + 3}").json()["message"]["headers"] == {"Nats-Msg-Id": ["ph-1"]}


@pytest.mark.parametrize("payload", [b"", b"data"])
def test_records_of_one_layout_decode_as_record_by_record(payload: bytes) -> None:
    """A batch of new subjects of one width (cut out with numpy) and of one subject decode as the
    record-by-record loop does, empty payloads included."""
    from api.http.binary_batch import _plain_records, decode_plain

    for subjects in ([f"cap.k{i}" for i in range(100_000, 100_300)], ["one.s"] * 3, ["é.1", "é.2"]):
        body = encode([(s, payload, None) for s in subjects])
        fast, slow = decode_plain(body), _plain_records(body)
        assert fast is not None and slow is not None
        assert fast.subjects == slow.subjects == subjects and fast.data.equals(slow.data)
        assert fast.subject_column().to_pylist() == subjects


def test_a_subject_that_is_not_utf8_is_refused_with_its_record() -> None:
    from api.http.binary_batch import decode_plain

    from engine import JetStreamError

    body = encode([("cap.k1", b"a", None), ("cap.k2", b"b", None)]).replace(b"cap.k2", b"cap.\xff2")
    with pytest.raises(JetStreamError, match="record 1: the subject is not UTF-8"):
        decode_plain(body)
