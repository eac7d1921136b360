"""Streams, publish, get, delete and purge through a real gateway, against hand-computed JetStream values.

One gateway (a real `jetlake serve` on loopback) serves the module, a second one stream deletes; each
test makes its own streams `S<n>` capturing `s<n>.>`. `bytes` is memstore's count: len(subject) + header
block + len(data) + 16, the header block being "NATS/1.0\\r\\n" + "Name: value\\r\\n" per value + "\\r\\n".
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway import Gateway

_numbers = itertools.count(1)
STATE_KEYS = ("messages", "bytes", "first_seq", "last_seq", "num_subjects", "num_deleted")


@contextmanager
def serving(tmp_path_factory: pytest.TempPathFactory, flush_interval: str) -> Iterator[httpx.Client]:
    """A gateway and a client; a deadlocked gateway (see the last test) is killed, as it would never stop."""
    warehouse: Path = tmp_path_factory.mktemp("streams-api") / "warehouse"
    warehouse.mkdir()
    gateway = Gateway(warehouse, "--flush-interval", flush_interval).start()
    try:
        with httpx.Client(base_url=gateway.url, timeout=10.0) as client:
            yield client
    finally:
        try:
            healthy = httpx.get(f"{gateway.url}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            healthy = False
        gateway.stop() if healthy else gateway.kill9()


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    with serving(tmp_path_factory, "0.2") as client:
        yield client


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """A gateway whose flusher never runs, for stream deletes: they can deadlock against it (see the last test)."""
    with serving(tmp_path_factory, "1000") as client:
        yield client


@pytest.fixture(params=["file", "memory"])
def storage(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def size(subject: str, data: bytes = b"", headers: dict[str, list[str]] | None = None) -> int:
    block = 12 + sum(len(k) + 2 + len(v) + 2 for k, vs in headers.items() for v in vs) if headers else 0
    return len(subject) + block + len(data) + 16


def new_stream(c: httpx.Client, storage: str = "file", **config: Any) -> tuple[str, str]:
    """Creates `S<n>` on `s<n>.>`; returns (name, subject prefix)."""
    n = next(_numbers)
    name, prefix = f"S{n}", f"s{n}"
    resp = c.post("/v1/streams", json={"name": name, "subjects": [f"{prefix}.>"], "storage": storage, **config})
    assert resp.status_code == 201, resp.text
    return name, prefix


def pub(c: httpx.Client, subject: str, data: bytes = b"", **headers: str) -> httpx.Response:
    return c.post(f"/v1/publish/{subject}", content=data, headers={k.replace("_", "-"): v for k, v in headers.items()})


def ack(c: httpx.Client, subject: str, data: bytes = b"", **headers: str) -> int:
    resp = pub(c, subject, data, **headers)
    assert resp.status_code == 200, resp.text
    assert "duplicate" not in resp.json()
    return int(resp.json()["seq"])


def state(c: httpx.Client, name: str) -> dict[str, int]:
    resp = c.get(f"/v1/streams/{name}")
    assert resp.status_code == 200, resp.text
    return {k: resp.json()["state"][k] for k in STATE_KEYS}


def expect(messages: int, bytes_: int, first: int, last: int, subjects: int, deleted: int = 0) -> dict[str, int]:
    return dict(zip(STATE_KEYS, (messages, bytes_, first, last, subjects, deleted), strict=True))


def error(resp: httpx.Response, status: int, err_code: int, description: str | None = None) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()["error"]
    assert body["code"] == status and body["err_code"] == err_code, body
    if description is not None:
        assert body["description"] == description


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- create, defaults, update ------------------------------------------------------------------

def test_create_then_identical_then_other_config(c: httpx.Client) -> None:
    body = {"name": "CREATE_ONCE", "subjects": ["create.once.>"]}
    first = c.post("/v1/streams", json=body)
    assert first.status_code == 201
    again = c.post("/v1/streams", json=body)
    assert again.status_code == 200
    assert again.json()["config"] == first.json()["config"] and again.json()["created"] == first.json()["created"]
    spelled_out = c.post("/v1/streams", json={**body, "max_msgs": -1, "duplicate_window": 120 * 10**9})
    assert spelled_out.status_code == 200
    other = c.post("/v1/streams", json={**body, "max_msgs": 5})
    error(other, 400, 10058, "stream name already in use with a different configuration")


DEFAULTS = {
    "name": "DEFAULTS", "subjects": ["DEFAULTS"], "retention": "limits", "max_msgs": -1, "max_bytes": -1, "max_age": 0,
    "max_msgs_per_subject": -1, "max_msg_size": -1, "max_consumers": -1, "discard": "old", "storage": "file",
    "num_replicas": 1, "duplicate_window": 120_000_000_000, "sealed": False, "deny_delete": False, "deny_purge": False,
    "allow_rollup_hdrs": False, "discard_new_per_subject": False, "allow_direct": False, "compression": "none",
}


def test_defaults_field_for_field(c: httpx.Client) -> None:
    resp = c.post("/v1/streams", json={"name": "DEFAULTS"})
    assert resp.status_code == 201
    assert {k: resp.json()["config"][k] for k in DEFAULTS} == DEFAULTS
    assert state(c, "DEFAULTS") == expect(0, 0, 0, 0, 0)
    # 0 or below -1 means unlimited; 0 replicas means 1.
    limits = {"max_msgs": 0, "max_bytes": -5, "max_msgs_per_subject": 0, "max_consumers": -2, "max_msg_size": 0}
    name, _ = new_stream(c, num_replicas=0, **limits)
    config = c.get(f"/v1/streams/{name}").json()["config"]
    assert {k: config[k] for k in limits} == dict.fromkeys(limits, -1)
    assert config["num_replicas"] == 1


def test_longest_valid_name(c: httpx.Client) -> None:
    resp = c.post("/v1/streams", json={"name": "L" * 255, "subjects": ["longest.>"]})
    assert resp.status_code == 201, resp.text


def test_duplicate_window_default(c: httpx.Client) -> None:
    s = 1_000_000_000
    for given, window in [({"max_age": 30 * s}, 30 * s), ({"max_age": 600 * s}, 120 * s),  # under 2m: follows max_age
                          ({"duplicate_window": 5 * s}, 5 * s), ({"max_age": 60 * s, "duplicate_window": s}, s)]:
        name, _ = new_stream(c, **given)
        assert c.get(f"/v1/streams/{name}").json()["config"]["duplicate_window"] == window, given


def put(c: httpx.Client, name: str, prefix: str, **config: Any) -> httpx.Response:
    return c.put(f"/v1/streams/{name}", json={"name": name, "subjects": [f"{prefix}.>"], **config})


def test_update_rules(c: httpx.Client) -> None:
    name, prefix = new_stream(c, deny_delete=True, deny_purge=True)
    flags = {"deny_delete": True, "deny_purge": True}
    error(put(c, name, prefix, storage="memory", **flags), 400, 10052)  # storage is immutable
    error(put(c, name, prefix, deny_purge=True), 400, 10052)  # deny flags can never be unset
    error(put(c, name, prefix, deny_delete=True), 400, 10052)
    error(put(c, name, prefix, retention="workqueue", **flags), 400, 10052)
    to_interest = put(c, name, prefix, retention="interest", **flags)
    assert to_interest.status_code == 200 and to_interest.json()["config"]["retention"] == "interest"
    assert put(c, name, prefix, retention="limits", **flags).json()["config"]["retention"] == "limits"
    config = c.get(f"/v1/streams/{name}").json()["config"]
    assert (config["storage"], config["deny_delete"], config["deny_purge"]) == ("file", True, True)
    wq, wq_prefix = new_stream(c, retention="workqueue")
    error(put(c, wq, wq_prefix, retention="limits"), 400, 10052)
    error(put(c, wq, wq_prefix, retention="interest"), 400, 10052)


def test_update_limits_and_subjects_apply_at_once(c: httpx.Client) -> None:
    name, prefix = new_stream(c)
    for _ in range(5):
        ack(c, f"{prefix}.a", b"0123456789")
    updated = put(c, name, prefix, max_msgs=2)
    assert updated.status_code == 200 and updated.json()["config"]["max_msgs"] == 2
    assert state(c, name) == expect(2, 2 * size(f"{prefix}.a", b"0123456789"), 4, 5, 1)
    error(c.put("/v1/streams/NO_SUCH", json={"name": "NO_SUCH"}), 404, 10059)
    other, other_prefix = new_stream(c)
    error(put(c, other, other_prefix, subjects=[f"{prefix}.x"]), 400, 10065)
    moved = c.put(f"/v1/streams/{name}", json={"name": name, "subjects": [f"moved.{prefix}.>"], "max_msgs": 2})
    assert moved.status_code == 200 and moved.json()["config"]["subjects"] == [f"moved.{prefix}.>"]
    error(pub(c, f"{prefix}.a"), 404, 10059, "no stream matches subject")
    assert ack(c, f"moved.{prefix}.a") == 6


def test_sealed_stream_refuses_writes(c: httpx.Client) -> None:
    name, prefix = new_stream(c)
    ack(c, f"{prefix}.a", b"kept")
    sealed = put(c, name, prefix, sealed=True)
    assert sealed.status_code == 200
    assert [sealed.json()["config"][k] for k in ("sealed", "deny_delete", "deny_purge")] == [True, True, True]
    before = state(c, name)
    error(pub(c, f"{prefix}.a", b"x"), 400, 10109, "invalid operation on sealed stream")
    [batch_ack] = c.post("/v1/publish", json={"messages": [{"subject": f"{prefix}.a"}]}).json()["acks"]
    assert batch_ack["error"]["err_code"] == 10109
    error(c.post(f"/v1/streams/{name}/purge", json={}), 400, 10109)
    error(c.delete(f"/v1/streams/{name}/messages/1"), 400, 10109)
    error(put(c, name, prefix), 400, 10052)
    assert state(c, name) == before


# -- list, info, delete --------------------------------------------------------------------------

def test_list_with_subject_filter_offset_and_limit(c: httpx.Client) -> None:
    for name, subjects in [("LIST_A", ["lst.a.*"]), ("LIST_B", ["lst.b.>"]), ("LIST_C", ["lst.c.x", "lst.d"])]:
        assert c.post("/v1/streams", json={"name": name, "subjects": subjects}).status_code == 201

    def names(query: str) -> tuple[int, list[str]]:
        body = c.get(f"/v1/streams?{query}").json()
        return body["total"], [s["config"]["name"] for s in body["streams"]]

    assert names("subject=lst.a.x") == (1, ["LIST_A"])
    assert names("subject=lst.d") == (1, ["LIST_C"])
    assert names("subject=lst.*") == (1, ["LIST_C"])
    assert names("subject=lst.b.*") == (1, ["LIST_B"])
    assert names("subject=lst.*.x") == (3, ["LIST_A", "LIST_B", "LIST_C"])
    assert names("subject=lst.>") == (3, ["LIST_A", "LIST_B", "LIST_C"])
    assert names("subject=other.x") == (0, [])
    page = c.get("/v1/streams?subject=lst.>&offset=1&limit=1").json()
    assert (page["total"], page["offset"], page["limit"]) == (3, 1, 1)
    assert [s["config"]["name"] for s in page["streams"]] == ["LIST_B"]
    assert names("subject=lst.>&offset=3") == (3, [])
    everything = c.get("/v1/streams").json()
    assert everything["total"] == len(everything["streams"]) and {"LIST_A", "LIST_B", "LIST_C"} <= set(names("")[1])


def test_info_subjects_filter(c: httpx.Client) -> None:
    name, p = new_stream(c)
    for subject in (f"{p}.a", f"{p}.a", f"{p}.b", f"{p}.c.d"):
        ack(c, subject)
    assert "subjects" not in c.get(f"/v1/streams/{name}").json()["state"]
    by_star = c.get(f"/v1/streams/{name}", params={"subjects_filter": f"{p}.*"}).json()["state"]
    assert by_star["subjects"] == {f"{p}.a": 2, f"{p}.b": 1} and by_star["num_subjects"] == 3
    everything = c.get(f"/v1/streams/{name}", params={"subjects_filter": ">"}).json()["state"]["subjects"]
    assert everything == {f"{p}.a": 2, f"{p}.b": 1, f"{p}.c.d": 1}


def test_delete_stream(quiet: httpx.Client, storage: str) -> None:
    c = quiet
    name, p = new_stream(c, storage)
    kept, q = new_stream(c, storage)
    ack(c, f"{p}.a")
    ack(c, f"{q}.a")
    total = c.get("/v1/streams").json()["total"]
    deleted = c.delete(f"/v1/streams/{name}")
    assert deleted.status_code == 200 and deleted.json() == {"success": True}
    error(c.get(f"/v1/streams/{name}"), 404, 10059)
    error(pub(c, f"{p}.a"), 404, 10059, "no stream matches subject")
    error(c.delete(f"/v1/streams/{name}"), 404, 10059)
    error(c.delete("/v1/streams/NEVER_WAS"), 404, 10059)
    listing = c.get("/v1/streams").json()
    assert listing["total"] == total - 1 and name not in [s["config"]["name"] for s in listing["streams"]]
    assert c.post("/v1/streams", json={"name": name, "subjects": [f"{p}.>"], "storage": storage}).status_code == 201
    assert state(c, name) == expect(0, 0, 0, 0, 0)
    assert ack(c, f"{p}.a") == 1
    assert state(c, kept) == expect(1, size(f"{q}.a"), 1, 1, 1)


# -- publish and its control headers -----------------------------------------------------------

def test_msg_id_duplicate(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage)
    first = pub(c, f"{p}.a", b"one", Nats_Msg_Id="m1")
    assert first.status_code == 200 and first.json() == {"stream": name, "seq": 1}
    dup = pub(c, f"{p}.a", b"two", Nats_Msg_Id="m1")
    assert dup.status_code == 200 and dup.json() == {"stream": name, "seq": 1, "duplicate": True}
    assert pub(c, f"{p}.b", b"", **{"nats-msg-id": "m1"}).json() == {"stream": name, "seq": 1, "duplicate": True}
    assert ack(c, f"{p}.b") == 2
    assert state(c, name) == expect(2, size(f"{p}.a", b"one", {"Nats-Msg-Id": ["m1"]}) + size(f"{p}.b"), 1, 2, 2)
    assert c.get(f"/v1/streams/{name}/messages/1").json()["message"]["data"] == b64(b"one")


def test_duplicate_is_found_before_last_msg_id_and_rollup_checks(c: httpx.Client) -> None:
    name, p = new_stream(c)
    assert ack(c, f"{p}.a", Nats_Msg_Id="m1") == 1
    assert ack(c, f"{p}.b", Nats_Msg_Id="m2") == 2
    duplicate = {"stream": name, "seq": 1, "duplicate": True}
    assert pub(c, f"{p}.a", Nats_Msg_Id="m1", Nats_Expected_Last_Sequence="2").json() == duplicate
    assert pub(c, f"{p}.a", Nats_Msg_Id="m1", Nats_Expected_Last_Msg_Id="zz").json() == duplicate
    assert pub(c, f"{p}.a", Nats_Msg_Id="m1", Nats_Rollup="all").json() == duplicate
    error(pub(c, f"{p}.a", Nats_Msg_Id="m1", Nats_Expected_Stream="zz"), 400, 10060)


@pytest.mark.parametrize(
    ("header", "actual"), [("Nats-Expected-Last-Sequence", 2), ("Nats-Expected-Last-Subject-Sequence", 1)]
)
def test_expectations_are_checked_before_deduplication(c: httpx.Client, header: str, actual: int) -> None:
    name, p = new_stream(c)
    assert ack(c, f"{p}.a", Nats_Msg_Id="m1") == 1
    assert ack(c, f"{p}.b", Nats_Msg_Id="m2") == 2
    error(pub(c, f"{p}.a", **{"Nats-Msg-Id": "m1", header: "99"}), 400, 10071, f"wrong last sequence: {actual}")


def test_expected_stream_and_last_sequence(c: httpx.Client) -> None:
    name, p = new_stream(c)
    error(pub(c, f"{p}.a", Nats_Expected_Stream="OTHER"), 400, 10060, "expected stream does not match")
    assert ack(c, f"{p}.a", Nats_Expected_Last_Sequence="0", Nats_Expected_Stream=name) == 1
    assert ack(c, f"{p}.a") == 2
    error(pub(c, f"{p}.a", Nats_Expected_Last_Sequence="1"), 400, 10071, "wrong last sequence: 2")
    assert ack(c, f"{p}.a", Nats_Expected_Last_Sequence="2") == 3  # the refused publish took no sequence
    assert state(c, name)["messages"] == 3


def test_expected_last_subject_sequence(c: httpx.Client) -> None:
    name, p = new_stream(c)
    last = "Nats-Expected-Last-Subject-Sequence"
    assert ack(c, f"{p}.a", **{last: "0"}) == 1  # 0: no message on the subject yet
    assert ack(c, f"{p}.b") == 2
    error(pub(c, f"{p}.a", **{last: "0"}), 400, 10071, "wrong last sequence: 1")
    assert ack(c, f"{p}.a", **{last: "1"}) == 3
    assert ack(c, f"{p}.c", **{last: "2", f"{last}-Subject": f"{p}.b"}) == 4
    error(pub(c, f"{p}.c", **{last: "3", f"{last}-Subject": f"{p}.*"}), 400, 10071, "wrong last sequence: 4")
    error(pub(c, f"{p}.c", **{f"{last}-Subject": f"{p}.b"}), 400, 10193)
    assert c.post(f"/v1/streams/{name}/purge", json={"filter": f"{p}.a"}).json() == {"success": True, "purged": 2}
    assert ack(c, f"{p}.a", **{last: "0"}) == 5  # purge-aware
    assert state(c, name)["last_seq"] == 5


def test_expected_last_msg_id(c: httpx.Client) -> None:
    name, p = new_stream(c)
    assert ack(c, f"{p}.a", Nats_Msg_Id="a1") == 1
    assert ack(c, f"{p}.a", Nats_Msg_Id="a2", Nats_Expected_Last_Msg_Id="a1") == 2
    error(pub(c, f"{p}.a", Nats_Expected_Last_Msg_Id="a1"), 400, 10070, "wrong last msg ID: a2")
    assert ack(c, f"{p}.b") == 3
    error(pub(c, f"{p}.a", Nats_Expected_Last_Msg_Id="a2"), 400, 10070, "wrong last msg ID: ")
    assert state(c, name)["last_seq"] == 3


def test_rollup(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage, allow_rollup_hdrs=True)
    for subject, data in ((f"{p}.a", b"1"), (f"{p}.a", b"2"), (f"{p}.b", b"3"), (f"{p}.a", b"4")):
        ack(c, subject, data)
    assert ack(c, f"{p}.a", b"5", Nats_Rollup="sub") == 5
    sub_bytes = size(f"{p}.b", b"3") + size(f"{p}.a", b"5", {"Nats-Rollup": ["sub"]})
    assert state(c, name) == expect(2, sub_bytes, 3, 5, 2, deleted=1)
    error(pub(c, f"{p}.a", Nats_Rollup="bogus"), 400, 10111)
    assert ack(c, f"{p}.c", b"6", Nats_Rollup="all") == 6
    assert state(c, name) == expect(1, size(f"{p}.c", b"6", {"Nats-Rollup": ["all"]}), 6, 6, 1)
    plain, q = new_stream(c, storage)
    error(pub(c, f"{q}.a", Nats_Rollup="sub"), 400, 10111, "rollup not permitted")
    error(pub(c, f"{q}.a", Nats_Rollup="all"), 400, 10111, "rollup not permitted")
    assert ack(c, f"{q}.a") == 1


def test_interest_stream_without_consumers_stores_nothing(c: httpx.Client) -> None:
    # As nats-server 2.15.1: the sequences are consumed, nothing is stored (reference section 2, "Interest skip").
    name, p = new_stream(c, retention="interest")
    assert ack(c, f"{p}.a", b"x") == 1 and ack(c, f"{p}.a", b"x") == 2
    assert state(c, name) == expect(0, 0, 3, 2, 0)


def test_max_msg_size(c: httpx.Client) -> None:
    name, p = new_stream(c, max_msg_size=10)
    assert ack(c, f"{p}.a", b"x" * 10) == 1
    error(pub(c, f"{p}.a", b"x" * 11), 400, 10054, "message size exceeds maximum allowed")
    error(pub(c, f"{p}.a", b"x", Nats_Msg_Id="i"), 400, 10054)  # the 28-byte header block counts
    assert ack(c, f"{p}.a") == 2


# -- limits ------------------------------------------------------------------------------------

@pytest.mark.parametrize("limit", ["max_msgs", "max_bytes"])
def test_limit_with_discard_old(c: httpx.Client, storage: str, limit: str) -> None:
    name, p = new_stream(c, storage)
    one = size(f"{p}.a", b"0123456789")
    value = 3 if limit == "max_msgs" else 3 * one + one // 2
    assert put(c, name, p, storage=storage, **{limit: value}).status_code == 200
    for _ in range(5):
        ack(c, f"{p}.a", b"0123456789")
    assert state(c, name) == expect(3, 3 * one, 3, 5, 1)
    error(c.get(f"/v1/streams/{name}/messages/2"), 404, 10037)


def test_max_msgs_per_subject_discard_old(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage, max_msgs_per_subject=2)
    for subject in (f"{p}.a", f"{p}.b", f"{p}.b", f"{p}.b"):
        ack(c, subject)
    assert state(c, name) == expect(3, size(f"{p}.a") + 2 * size(f"{p}.b"), 1, 4, 2, deleted=1)
    for subject in (f"{p}.a", f"{p}.a"):
        ack(c, subject)
    assert state(c, name) == expect(4, 2 * size(f"{p}.a") + 2 * size(f"{p}.b"), 3, 6, 2)


@pytest.mark.parametrize(
    ("limit", "description"), [("max_msgs", "maximum messages exceeded"), ("max_bytes", "maximum bytes exceeded")]
)
def test_limit_with_discard_new(c: httpx.Client, storage: str, limit: str, description: str) -> None:
    name, p = new_stream(c, storage, discard="new")
    one = size(f"{p}.a", b"data")
    value = 2 if limit == "max_msgs" else 2 * one
    assert put(c, name, p, storage=storage, discard="new", **{limit: value}).status_code == 200
    ack(c, f"{p}.a", b"data")
    ack(c, f"{p}.a", b"data")
    error(pub(c, f"{p}.a", b"data"), 503, 10077, description)
    assert state(c, name) == expect(2, 2 * one, 1, 2, 1)
    assert c.delete(f"/v1/streams/{name}/messages/1").status_code == 200
    assert ack(c, f"{p}.a", b"data") == 3  # the refused publish took no sequence


def test_discard_new_per_subject(c: httpx.Client) -> None:
    name, p = new_stream(c, discard="new", max_msgs_per_subject=1, discard_new_per_subject=True)
    assert ack(c, f"{p}.a") == 1
    error(pub(c, f"{p}.a"), 503, 10077, "maximum messages per subject exceeded")
    assert ack(c, f"{p}.b") == 2
    # Without discard_new_per_subject the per-subject limit drops the subject's oldest, even under discard new.
    other, q = new_stream(c, discard="new", max_msgs_per_subject=1)
    assert ack(c, f"{q}.a") == 1 and ack(c, f"{q}.a") == 2
    assert state(c, other) == expect(1, size(f"{q}.a"), 2, 2, 1)


def test_deny_delete_and_deny_purge(c: httpx.Client) -> None:
    name, p = new_stream(c, deny_delete=True, deny_purge=True)
    ack(c, f"{p}.a")
    error(c.delete(f"/v1/streams/{name}/messages/1"), 400, 10057, "message delete not permitted")
    error(c.post(f"/v1/streams/{name}/purge", json={}), 400, 10110, "stream purge not permitted")
    assert state(c, name) == expect(1, size(f"{p}.a"), 1, 1, 1)


# -- reading and deleting messages -------------------------------------------------------------

def test_get_by_sequence(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage)
    headers = [("Nats-Msg-Id", "g1"), ("nats-custom", "v1"), ("Nats-Custom", "v2"), ("X-Not-Stored", "x")]
    assert c.post(f"/v1/publish/{p}.a", content=b"hello", headers=headers).json()["seq"] == 1
    ack(c, f"{p}.b", b"\x00\xff")
    msg = c.get(f"/v1/streams/{name}/messages/1").json()["message"]
    stored = {"Nats-Msg-Id": ["g1"], "Nats-Custom": ["v1", "v2"]}
    want = {"subject": f"{p}.a", "seq": 1, "headers": stored, "data": b64(b"hello")}
    assert {k: v for k, v in msg.items() if k != "time"} == want
    assert msg["time"].endswith("Z")
    plain = c.get(f"/v1/streams/{name}/messages/2").json()["message"]
    assert "headers" not in plain and plain["data"] == b64(b"\x00\xff")
    assert state(c, name)["bytes"] == size(f"{p}.a", b"hello", stored) + size(f"{p}.b", b"\x00\xff")


def test_last_and_next_by_subject(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage)
    for subject in (f"{p}.a", f"{p}.b", f"{p}.a", f"{p}.c.d"):
        ack(c, subject)

    def seq_of(**params: Any) -> int:
        resp = c.get(f"/v1/streams/{name}/messages", params=params)
        assert resp.status_code == 200, resp.text
        return int(resp.json()["message"]["seq"])

    assert seq_of(last_by_subj=f"{p}.a") == 3
    assert seq_of(last_by_subj=f"{p}.b") == 2
    assert seq_of(last_by_subj=f"{p}.*") == 3
    assert seq_of(last_by_subj=f"{p}.>") == 4
    assert seq_of(next_by_subj=f"{p}.a", seq=2) == 3
    assert seq_of(next_by_subj=f"{p}.>", seq=3) == 3
    assert seq_of(next_by_subj=f"{p}.*") == 1
    error(c.get(f"/v1/streams/{name}/messages", params={"next_by_subj": f"{p}.a", "seq": 4}), 404, 10037)
    error(c.get(f"/v1/streams/{name}/messages", params={"last_by_subj": f"{p}.zzz"}), 404, 10037)


def test_delete_message(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage)
    for _ in range(3):
        ack(c, f"{p}.a", b"abc")
    one = size(f"{p}.a", b"abc")
    assert c.delete(f"/v1/streams/{name}/messages/2").json() == {"success": True}
    error(c.get(f"/v1/streams/{name}/messages/2"), 404, 10037, "no message found")
    assert state(c, name) == expect(2, 2 * one, 1, 3, 1, deleted=1)
    error(c.delete(f"/v1/streams/{name}/messages/2"), 400, 10043)
    assert c.delete(f"/v1/streams/{name}/messages/1", params={"no_erase": "true"}).json() == {"success": True}
    assert state(c, name) == expect(1, one, 3, 3, 1)


# -- purge -------------------------------------------------------------------------------------

ABABA = ["a", "b", "a", "b", "a"]
# (id, subjects published as seqs 1..n with data "xy", purge body (filter relative to the prefix), purged, kept seqs)
PURGES = [
    ("all", ["a", "b", "a"], {}, 3, []),
    ("wildcard-filter", ["a.x", "b.y", "b.x", "c"], {"filter": "*.x"}, 2, [2, 4]),
    ("keep", ["a"] * 5, {"keep": 2}, 3, [4, 5]),
    ("keep-all", ["a"] * 2, {"keep": 2}, 0, [1, 2]),
    ("filter-keep", ABABA, {"filter": "a", "keep": 1}, 2, [2, 4, 5]),
    ("filter-seq", ABABA, {"filter": "a", "seq": 3}, 1, [2, 3, 4, 5]),
    ("filter-gt", ["a.x", "b", "a.y"], {"filter": ">"}, 3, []),
    ("seq", ABABA, {"seq": 4}, 3, [4, 5]),
    ("seq-1", ABABA, {"seq": 1}, 0, [1, 2, 3, 4, 5]),
]


@pytest.mark.parametrize(("published", "body", "purged", "kept"), [p[1:] for p in PURGES], ids=[p[0] for p in PURGES])
def test_purge(
    c: httpx.Client, storage: str, published: list[str], body: dict[str, Any], purged: int, kept: list[int]
) -> None:
    name, p = new_stream(c, storage)
    subjects = [f"{p}.{s}" for s in published]
    for i, subject in enumerate(subjects, 1):
        assert ack(c, subject, b"xy") == i
    if "filter" in body:
        body = {**body, "filter": body["filter"] if body["filter"] == ">" else f"{p}.{body['filter']}"}
    resp = c.post(f"/v1/streams/{name}/purge", json=body)
    assert resp.status_code == 200 and resp.json() == {"success": True, "purged": purged}, resp.text
    last = len(subjects)
    first = kept[0] if kept else last + 1  # an emptied stream's first_seq is last_seq + 1
    live = [subjects[seq - 1] for seq in kept]
    held = sum(size(s, b"xy") for s in live)
    deleted = (last - first + 1 - len(kept)) if kept else 0
    assert state(c, name) == expect(len(kept), held, first, last, len(set(live)), deleted)
    for seq in range(1, last + 1):
        got = c.get(f"/v1/streams/{name}/messages/{seq}")
        assert got.status_code == (200 if seq in kept else 404)
    assert ack(c, f"{p}.next", b"xy") == last + 1


def test_purge_sequence_past_the_end_moves_next_sequence(c: httpx.Client, storage: str) -> None:
    name, p = new_stream(c, storage)
    ack(c, f"{p}.a", b"xy")
    ack(c, f"{p}.b", b"xy")
    assert c.post(f"/v1/streams/{name}/purge", json={"seq": 10}).json() == {"success": True, "purged": 2}
    assert state(c, name) == expect(0, 0, 10, 9, 0)
    assert ack(c, f"{p}.a", b"xy") == 10
    assert state(c, name) == expect(1, size(f"{p}.a", b"xy"), 10, 10, 1)
    assert c.post(f"/v1/streams/{name}/purge").json() == {"success": True, "purged": 1}  # an empty body purges all


# -- the batch route ---------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["json", "ndjson"])
def test_batch_mixed_good_and_bad(c: httpx.Client, storage: str, encoding: str) -> None:
    name, p = new_stream(c, storage)
    other, q = new_stream(c, storage)
    els, elss = "Nats-Expected-Last-Sequence", "Nats-Expected-Last-Subject-Sequence"
    two = {"stream": name, "seq": 2}
    cases: list[tuple[dict[str, Any], Any]] = [  # (message, its ack or the err_code of its error)
        ({"subject": f"{p}.a", "text": "one"}, {"stream": name, "seq": 1}),
        ({"subject": f"{p}.*", "text": "wildcard"}, 10003),
        ({"subject": "nobody.here"}, 10059),
        ({"subject": f"{p}.b", "data": b64(b"two"), "headers": {"Nats-Msg-Id": ["m1"]}}, two),
        ({"subject": f"{q}.a", "text": "other stream"}, {"stream": other, "seq": 1}),
        ({"subject": f"{p}.b", "text": "again", "headers": {"nats-msg-id": "m1"}}, {**two, "duplicate": True}),
        ({"subject": f"{p}.c", "data": "%%%"}, 10003),
        ({"subject": f"{p}.c", "text": "three", "headers": {els: ["2"]}}, {"stream": name, "seq": 3}),
        ({"subject": f"{p}.c", "text": "late", "headers": {els: ["2"]}}, 10071),
        ({"subject": f"{p}.d", "headers": {elss: ["0"]}}, {"stream": name, "seq": 4}),
        ({"subject": f"{p}.d", "headers": {elss: ["0"]}}, 10071),
        ({"subject": f"{p}.e", "headers": {"Nats-Expected-Last-Msg-Id": ["m1"]}}, 10070),  # seq 4 has no Msg-Id
    ]
    messages = [m for m, _ in cases]
    if encoding == "json":
        resp = c.post("/v1/publish", json={"messages": messages})
    else:
        lines = b"\n".join(json.dumps(m).encode() for m in messages) + b"\n"
        resp = c.post("/v1/publish", content=lines, headers={"content-type": "application/x-ndjson"})
    assert resp.status_code == 200, resp.text
    acks = resp.json()["acks"]
    assert len(acks) == len(cases)
    for got, (_, want) in zip(acks, cases, strict=True):
        if isinstance(want, int):
            status = 404 if want == 10059 else 400
            assert set(got) == {"error"} and (got["error"]["code"], got["error"]["err_code"]) == (status, want), got
        else:
            assert got == want
    assert acks[8]["error"]["description"] == "wrong last sequence: 3"
    stored = (
        size(f"{p}.a", b"one") + size(f"{p}.b", b"two", {"Nats-Msg-Id": ["m1"]})
        + size(f"{p}.c", b"three", {els: ["2"]}) + size(f"{p}.d", b"", {elss: ["0"]})
    )
    assert state(c, name) == expect(4, stored, 1, 4, 4)
    assert state(c, other) == expect(1, size(f"{q}.a", b"other stream"), 1, 1, 1)
    msg = c.get(f"/v1/streams/{name}/messages/2").json()["message"]
    assert msg["headers"] == {"Nats-Msg-Id": ["m1"]} and msg["data"] == b64(b"two")
    assert ack(c, f"{p}.z") == 5  # refused messages took no sequence


# -- last: creates and deletes streams while the flusher commits ----------------------------------

def test_create_and_delete_streams_while_the_flusher_commits(c: httpx.Client) -> None:
    with httpx.Client(base_url=str(c.base_url), timeout=5.0) as quick:
        for i in range(300):
            assert quick.post("/v1/streams", json={"name": f"D{i}", "subjects": [f"d{i}.>"]}).status_code == 201
            assert quick.post(f"/v1/publish/d{i}.a", content=b"x").status_code == 200
            assert quick.delete(f"/v1/streams/D{i}").json() == {"success": True}  # ReadTimeout once deadlocked
        assert quick.get("/healthz").status_code == 200
