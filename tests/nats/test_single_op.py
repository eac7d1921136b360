"""A single operation's round trip on the NATS door: the answer leaves in the read that asked for it.

A sync publisher (`nats bench js pub sync`, nats.go's `js.Publish`) and a KV get wait for one reply
each; their latency is one round trip. The door writes the PubAck, or the KV get's message, within the
`data_received` of the request (no loop iteration in between), on a socket without Nagle's delay
(TCP_NODELAY, as nats-server's Go sockets). The server here is the door itself on a real loop, a real
engine and real loopback sockets; the client is a plain blocking socket, read while the loop is held:
an answer that needed another loop iteration would not be there.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import uvloop

from api.nats.connection import Connection
from api.nats.server import NatsServer
from api.waiters import Waiters
from engine import EngineOptions, JetStream
from engine.accounts.config import ServerConfig
from engine.accounts.registry import Account, Accounts
from engine.store.objectstore import WarehouseLocation

INBOX = b"_INBOX.t."


class _Gate:
    """The waiters of each account (the HTTP door's gate does this in the gateway)."""

    def __init__(self) -> None:
        self._waiters: dict[str, Waiters] = {}

    def waiters_of(self, account: Account) -> Waiters:
        found = self._waiters.get(account.name)
        if found is None:
            found = self._waiters[account.name] = Waiters()
            found.bind(asyncio.get_running_loop())
        return found


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


def _read_reply(client: socket.socket, count: int) -> bytes:
    """`count` MSGs (a control line and a payload line each), read without running the loop."""
    data = b""
    while data.count(b"\r\n") < 2 * count:
        chunk = client.recv(65536)
        assert chunk, "the door closed the connection"
        data += chunk
    return data


@asynccontextmanager
async def connected_door(accounts: Accounts) -> AsyncIterator[tuple[Connection, socket.socket, JetStream]]:
    """A real door on a loopback port with one plain socket client: its INFO read, CONNECT sent (headers on,
    not verbose) and `_INBOX.t.*` subscribed as sid 1. Yields the door's connection, the client (blocking,
    reads bounded at 10 s) and the account's engine; stops the door afterwards."""
    door = NatsServer(accounts, port=0)
    await door.start(_Gate())
    client = socket.create_connection(("127.0.0.1", door.port), timeout=10)
    try:
        await _until(lambda: len(door.connections) == 1, "the connection")
        conn: Connection = next(iter(door.connections.values()))
        info = b""
        while not info.endswith(b"\r\n"):  # written on accepting
            chunk = client.recv(65536)
            assert chunk, "the door closed the connection"
            info += chunk
        assert info.startswith(b"INFO ")
        client.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\nSUB _INBOX.t.* 1\r\n')
        await _until(lambda: b"1" in conn.subs, "the inbox subscription")
        assert conn.space is not None and conn.space.engine is not None
        yield conn, client, conn.space.engine
    finally:
        client.close()
        await door.stop()


def run_with_door(tmp_path: Path, scenario: Callable[[Connection, socket.socket, JetStream], Awaitable[None]]) -> None:
    """Runs `scenario` on uvloop against `connected_door` over a fresh warehouse under `tmp_path`."""
    accounts = Accounts(WarehouseLocation.parse(str(tmp_path / "warehouse")), EngineOptions(), ServerConfig.open())
    accounts.open()

    async def run() -> None:
        async with connected_door(accounts) as (conn, client, engine):
            await scenario(conn, client, engine)

    try:
        uvloop.run(run())
    finally:
        accounts.close()


def test_a_lone_publish_and_a_kv_get_are_answered_within_their_read(tmp_path: Path) -> None:
    async def scenario(conn: Connection, client: socket.socket, engine: JetStream) -> None:
        assert conn.transport is not None
        server_socket = conn.transport.get_extra_info("socket")
        assert server_socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        engine.add_stream({"name": "S", "subjects": ["s"]})
        engine.add_stream({"name": "KV_b", "subjects": ["$KV.b.>"], "allow_direct": True, "max_msgs_per_subject": 1})

        # The loop runs nothing between the read and the client's recv: the answer is already written.
        conn.data_received(b"PUB s " + INBOX + b"1 5\r\nhello\r\n")
        reply = _read_reply(client, 1)
        head, _, body = reply.partition(b"\r\n")
        assert head.startswith(b"MSG _INBOX.t.1 1 ")
        assert orjson.loads(body.rstrip(b"\r\n")) == {"stream": "S", "seq": 1}

        conn.data_received(b"PUB $KV.b.k " + INBOX + b"2 3\r\nabc\r\n")
        assert orjson.loads(_read_reply(client, 1).split(b"\r\n")[1]) == {"stream": "KV_b", "seq": 1}
        engine.flush()  # the get reads the table, as after a flush
        conn.data_received(b"PUB $JS.API.DIRECT.GET.KV_b.$KV.b.k " + INBOX + b"3 0\r\n\r\n")
        got = b""
        while not got.endswith(b"abc\r\n"):
            chunk = client.recv(65536)
            assert chunk, "the door closed the connection"
            got += chunk
        assert got.startswith(b"HMSG _INBOX.t.3 1 ")
        assert b"Nats-Stream: KV_b\r\nNats-Subject: $KV.b.k\r\nNats-Sequence: 1\r\n" in got

    run_with_door(tmp_path, scenario)
