"""Account limits through a real gateway, at each boundary, with nats-server's error codes; AccountInfo
reports the account's real usage and limits."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.api.security_setup import basic
from tests.gateway import Gateway

CONFIG = """
accounts {
  COUNTS { jetstream { max_streams: 2, max_consumers: 1, max_ack_pending: 5 }, users: [ {user: counts, password: p} ] }
  BYTES { jetstream { max_file: 2000, max_mem: 0 }, users: [ {user: bytes, password: p} ] }
  REQUIRED { jetstream { max_bytes_required: true, store_max_stream_bytes: 1000, mem_max_stream_bytes: 100 },
             users: [ {user: required, password: p} ] }
  USAGE { jetstream { max_file: 300, max_mem: 200 }, users: [ {user: usage, password: p} ] }
}
"""
COUNTS, BYTES, REQUIRED, USAGE = (basic(u, "p") for u in ("counts", "bytes", "required", "usage"))


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    folder = tmp_path_factory.mktemp("limits")
    (folder / "warehouse").mkdir()
    (folder / "limits.conf").write_text(CONFIG)
    gw = Gateway(folder / "warehouse", "--config", str(folder / "limits.conf")).start()
    try:
        with gw.client() as client:
            yield client
    finally:
        gw.stop()


def refused(response: httpx.Response, err_code: int, status: int = 400) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["err_code"] == err_code and error["code"] == status
    return str(error["description"])


def stream(c: httpx.Client, who: dict[str, str], name: str, **config: object) -> httpx.Response:
    return c.post("/v1/streams", json={"name": name, "subjects": [f"{name.lower()}.>"], **config}, headers=who)


def test_max_streams(c: httpx.Client) -> None:
    assert stream(c, COUNTS, "S1").status_code == 201 and stream(c, COUNTS, "S2").status_code == 201
    assert refused(stream(c, COUNTS, "S3"), 10027) == "maximum number of streams reached"
    assert stream(c, COUNTS, "S2").status_code == 200  # the same stream again is not another
    assert refused(c.post("/v1/kv", json={"bucket": "k"}, headers=COUNTS), 10027)  # a bucket is a stream


def test_max_consumers_is_per_stream(c: httpx.Client) -> None:
    assert refused(stream(c, COUNTS, "S1", max_consumers=2), 10026) == "maximum consumers limit reached"
    for name in ("S1", "S2"):
        create = c.post(f"/v1/streams/{name}/consumers", json={"durable_name": "one", "ack_policy": "explicit"}, headers=COUNTS)
        assert create.status_code == 201, create.text
    second = c.post("/v1/streams/S1/consumers", json={"durable_name": "two", "ack_policy": "explicit"}, headers=COUNTS)
    refused(second, 10026)


def test_max_ack_pending(c: httpx.Client) -> None:
    info = c.get("/v1/streams/S1/consumers/one", headers=COUNTS).json()
    assert info["config"]["max_ack_pending"] == 5  # the default of 1000 lowered to the account's cap
    c.delete("/v1/streams/S2/consumers/one", headers=COUNTS).raise_for_status()
    over = c.post("/v1/streams/S2/consumers", json={"durable_name": "x", "ack_policy": "explicit", "max_ack_pending": 6}, headers=COUNTS)
    assert refused(over, 10121) == "consumer max ack pending exceeds system limit of 5"
    at = c.post("/v1/streams/S2/consumers", json={"durable_name": "x", "ack_policy": "explicit", "max_ack_pending": 5}, headers=COUNTS)
    assert at.status_code == 201, at.text


def test_reserved_bytes_against_max_storage_and_max_memory(c: httpx.Client) -> None:
    assert stream(c, BYTES, "R1", max_bytes=1500).status_code == 201
    assert refused(stream(c, BYTES, "R2", max_bytes=501), 10047) == "insufficient storage resources available"
    assert stream(c, BYTES, "R2", max_bytes=500).status_code == 201  # 1500 + 500 = 2000: all of it
    assert refused(stream(c, BYTES, "R3"), 10047)  # an unlimited stream needs a byte: none left
    grow = c.put("/v1/streams/R1", json={"name": "R1", "subjects": ["r1.>"], "max_bytes": 1502}, headers=BYTES)
    refused(grow, 10047)
    shrink = c.put("/v1/streams/R1", json={"name": "R1", "subjects": ["r1.>"], "max_bytes": 1000}, headers=BYTES)
    assert shrink.status_code == 200, shrink.text
    assert refused(stream(c, BYTES, "M1", storage="memory", max_bytes=10), 10028) == "insufficient memory resources available"
    info = c.get("/v1/info", headers=BYTES).json()
    assert stream(c, BYTES, "R3").status_code == 201
    info = c.get("/v1/info", headers=BYTES).json()
    assert info["reserved_storage"] == 1500 and info["limits"]["max_storage"] == 2000 and info["limits"]["max_memory"] == 0


def test_max_bytes_required_and_max_stream_bytes(c: httpx.Client) -> None:
    assert refused(stream(c, REQUIRED, "Q1"), 10113) == "account requires a stream config to have max bytes set"
    assert refused(stream(c, REQUIRED, "Q1", max_bytes=1001), 10122) == "stream max bytes exceeds account limit max stream bytes"
    assert stream(c, REQUIRED, "Q1", max_bytes=1000).status_code == 201
    assert refused(stream(c, REQUIRED, "Q2", storage="memory", max_bytes=101), 10122)
    assert stream(c, REQUIRED, "Q2", storage="memory", max_bytes=100).status_code == 201


def test_publishes_stop_at_the_accounts_bytes(c: httpx.Client) -> None:
    assert stream(c, USAGE, "P").status_code == 201
    assert stream(c, USAGE, "PM", storage="memory").status_code == 201
    payload = b"x" * (100 - len("p.x") - 16)  # a stored size of exactly 100 bytes
    for _ in range(3):
        assert c.post("/v1/publish/p.x", content=payload, headers=USAGE).status_code == 200
    over = c.post("/v1/publish/p.x", content=payload, headers=USAGE)
    assert refused(over, 10002) == "resource limits exceeded for account"
    batch = c.post("/v1/publish", json={"messages": [{"subject": "p.x", "text": "y"}]}, headers=USAGE).json()["acks"]
    assert batch[0]["error"]["err_code"] == 10002
    memory = b"m" * (100 - len("pm.x") - 16)
    assert [c.post("/v1/publish/pm.x", content=memory, headers=USAGE).status_code for _ in range(3)] == [200, 200, 400]
    info = c.get("/v1/info", headers=USAGE).json()
    assert (info["storage"], info["memory"], info["streams"]) == (300, 200, 2)
    assert info["limits"] == {
        "max_memory": 200, "max_storage": 300, "max_streams": -1, "max_consumers": -1, "max_ack_pending": -1,
        "memory_max_stream_bytes": -1, "storage_max_stream_bytes": -1, "max_bytes_required": False,
    }
    assert c.get("/v1/streams/P", headers=USAGE).json()["state"]["messages"] == 3
