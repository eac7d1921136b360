"""Bad input through a real gateway: each class gets its exact ApiError, nothing changes, the gateway keeps serving.

One gateway (a real `jetlake serve` on loopback) serves the module. A stream `BAD` capturing `orders.>`
holds two messages; every refused request must leave the stream list, every stream's config and state,
and `/healthz` exactly as they were. Every refusal is asserted with its HTTP status and err_code: where
nats-server has the same request, its err_code (checked against 2.15.1 with the same bodies; JetLake
answers 400 where nats-server answers 500 for a client's mistake, see engine/errors.py); where it has
none (HTTP routes, methods, body limits, batch bodies), the one JetLake documents.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from tests.gateway import Gateway

LONG = "a" * 1000
MIB = 1024 * 1024
BAD_REQUEST, INVALID_JSON, NO_MESSAGE, INVALID_CONFIG, TOO_LARGE = 10003, 10025, 10037, 10052, 10054
NAME_IN_USE, NOT_FOUND, OVERLAP, PATH_SEPARATORS, REPLICAS_NEGATIVE = 10058, 10059, 10065, 10128, 10133
DELETE_FAILED, WRONG_LAST_SEQ, ROLLUP_FAILED = 10057, 10071, 10111


def _start(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Gateway:
    warehouse: Path = tmp_path_factory.mktemp("bad-input") / "warehouse"
    warehouse.mkdir()
    return Gateway(warehouse, "--flush-interval", "0.2", *args).start()


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    gateway = _start(tmp_path_factory)
    try:
        with gateway.client() as client:
            assert client.post("/v1/streams", json={"name": "BAD", "subjects": ["orders.>"]}).status_code == 201
            for i in range(2):
                assert client.post(f"/v1/publish/orders.o{i}", content=b"payload").status_code == 200
            yield client
    finally:
        gateway.stop()


def snapshot(c: httpx.Client) -> dict[str, Any]:
    """Everything a refused request must not change: the stream list, each config and state."""
    listing = c.get("/v1/streams")
    assert listing.status_code == 200
    keys = ("messages", "bytes", "first_seq", "last_seq", "num_subjects", "num_deleted")
    streams = {
        info["config"]["name"]: (info["config"], info["created"], {k: info["state"][k] for k in keys})
        for info in listing.json()["streams"]
    }
    return {"total": listing.json()["total"], "streams": streams}


@contextmanager
def nothing_changes(c: httpx.Client) -> Iterator[None]:
    before = snapshot(c)
    yield
    assert snapshot(c) == before
    assert c.get("/healthz").status_code == 200


def assert_api_error(resp: httpx.Response, status: int, err_code: int) -> dict[str, Any]:
    """JetStream's ApiError shape with exactly this HTTP status (= `code`) and err_code."""
    assert (resp.status_code, resp.headers["content-type"].split(";")[0]) == (status, "application/json"), resp.text
    error = resp.json()["error"]
    assert set(error) == {"code", "err_code", "description"}
    assert (error["code"], error["err_code"]) == (status, err_code), error
    assert isinstance(error["description"], str) and error["description"]
    return error


def assert_ack_error(ack: dict[str, Any], err_code: int) -> None:
    """A per-message error of the batch route: `{"error": {code, err_code, description}}`."""
    assert set(ack) == {"error"} and set(ack["error"]) == {"code", "err_code", "description"}, ack
    status = 404 if err_code == NOT_FOUND else 400
    assert (ack["error"]["code"], ack["error"]["err_code"]) == (status, err_code), ack


def ids(values: list[Any]) -> list[str]:
    return [repr(v)[:24] for v in values]


# -- stream names ------------------------------------------------------------------------------

