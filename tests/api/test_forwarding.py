"""Forwarding between gateways: a request for a stream another gateway owns is proxied to it and
answered exactly as the owner answers (status, body, JetStream headers), errors included; a stream
this gateway owns is served here; an owner that does not answer gives JetStream's 503 (10008)
within the bound. The owner is a real gateway process; the forwarding one is the real app under
uvicorn on loopback, over a warehouse of its own, told by a fixed locator which streams are elsewhere."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from api.auth import Authenticator
from api.http.app import create_app
from api.http.forwarding import Forwarder
from engine.accounts.config import ServerConfig
from engine.accounts.registry import Accounts
from engine.jetstream import EngineOptions
from tests.gateway import Gateway, free_port

# Bound and never listening, for the module's life: a connection is refused, and no gateway of a test group
# running in parallel can take the port (a port merely found free once was, and answered 400).
_DEAD_SOCKET = socket.socket()
_DEAD_SOCKET.bind(("127.0.0.1", 0))
DEAD = f"http://127.0.0.1:{_DEAD_SOCKET.getsockname()[1]}"


class FixedLocator:
    """Streams named FWD* (and subjects fwd.*) live on the owner; GONE* on a gateway that is down."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def owner_url(self, account: str, stream: str) -> str | None:
        if stream.startswith(("FWD", "KV_fwd")):
            return self.owner
        return DEAD if stream.startswith("GONE") else None

    def stream_for_subject(self, account: str, subject: str) -> str | None:
        return "FWD" if subject.startswith("fwd.") else None

    def stream_subjects(self, account: str) -> list[tuple[str, list[str]]]:
        return [("FWD", ["fwd.>"]), ("GONE1", ["gone.>"]), ("LOCAL", ["local.>"])]

    def peers(self) -> list[str]:
        return [self.owner, DEAD]


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path / "owner" / "warehouse", log_dir=tmp_path).start()
    yield gateway
    gateway.stop()


@pytest.fixture
def front(tmp_path: Path, owner: Gateway, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Accounts]]:
    config = ServerConfig.open()
    accounts = Accounts(tmp_path / "front" / "warehouse", EngineOptions(), config)
    accounts.open()
    app = create_app(accounts, Authenticator(config), locator=FixedLocator(owner.url))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the forwarding gateway did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}", accounts
    server.should_exit = True
    thread.join(timeout=30)


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert (a.status_code, a.content) == (b.status_code, b.content)
    assert a.headers.get("content-type") == b.headers.get("content-type")
    for name in ("nats-stream", "nats-sequence", "nats-subject", "etag"):
        assert a.headers.get(name) == b.headers.get(name)


def test_requests_for_a_stream_owned_elsewhere_are_answered_by_the_owner(
        owner: Gateway, front: tuple[str, Accounts]) -> None:
    url, accounts = front
    with httpx.Client(base_url=url, timeout=30) as via, owner.client() as direct:
        created = via.post("/v1/streams", json={"name": "FWD", "subjects": ["fwd.>"]})
        assert created.status_code in (200, 201), created.text
        assert direct.get("/v1/streams/FWD").json()["config"]["subjects"] == ["fwd.>"]
        acks = [via.post(f"/v1/publish/fwd.{i}", content=f"m{i}".encode()).json() for i in range(5)]
        assert [a["seq"] for a in acks] == [1, 2, 3, 4, 5] and {a["stream"] for a in acks} == {"FWD"}
        for path in ("/v1/streams/FWD", "/v1/streams/FWD/messages/3", "/v1/streams/FWD/messages/99",
                     "/v1/streams/FWD/messages?last_by_subj=fwd.4"):
            first, second = via.get(path), direct.get(path)
            if path == "/v1/streams/FWD":  # its `ts` is the time of the answer
                assert first.json()["state"] == second.json()["state"]
            else:
                _same(first, second)
        assert via.get("/v1/streams/FWD/messages/99").json()["error"]["err_code"] == 10037

        consumer = {"durable_name": "C", "ack_policy": "explicit"}
        assert via.post("/v1/streams/FWD/consumers", json=consumer).status_code in (200, 201)
        got = via.post("/v1/streams/FWD/consumers/C/next", json={"batch": 3, "expires": 2_000_000_000})
        assert got.status_code == 200, got.text
        delivered = got.json()["messages"] if isinstance(got.json(), dict) else got.json()
        assert len(delivered) == 3
        info = direct.get("/v1/streams/FWD/consumers/C").json()
        assert info["delivered"]["stream_seq"] == 3

        kv = via.post("/v1/kv", json={"bucket": "fwd"})
        assert kv.status_code in (200, 201), kv.text
        assert via.put("/v1/kv/fwd/entries/k", content=b"v").status_code == 200
        _same(via.get("/v1/kv/fwd/entries/k"), direct.get("/v1/kv/fwd/entries/k"))

        local = via.post("/v1/streams", json={"name": "LOCAL", "subjects": ["local.>"]})
        assert local.status_code in (200, 201)
        assert direct.get("/v1/streams/LOCAL").status_code == 404  # served here, not forwarded
    (engine,) = accounts.engines()
    assert [s.name for s in engine.streams()] == ["LOCAL"]  # nothing of FWD or KV_fwd was made here


def test_an_owner_that_does_not_answer_gives_jetstreams_503_within_the_bound(
        owner: Gateway, front: tuple[str, Accounts]) -> None:
    url, _ = front
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=60) as via:
        answer = via.get("/v1/streams/GONE")
    took = time.monotonic() - started
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert (error["code"], error["err_code"]) == (503, 10008) and "GONE" in error["description"]
    assert took < Forwarder().timeout + 5  # bounded: retried until the forwarding bound, then answered


def test_account_views_merge_the_owners_answer_and_list_what_nobody_answered_for(
        owner: Gateway, front: tuple[str, Accounts]) -> None:
    """The stream list and account info of the forwarding gateway show its own stream, the owner's,
    and GONE1 (stored, its gateway down) as missing and counted; the dead peer costs at most the bound."""
    url, _ = front
    with httpx.Client(base_url=url, timeout=60) as via:
        assert via.post("/v1/streams", json={"name": "FWD", "subjects": ["fwd.>"]}).status_code in (200, 201)
        assert via.post("/v1/streams", json={"name": "LOCAL", "subjects": ["local.>"]}).status_code in (200, 201)
        assert via.post("/v1/publish/fwd.a", content=b"x").json()["seq"] == 1
        listed = via.get("/v1/streams").json()
        assert [s["config"]["name"] for s in listed["streams"]] == ["FWD", "LOCAL"]
        assert [s["state"]["messages"] for s in listed["streams"]] == [1, 0]
        assert (listed["total"], listed["missing"]) == (2, ["GONE1"])
        info = via.get("/v1/info").json()
        assert (info["streams"], info["consumers"]) == (3, 0)
        assert info["storage"] == sum(s["state"]["bytes"] for s in listed["streams"])
