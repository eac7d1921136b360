"""Accounts over NATS: each user lands in its own account's subjects, engine and JetStream API.

One config of three accounts — A and B with JetStream and each a stream named ORDERS, C without
JetStream — runs on a real gateway and on the real nats-server, and the same scenario is checked on
both: the two ORDERS streams are apart, core publish/subscribe does not cross accounts, a user with
narrow permissions in B reads B's stream and is refused the rest with nats-server's violation text,
and C's API requests are answered with 10039 (pulls have no responders). On JetLake
the HTTP door then shows B's user B's stream: one account, both doors.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.errors import NoRespondersError
from nats.js.errors import APIError

from tests.gateway import Gateway
from tests.nats.conftest import NatsServer

CONFIG = """
jetstream { store_dir: "%s" }
accounts {
  A { jetstream: enabled, users: [ { user: alice, password: a1 } ] }
  B {
    jetstream: enabled
    users: [
      { user: bob, password: b1 }
      { user: carol, password: c1, permissions: { publish: ["$JS.API.INFO", "$JS.API.STREAM.INFO.>"], subscribe: "_INBOX.>" } }
    ]
  }
  C { users: [ { user: dave, password: d1 } ] }
}
"""


async def _connect(url: str, user: str, password: str, errors: list[str] | None = None) -> Any:
    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(url, user=user, password=password, max_reconnect_attempts=0, error_cb=on_error)


async def _scenario(url: str) -> None:
    alice, bob, dave = await _connect(url, "alice", "a1"), await _connect(url, "bob", "b1"), await _connect(url, "dave", "d1")
    carol_errors: list[str] = []
    carol = await _connect(url, "carol", "c1", carol_errors)
    try:
        ja, jb = alice.jetstream(timeout=10), bob.jetstream(timeout=10)
        await ja.add_stream(name="ORDERS", subjects=["orders.*"])
        await jb.add_stream(name="ORDERS", subjects=["orders.*"])
        for i in range(3):
            assert (await ja.publish("orders.a", b"A%d" % i)).seq == i + 1
        for i in range(5):
            assert (await jb.publish("orders.b", b"B%d" % i)).seq == i + 1
        assert (await ja.stream_info("ORDERS")).state.messages == 3
        assert (await jb.stream_info("ORDERS")).state.messages == 5
        assert (await ja.get_msg("ORDERS", 1)).data == b"A0"
        assert (await ja.account_info()).streams == 1

        # Core pub/sub: the same subject in two accounts is two subjects.
        sub_a, sub_b = await alice.subscribe("chat.>"), await bob.subscribe("chat.>")
        await alice.flush()
        await bob.flush()
        await bob.publish("chat.x", b"from B")
        await bob.flush()  # routed before alice publishes: had it crossed, it would reach alice first
        await alice.publish("chat.x", b"from A")
        assert (await sub_a.next_msg(timeout=5)).data == b"from A"
        assert (await sub_b.next_msg(timeout=5)).data == b"from B"
        async def answer(msg: Any) -> None:
            await msg.respond(b"A answers")

        reply_sub = await alice.subscribe("svc.echo", cb=answer)
        await alice.flush()
        with pytest.raises(NoRespondersError):
            await bob.request("svc.echo", b"?", timeout=5)  # A's service is not B's
        assert (await alice.request("svc.echo", b"?", timeout=5)).data == b"A answers"
        await reply_sub.unsubscribe()

        # A narrow user of B: B's stream, and the violation text for what it may not publish.
        jc = carol.jetstream(timeout=10)
        assert (await jc.stream_info("ORDERS")).state.messages == 5
        denied = asyncio.ensure_future(jc.add_stream(name="NEW", subjects=["new.*"]))
        deadline = asyncio.get_running_loop().time() + 10
        while not carol_errors and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        denied.cancel()
        assert any('permissions violation for publish to "$js.api.stream.create.new"' in e.lower() for e in carol_errors), carol_errors
        assert [s.config.name for s in await jb.streams_info()] == ["ORDERS"], "nothing was created by the refused request"

        # C has no JetStream: INFO says so with 10039; nothing else listens.
        jd = dave.jetstream(timeout=10)
        with pytest.raises(APIError) as info:
            await jd.account_info()
        assert (info.value.code, info.value.err_code) == (503, 10039)
        with pytest.raises(APIError) as names:
            await jd.stream_info("ORDERS")
        assert (names.value.code, names.value.err_code) == (503, 10039)
        with pytest.raises(NoRespondersError):
            await dave.request("$JS.API.CONSUMER.MSG.NEXT.ORDERS.x", b"", timeout=5)
        got = await dave.subscribe("orders.*")
        await dave.publish("orders.c", b"core only")
        assert (await got.next_msg(timeout=5)).data == b"core only"
        assert (await ja.stream_info("ORDERS")).state.messages == 3, "C's publish reached no stream of A"
    finally:
        for nc in (alice, bob, carol, dave):
            await nc.close()


def _config(tmp_path: Path, store: Path) -> Path:
    path = tmp_path / "accounts.conf"
    path.write_text(CONFIG % store)
    return path


def test_accounts_on_jetlake(tmp_path: Path) -> None:
    gateway = Gateway(tmp_path / "warehouse", "--config", str(_config(tmp_path, tmp_path / "warehouse")), "--flush-interval", "0.2").start(timeout=60)
    try:
        asyncio.run(asyncio.wait_for(_scenario(gateway.nats_url), 90))
        with httpx.Client(base_url=gateway.url, timeout=30) as http:
            seen = http.get("/v1/streams/ORDERS", auth=("bob", "b1")).json()
            assert seen["state"]["messages"] == 5, "the HTTP door shows bob B's stream"
            seen = http.get("/v1/streams/ORDERS", auth=("alice", "a1")).json()
            assert seen["state"]["messages"] == 3
    finally:
        gateway.stop()


def test_accounts_on_nats_server(tmp_path: Path) -> None:
    """The same scenario on nats-server: what the JetLake test asserts is nats-server's behaviour."""
    server = NatsServer(tmp_path / "ns", _config(tmp_path, tmp_path / "ns"))
    try:
        asyncio.run(asyncio.wait_for(_scenario(server.url), 90))
    finally:
        server.stop()