BAD_NAMES = [
    ("a.b", INVALID_CONFIG), ("a*", INVALID_CONFIG), ("a>", INVALID_CONFIG), ("a/b", PATH_SEPARATORS),
    ("a\\b", PATH_SEPARATORS), ("a b", INVALID_CONFIG), ("a\tb", INVALID_CONFIG), ("a\nb", INVALID_CONFIG),
    ("a\x01b", INVALID_CONFIG), ("a\x00b", INVALID_CONFIG), ("a\x7fb", INVALID_CONFIG), ("N" * 1000, INVALID_CONFIG),
    ("N" * 256, INVALID_CONFIG), ("", INVALID_CONFIG), (None, INVALID_CONFIG),
]


@pytest.mark.parametrize(("name", "err_code"), BAD_NAMES, ids=ids([n for n, _ in BAD_NAMES]))
def test_create_with_bad_name(c: httpx.Client, name: str | None, err_code: int) -> None:
    body = {"subjects": ["fresh.one"]} if name is None else {"name": name, "subjects": ["fresh.one"]}
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json=body), 400, err_code)


def test_create_with_name_over_255_bytes(c: httpx.Client) -> None:
    with nothing_changes(c):
        resp = c.post("/v1/streams", json={"name": "é" * 200, "subjects": ["fresh.one"]})
        assert_api_error(resp, 400, INVALID_CONFIG)


def test_update_through_bad_paths(c: httpx.Client) -> None:
    """nats-server: only a create answers 10128 for a path separator; an update's name check is 10052."""
    with nothing_changes(c):
        assert_api_error(c.put("/v1/streams/a%5Cb", json={"name": "a\\b"}), 400, INVALID_CONFIG)
        assert_api_error(c.put("/v1/streams/a%2Fb", json={"name": "a/b"}), 400, INVALID_CONFIG)
        assert_api_error(c.get("/v1/streams/a%2Fb"), 404, NOT_FOUND)
        assert_api_error(c.get("/v1/streams/a%5Cb"), 404, NOT_FOUND)
        assert_api_error(c.get("/v1/streams/a%2Fb/messages/1"), 404, NOT_FOUND)
        assert_api_error(c.put("/v1/streams/BAD", json={"name": "OTHER", "subjects": ["orders.>"]}), 400, 10056)


# -- subjects in stream configs ----------------------------------------------------------------

BAD_SUBJECTS = [
    "a..b", ".a", "a.", "a b", "a\tb", "a.>.b", "a*b", "a>", ">.a", "a." + LONG, "a\x01b", "a\x00", "a\nb", "",
]


@pytest.mark.parametrize("subject", BAD_SUBJECTS, ids=ids(BAD_SUBJECTS))
def test_create_with_bad_subject(c: httpx.Client, subject: str) -> None:
    with nothing_changes(c):
        body = {"name": "FRESH", "subjects": ["fresh.ok", subject]}
        assert_api_error(c.post("/v1/streams", json=body), 400, INVALID_CONFIG)


@pytest.mark.parametrize("subject", ["a..b", "orders.>.x", "a b"])
def test_update_with_bad_subject(c: httpx.Client, subject: str) -> None:
    with nothing_changes(c):
        assert_api_error(c.put("/v1/streams/BAD", json={"name": "BAD", "subjects": [subject]}), 400, INVALID_CONFIG)


@pytest.mark.parametrize(
    ("subjects", "err_code"),
    [
        (["orders.x"], OVERLAP), (["orders.*"], OVERLAP), (["orders.*.x"], OVERLAP), (["orders.>"], OVERLAP),
        ([">"], INVALID_CONFIG),  # `>` needs no_ack: refused by the config check before the overlap check
        (["x.a", "x.a"], INVALID_CONFIG), (["x.*", "x.b"], INVALID_CONFIG), (["x.>", "x.b.c"], INVALID_CONFIG),
    ],
)
def test_create_with_overlapping_subjects(c: httpx.Client, subjects: list[str], err_code: int) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json={"name": "FRESH", "subjects": subjects}), 400, err_code)


def test_create_same_name_with_another_config(c: httpx.Client) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json={"name": "BAD", "subjects": ["elsewhere"]}), 400, NAME_IN_USE)


# -- publishes to bad subjects -----------------------------------------------------------------

BAD_PUBLISH_SUBJECTS = [
    "orders.*", "orders.>", "orders.*.x", "orders..x", "orders.", ".orders", "orders.a b", "orders.a\tb",
    "orders.a\x01b", "orders.a\x7f", "orders.a\rb", "orders." + LONG,
]


@pytest.mark.parametrize("subject", BAD_PUBLISH_SUBJECTS, ids=ids(BAD_PUBLISH_SUBJECTS))
def test_raw_publish_to_bad_subject(c: httpx.Client, subject: str) -> None:
    with nothing_changes(c):
        error = assert_api_error(c.post(f"/v1/publish/{quote(subject, safe='')}", content=b"x"), 400, BAD_REQUEST)
        assert error["description"].startswith("invalid publish subject")


def test_raw_publish_to_subject_with_newline_is_400_invalid_subject(c: httpx.Client) -> None:
    with nothing_changes(c):
        error = assert_api_error(c.post("/v1/publish/orders.a%0Ab", content=b"x"), 400, BAD_REQUEST)
        assert error["description"].startswith("invalid publish subject")


@pytest.mark.parametrize("subject", [*BAD_PUBLISH_SUBJECTS, "orders.a\nb"], ids=ids([*BAD_PUBLISH_SUBJECTS, "a\nb"]))
def test_batch_publish_to_bad_subject(c: httpx.Client, subject: str) -> None:
    with nothing_changes(c):
        resp = c.post("/v1/publish", json={"messages": [{"subject": subject, "text": "x"}]})
        assert resp.status_code == 200, resp.text
        [ack] = resp.json()["acks"]
        assert_ack_error(ack, BAD_REQUEST)


def test_ndjson_publish_to_bad_subjects(c: httpx.Client) -> None:
    lines = b"\n".join(json.dumps({"subject": s, "text": "x"}).encode() for s in BAD_PUBLISH_SUBJECTS)
    with nothing_changes(c):
        resp = c.post("/v1/publish", content=lines, headers={"content-type": "application/x-ndjson"})
        assert resp.status_code == 200, resp.text
        assert len(resp.json()["acks"]) == len(BAD_PUBLISH_SUBJECTS)
        for ack in resp.json()["acks"]:
            assert_ack_error(ack, BAD_REQUEST)


def test_publish_to_subject_no_stream_captures(c: httpx.Client) -> None:
    with nothing_changes(c):
        error = assert_api_error(c.post("/v1/publish/nobody.listens", content=b"x"), 404, NOT_FOUND)
        assert error["description"] == "no stream matches subject"
        [ack] = c.post("/v1/publish", json={"messages": [{"subject": "nobody.listens"}]}).json()["acks"]
        assert_ack_error(ack, NOT_FOUND)


@pytest.mark.parametrize(
    ("name", "value", "err_code", "description"),
    [  # nats-server reads an expected sequence that is not a number as one that matches nothing
        ("Nats-Expected-Last-Sequence", "abc", WRONG_LAST_SEQ, "wrong last sequence: 2"),
        ("Nats-Expected-Last-Sequence", "-1", WRONG_LAST_SEQ, "wrong last sequence: 2"),
        ("Nats-Expected-Last-Subject-Sequence", "x", WRONG_LAST_SEQ, "wrong last sequence: 0"),
        ("Nats-Rollup", "all", ROLLUP_FAILED, "rollup not permitted"),
    ],
)
def test_raw_publish_with_bad_control_header(
    c: httpx.Client, name: str, value: str, err_code: int, description: str
) -> None:
    with nothing_changes(c):
        error = assert_api_error(c.post("/v1/publish/orders.hdr", content=b"x", headers={name: value}), 400, err_code)
        assert error["description"] == description


# -- unknown fields, malformed JSON, wrong types -----------------------------------------------

UNKNOWN_FIELDS = [
    # `Subjects`: nats-server's Go decoder matches field names case-insensitively and takes it for `subjects`;
    # JetLake's JSON names are exact, so for JetLake it is an unknown field like the others.
    {"bogus": 1}, {"Subjects": ["fresh.x"]}, {"max_msg": 10}, {"consumer_limits": {"foo": 1}},
    {"placement": {"region": "x"}},
]


@pytest.mark.parametrize("extra", UNKNOWN_FIELDS, ids=ids(UNKNOWN_FIELDS))
def test_create_and_update_with_unknown_field(c: httpx.Client, extra: dict[str, Any]) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json={"name": "FRESH", **extra}), 400, INVALID_JSON)
        update = {"name": "BAD", "subjects": ["orders.>"], **extra}
        assert_api_error(c.put("/v1/streams/BAD", json=update), 400, INVALID_JSON)


@pytest.mark.parametrize("body", [{"bogus": 1}, {"filter": "orders.>", "kep": 1}], ids=["bogus", "typo"])
def test_purge_with_unknown_field(c: httpx.Client, body: dict[str, Any]) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams/BAD/purge", json=body), 400, BAD_REQUEST)


MALFORMED = [
    b'{"name": "FRESH"', b"{name: FRESH}", b"not json", b"", b"   ", b"\xff\xfe", b'{"name": "FRESH"} trailing',
    b"[]", b'[{"name": "FRESH"}]', b'"FRESH"', b"42", b"null", b"true",
]


@pytest.mark.parametrize("raw", MALFORMED, ids=ids(MALFORMED))
@pytest.mark.parametrize(("method", "path"), [("POST", "/v1/streams"), ("PUT", "/v1/streams/BAD")])
def test_malformed_json_config(c: httpx.Client, method: str, path: str, raw: bytes) -> None:
    with nothing_changes(c):
        resp = c.request(method, path, content=raw, headers={"content-type": "application/json"})
        assert_api_error(resp, 400, INVALID_JSON)


@pytest.mark.parametrize("raw", [b'{"keep": 1', b"[1]", b'"all"', b"null"])
def test_purge_with_malformed_json(c: httpx.Client, raw: bytes) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams/BAD/purge", content=raw), 400, INVALID_JSON)


WRONG_TYPES = [
    {"max_msgs": "ten"}, {"max_age": 1.5}, {"subjects": "fresh.x"}, {"subjects": [1]}, {"name": 7},
    {"retention": "forever"}, {"storage": "disk"}, {"discard": "oldest"}, {"metadata": {"k": 1}},
    {"max_msgs": 2**70}, {"max_msg_size": 2**40},
]


@pytest.mark.parametrize("extra", WRONG_TYPES, ids=ids(WRONG_TYPES))
def test_create_with_wrong_types(c: httpx.Client, extra: dict[str, Any]) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json={"name": "FRESH", **extra}), 400, INVALID_JSON)


@pytest.mark.parametrize(
    "extra",
    [{"max_msgs": "ten"}, {"bogus": 1}, {"consumer_limits": {"foo": 1}}, {"max_msgs": 2**70}, {"max_msg_size": 2**40}],
    ids=["string-for-int", "unknown", "nested-unknown", "int64-overflow", "int32-overflow"],
)
def test_create_json_errors_use_jetstreams_err_code(c: httpx.Client, extra: dict[str, Any]) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json={"name": "FRESH", **extra}), 400, INVALID_JSON)


COERCED = [
    {"max_msgs": "10"}, {"max_msgs": True}, {"max_age": 1e9}, {"first_seq": "3"}, {"num_replicas": "1"},
    {"deny_delete": "yes"}, {"deny_delete": 1}, {"deny_purge": "false"}, {"allow_rollup_hdrs": "on"},
]


@pytest.mark.parametrize("extra", COERCED, ids=ids(COERCED))
def test_create_does_not_coerce_wrong_types(c: httpx.Client, extra: dict[str, Any]) -> None:
    name = "COERCE_" + "".join(ch for ch in f"{extra}" if ch.isalnum())
    before = snapshot(c)
    resp = c.post("/v1/streams", json={"name": name, "subjects": [f"coerce.{name}"], **extra})
    # A stream created by mistake stays: later tests compare their own before and after.
    assert_api_error(resp, 400, INVALID_JSON)
    assert snapshot(c) == before


# -- negative or absurd limits -----------------------------------------------------------------

ABSURD = [
    ({"max_age": -1}, INVALID_CONFIG), ({"max_age": 5}, INVALID_CONFIG), ({"max_age": 99_999_999}, INVALID_CONFIG),
    ({"max_age": 1_000_000_000, "duplicate_window": 2_000_000_000}, INVALID_CONFIG),
    ({"duplicate_window": -1}, INVALID_CONFIG), ({"num_replicas": 7}, INVALID_CONFIG),
    ({"num_replicas": -1}, REPLICAS_NEGATIVE), ({"max_msg_size": 2**40}, INVALID_JSON),
    ({"max_msgs": 2**70}, INVALID_JSON), ({"max_bytes": 2**63}, INVALID_JSON), ({"max_age": 2**63}, INVALID_JSON),
    ({"description": "d" * 5000}, INVALID_CONFIG),
    ({"discard_new_per_subject": True}, INVALID_CONFIG),
    ({"discard": "new", "discard_new_per_subject": True}, INVALID_CONFIG),
    ({"deny_purge": True, "allow_rollup_hdrs": True}, INVALID_CONFIG), ({"sealed": True}, INVALID_CONFIG),
]


@pytest.mark.parametrize(("extra", "err_code"), ABSURD, ids=ids([e for e, _ in ABSURD]))
def test_create_with_absurd_limit(c: httpx.Client, extra: dict[str, Any], err_code: int) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams", json={"name": "FRESH", "subjects": ["fresh.x"], **extra}), 400, err_code)


@pytest.mark.parametrize(("extra", "err_code"), ABSURD[:7], ids=ids([e for e, _ in ABSURD[:7]]))
def test_update_with_absurd_limit(c: httpx.Client, extra: dict[str, Any], err_code: int) -> None:
    with nothing_changes(c):
        resp = c.put("/v1/streams/BAD", json={"name": "BAD", "subjects": ["orders.>"], **extra})
        assert_api_error(resp, 400, err_code)


# -- oversized bodies --------------------------------------------------------------------------

def test_publishes_over_one_mib(c: httpx.Client) -> None:
    with nothing_changes(c):
        error = assert_api_error(c.post("/v1/publish/orders.big", content=b"x" * (MIB + 1)), 400, TOO_LARGE)
        assert error["description"] == "message size exceeds maximum allowed"
        # The header block "NATS/1.0\r\nNats-Msg-Id: big\r\n\r\n" (30 bytes) + MIB - 29 bytes = MIB + 1.
        resp = c.post("/v1/publish/orders.big", content=b"x" * (MIB - 29), headers={"Nats-Msg-Id": "big"})
        assert_api_error(resp, 400, TOO_LARGE)
        big = base64.b64encode(b"x" * (MIB + 1)).decode()
        batch = c.post("/v1/publish", json={"messages": [{"subject": "orders.big", "data": big}]})
        assert batch.status_code == 200
        assert_ack_error(batch.json()["acks"][0], TOO_LARGE)


def test_bodies_over_the_gateway_limit(tmp_path_factory: pytest.TempPathFactory) -> None:
    small = _start(tmp_path_factory, "--max-body", "65536")
    try:
        with small.client() as s:
            assert s.post("/v1/streams", json={"name": "SMALL", "subjects": ["small.>"]}).status_code == 201
            # HTTP's 413; nats-server has no such limit (its max_payload closes the connection).
            with nothing_changes(s):
                assert_api_error(s.post("/v1/publish/small.a", content=b"x" * 65537), 413, BAD_REQUEST)
                long = "d" * 70_000
                assert_api_error(s.post("/v1/streams", json={"name": "B2", "description": long}), 413, BAD_REQUEST)
                batch = {"messages": [{"subject": "small.a", "text": "t" * 70_000}]}
                assert_api_error(s.post("/v1/publish", json=batch), 413, BAD_REQUEST)
                assert_api_error(s.put("/v1/streams/SMALL", json={"name": "SMALL", "description": long}), 413, BAD_REQUEST)
                assert_api_error(s.post("/v1/streams/SMALL/purge", content=b" " * 70_000), 413, BAD_REQUEST)
                chunks = (b"y" * 8192 for _ in range(10))  # no Content-Length: chunked transfer
                assert_api_error(s.post("/v1/publish/small.a", content=chunks), 413, BAD_REQUEST)
            assert s.post("/v1/publish/small.a", content=b"x" * 65536).status_code == 200  # at the limit exactly
    finally:
        small.stop()


# -- purge bodies ------------------------------------------------------------------------------

BAD_PURGES = [
    {"seq": 1, "keep": 1}, {"seq": 5, "keep": 2}, {"seq": -1}, {"keep": -1}, {"seq": "2"}, {"keep": 1.5},
    {"seq": True}, {"seq": 2**64}, {"filter": 5}, {"filter": "orders..x"}, {"filter": "orders.a b"},
]


@pytest.mark.parametrize("body", BAD_PURGES, ids=ids(BAD_PURGES))
def test_bad_purge(c: httpx.Client, body: dict[str, Any]) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams/BAD/purge", json=body), 400, BAD_REQUEST)


def test_purge_of_missing_stream(c: httpx.Client) -> None:
    with nothing_changes(c):
        assert_api_error(c.post("/v1/streams/NOPE/purge", json={}), 404, NOT_FOUND)


# -- message reads and deletes, unknown routes -------------------------------------------------

BAD_READS = [
    ("/v1/streams/BAD/messages/0", 400, BAD_REQUEST),  # nats-server's MSG.GET {"seq": 0}
    ("/v1/streams/BAD/messages/-1", 400, BAD_REQUEST),  # nats-server: 10025, its JSON cannot hold -1 in a uint64
    ("/v1/streams/BAD/messages/abc", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages/1.5", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages/99", 404, NO_MESSAGE),
    ("/v1/streams/BAD/messages?last_by_subj=a..b", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages?last_by_subj=orders.a%20b", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages?next_by_subj=orders.", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages?next_by_subj=orders.>&seq=abc", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages?last_by_subj=orders.>&seq=1", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages?last_by_subj=orders.>&next_by_subj=orders.>", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages", 400, BAD_REQUEST),
    ("/v1/streams/BAD/messages?last_by_subj=nothing.here", 404, NO_MESSAGE),
    ("/v1/streams/NOPE/messages/1", 404, NOT_FOUND),
    ("/v1/streams/NOPE/messages?last_by_subj=orders.>", 404, NOT_FOUND),
    ("/v1/streams/NOPE", 404, NOT_FOUND),
    ("/v1/streams/BAD?subjects_filter=a..b", 400, BAD_REQUEST),
    ("/v1/streams?subject=a..b", 400, BAD_REQUEST),
    ("/v1/streams?limit=0", 400, BAD_REQUEST),
    ("/v1/streams?offset=-1", 400, BAD_REQUEST),
    ("/v1/streams?limit=abc", 400, BAD_REQUEST),
    ("/v1/nothing", 404, BAD_REQUEST),  # an unknown route (nats-server: no responder)
]


@pytest.mark.parametrize(("path", "status", "err_code"), BAD_READS, ids=[p.removeprefix("/v1/") for p, *_ in BAD_READS])
def test_bad_read(c: httpx.Client, path: str, status: int, err_code: int) -> None:
    with nothing_changes(c):
        assert_api_error(c.get(path), status, err_code)


@pytest.mark.parametrize(
    ("path", "status", "err_code"),
    [
        ("/v1/streams/BAD/messages/abc", 400, BAD_REQUEST),
        ("/v1/streams/BAD/messages/0", 400, DELETE_FAILED),  # nats-server's MSG.DELETE {"seq": 0}: no message found
        ("/v1/streams/BAD/messages/99", 400, 10057),  # past the end: JetStream's 10057, as 400
        ("/v1/streams/BAD/messages/1?no_erase=maybe", 400, BAD_REQUEST),
        ("/v1/streams/NOPE/messages/1", 404, NOT_FOUND),
        # DELETE /v1/streams/{missing} is in test_streams_api.py, on a gateway of its own: a stream delete can
        # deadlock the gateway against its flusher.
    ],
)
def test_bad_delete(c: httpx.Client, path: str, status: int, err_code: int) -> None:
    with nothing_changes(c):
        assert_api_error(c.delete(path), status, err_code)


def test_wrong_methods(c: httpx.Client) -> None:
    with nothing_changes(c):
        assert_api_error(c.patch("/v1/streams/BAD"), 405, BAD_REQUEST)
        assert_api_error(c.post("/v1/streams/BAD/messages"), 405, BAD_REQUEST)


# -- batch bodies ------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "raw", [b'{"messages": [', b"[]", b'{"messages": "x"}', b'{"msgs": []}', b'{"messages": [], "extra": 1}', b""],
    ids=["truncated", "array", "not-a-list", "wrong-key", "extra-key", "empty"],
)
def test_bad_batch_body(c: httpx.Client, raw: bytes) -> None:
    """Malformed JSON, a wrong type or an unknown field: invalid JSON, as nats-server's decoder answers requests."""
    with nothing_changes(c):
        resp = c.post("/v1/publish", content=raw, headers={"content-type": "application/json"})
        assert_api_error(resp, 400, INVALID_JSON)


BAD_MESSAGES = [
    "orders.x", {"text": "no subject"}, {"subject": 5}, {"subject": "orders.x", "data": "%%%not base64"},
    {"subject": "orders.x", "data": 5}, {"subject": "orders.x", "data": "eA==", "text": "x"},
    {"subject": "orders.x", "text": 5}, {"subject": "orders.x", "headers": ["a"]},
    {"subject": "orders.x", "headers": {"Bad Name": ["v"]}},
    {"subject": "orders.x", "headers": {"X-A": ["line\nbreak"]}},
    {"subject": "orders.x", "headers": {"X-A": [5]}}, {"subject": "orders.x", "bogus": 1},
]


@pytest.mark.parametrize("message", BAD_MESSAGES, ids=ids(BAD_MESSAGES))
def test_bad_message_in_batch_is_refused_alone(c: httpx.Client, message: Any) -> None:
    with nothing_changes(c):
        resp = c.post("/v1/publish", json={"messages": [message]})
        assert resp.status_code == 200, resp.text
        [ack] = resp.json()["acks"]
        assert_ack_error(ack, BAD_REQUEST)


def test_ndjson_with_a_malformed_line_stores_nothing(c: httpx.Client) -> None:
    good = json.dumps({"subject": "orders.nd", "text": "ok"}).encode()
    with nothing_changes(c):
        lines = good + b"\n{not json\n" + good
        resp = c.post("/v1/publish", content=lines, headers={"content-type": "application/x-ndjson"})
        assert_api_error(resp, 400, INVALID_JSON)


def test_gateway_still_serves_after_everything(c: httpx.Client) -> None:
    before = snapshot(c)["streams"]["BAD"][2]
    ack = c.post("/v1/publish/orders.after", content=b"still here")
    assert ack.status_code == 200 and ack.json() == {"stream": "BAD", "seq": before["last_seq"] + 1}
    health = c.get("/healthz").json()
    assert (health["status"], health["writes"], health["flush"]["failing"]) == ("ok", True, [])
