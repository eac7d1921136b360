"""The core protocol byte for byte against the real nats-server: the same input gives the same output
and the same close (or not). Then what the comparison cannot show by itself: bad input stores nothing
and leaves other connections alone, slow and stalled readers are dropped, thousands of connections."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from tests.gateway import Gateway
from tests.nats.conftest import NatsServer
from tests.nats.wire import Raw, converse

QUIET = b'CONNECT {"verbose":false,"pedantic":false}\r\n'
HEADERS = b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\n'

# Input -> nats-server's answer, compared byte for byte (INFO aside). Each ends with PING unless the
# server closes the connection.
CASES = [
    b"PING\r\n",
    b"ping\r\n",
    b"PING\n",
    b"FOO\r\n",
    b"PUB\r\n",
    b"PUB a\r\n",
    b"PUB a b c d\r\n",
    b"PUB a x\r\n",
    b"PUB a -1\r\n",
    b"PUB a 2\r\nhello\r\n",
    b"PUB a 5\r\nhelloXX",
    b"PUB a 5\r\nhello\r\nPING\r\n",
    b"PUB a 2000000\r\n",
    b"PUB a 1\r\nx\r\r\n",
    b"PUB  a\t 1\r\nx\r\nPING\r\n",
    b"HPUB a 12 10\r\n",
    b"SUB\r\n",
    b"SUB a\r\n",
    b"SUB a b c d\r\n",
    b"SUB a..b 1\r\nPING\r\n",
    b"SUB a.>.b 1\r\nPING\r\n",
    b"SUB foo 1\r\nSUB foo 1\r\nPUB foo 1\r\nx\r\nPING\r\n",
    b"SUB a 1\r\nPUB a 0\r\n\r\nPING\r\n",
    b"UNSUB\r\n",
    b"UNSUB 99\r\nPING\r\n",
    b"MSG a 1 1\r\nx\r\n",
    b"-ERR 'x'\r\n",
    b"+OK\r\nPING\r\n",
    b"PONG\r\nPING\r\n",
    b"INFO {}\r\nPING\r\n",
    b"PUB " + b"a" * 5000 + b" 1\r\n",
    b"P" * 5000,
    b"CONNECT {bad\r\n",
    b'CONNECT {"verbose":true}\r\nPING\r\n',
    b"CONNECT {}\r\nPING\r\n",
    b'CONNECT {"verbose":false,"protocol":2}\r\n',
    b'CONNECT {"verbose":false,"no_responders":true}\r\n',
    b'CONNECT {"verbose":false,"account":"x"}\r\n',
    b'CONNECT {"verbose":false,"pedantic":true}\r\nPUB a.* 1\r\nx\r\nPING\r\n',
    b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\nSUB r 1\r\nPUB x r 1\r\nx\r\nPING\r\n',
    b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\nSUB r.* 1\r\nPUB x r.a 1\r\nx\r\nPING\r\n',
    QUIET + b"SUB r 1\r\nHPUB r 12 14\r\nNATS/1.0\r\n\r\nhi\r\nPING\r\n",
    HEADERS + b"SUB r 1\r\nHPUB r 18 20\r\nNATS/1.0\r\nA: b\r\n\r\nhi\r\nPING\r\n",
    QUIET + b"SUB r 1\r\nHPUB r x 18 20\r\nNATS/1.0\r\nA: b\r\n\r\nhi\r\nPING\r\n",
    HEADERS + b"HPUB a 11 11\r\nNATS/1.0\r\n\r\n",
    HEADERS + b"HPUB a 3 1\r\nx\r\n",
    b'CONNECT {"verbose":false,"echo":false}\r\nSUB r 1\r\nPUB r 1\r\nx\r\nPING\r\n',
    QUIET + b"SUB r 1\r\nUNSUB 1 2\r\nPUB r 1\r\nx\r\nPUB r 1\r\ny\r\nPUB r 1\r\nz\r\nPING\r\n",
    QUIET + b"SUB r 1\r\nPUB r 1\r\nx\r\nUNSUB 1 1\r\nPUB r 1\r\ny\r\nPING\r\n",
    QUIET + b"SUB a 1\r\nPUB a b 1\r\nx\r\nPING\r\n",
    QUIET + b"SUB a.* 1\r\nSUB a.> 2\r\nSUB > 3\r\nPUB a.b 1\r\nx\r\nPUB a.b.c 1\r\ny\r\nPUB a 1\r\nz\r\nPING\r\n",
    QUIET + b"SUB a.* 1\r\nPUB a.> 1\r\nx\r\nPUB a.* 1\r\ny\r\nPING\r\n",
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, NatsServer]]:
    root = tmp_path_factory.mktemp("protocol")
    (root / "warehouse").mkdir()
    gateway = Gateway(root / "warehouse").start()
    nats_server = NatsServer(root / "nats-store")
    yield gateway, nats_server
    gateway.stop()
    nats_server.stop()


@pytest.mark.parametrize("data", CASES, ids=[c[:48].decode("latin-1") for c in CASES])
def test_same_answer_and_close_as_nats_server(servers: tuple[Gateway, NatsServer], data: bytes) -> None:
    gateway, nats_server = servers
    assert converse(gateway.nats_port, data) == converse(nats_server.port, data)


def test_info_carries_what_clients_read(servers: tuple[Gateway, NatsServer]) -> None:
    import orjson

    raw = Raw(servers[0].nats_port)
    assert raw.info.startswith(b"INFO {") and raw.info.endswith(b"} \r\n")
    info = orjson.loads(raw.info[5:-3])
    raw.close()
    assert info["proto"] == 1 and info["headers"] is True and info["jetstream"] is True
    assert info["max_payload"] == 1024 * 1024 and info["port"] == servers[0].nats_port
    major, minor, _ = (int(x) for x in info["version"].split("."))
    assert (major, minor) >= (2, 9), "nats.py uses the named consumer-create subjects from 2.9 on"
    assert info["server_id"].startswith("N") and len(info["server_id"]) == 56


def test_queue_group_delivers_to_one_member_and_plain_subscribers_all(servers: tuple[Gateway, NatsServer]) -> None:
    raw = Raw(servers[0].nats_port)
    out, closed = raw.converse(QUIET + b"SUB r q 1\r\nSUB r q 2\r\nSUB r 3\r\n" + b"PUB r 1\r\nx\r\n" * 20 + b"PING\r\n")
    raw.close()
    lines = [line for line in out.split(b"\r\n") if line.startswith(b"MSG")]
    assert not closed
    assert lines.count(b"MSG r 3 1") == 20
    assert lines.count(b"MSG r 1 1") + lines.count(b"MSG r 2 1") == 20


def test_request_reply_between_clients_and_no_responders(servers: tuple[Gateway, NatsServer]) -> None:
    async def scenario() -> None:
        server = await nats.connect(servers[0].nats_url)
        client = await nats.connect(servers[0].nats_url)

        async def echo(msg: nats.aio.msg.Msg) -> None:
            await msg.respond(b"re:" + msg.data)

        await server.subscribe("svc.echo", cb=echo, queue="workers")
        await server.flush()
        answers = [await client.request("svc.echo", b"%d" % i, timeout=2) for i in range(50)]
        assert [a.data for a in answers] == [b"re:%d" % i for i in range(50)]
        with pytest.raises(nats.errors.NoRespondersError):
            await client.request("nobody.home", b"?", timeout=2)
        await server.close()
        await client.close()

    asyncio.run(scenario())


# -- bad input ----------------------------------------------------------------------------------


def _stored(gateway: Gateway, stream: str) -> int:
    return int(httpx.get(f"{gateway.url}/v1/streams/{stream}").json()["state"]["messages"])


def test_rejected_publishes_store_nothing_and_other_connections_go_on(servers: tuple[Gateway, NatsServer]) -> None:
    gateway = servers[0]
    assert httpx.post(f"{gateway.url}/v1/streams", json={"name": "BAD", "subjects": ["bad.>"]}).status_code == 201
    bystander = Raw(gateway.nats_port)
    bystander.converse(QUIET + b"SUB bad.> 1\r\nPING\r\n")
    attempts = [
        b"PUB bad.x 2000000\r\n" + b"x" * 100,  # over max_payload
        b"PUB bad.x 5\r\nhelloWORLD\r\n",  # wrong byte count
        b"PUB bad.x 3\r\nabc\n",  # payload not followed by CRLF
        b"HPUB bad.x 12 14\r\nNATS/1.0\r\n\r\nhi\r\n",  # headers not negotiated
        b"PUBX bad.x 1\r\nx\r\n",  # unknown verb
        b"PUB bad.x " + b"9" * 20 + b"\r\n",  # absurd size
        b"PUB bad.x 1 2 3 4\r\nx\r\n",  # wrong argument count
    ]
    for data in attempts:
        out, closed = converse(gateway.nats_port, QUIET + data)
        assert closed, data
    out, closed = bystander.converse(b"PUB bad.ok 2\r\nok\r\nPING\r\n")
    assert not closed and b"MSG bad.ok 1 2\r\nok\r\n" in out
    deadline = time.monotonic() + 10
    while _stored(gateway, "BAD") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _stored(gateway, "BAD") == 1, "only the valid publish was stored"
    bystander.close()


def test_a_reader_that_stops_reading_is_dropped_and_others_are_served(servers: tuple[Gateway, NatsServer]) -> None:
    gateway = servers[0]
    stalled = socket.create_connection(("127.0.0.1", gateway.nats_port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(QUIET + b"SUB flood 1\r\nPING\r\n")
    publisher = Raw(gateway.nats_port)
    publisher.converse(QUIET + b"PING\r\n")
    payload = b"x" * 60_000
    chunk = b"PUB flood 60000\r\n" + payload + b"\r\n"
    dropped = False
    deadline = time.monotonic() + 60
    sent = 0
    while time.monotonic() < deadline and not dropped:
        publisher.send(chunk * 50)
        sent += 50 * 60_000
        if sent % (30 * 1024 * 1024) < 50 * 60_000:
            dropped = _peer_closed(stalled)
        if sent > 200 * 1024 * 1024:
            dropped = _wait_closed(stalled, deadline)
    assert dropped, "the stalled subscriber was not dropped (64 MiB pending or 10 s without draining)"
    out, closed = publisher.converse(b"PING\r\n")
    assert not closed and out.endswith(b"PONG\r\n")
    stalled.close()
    publisher.close()


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock`, seen from writes (a read would drain it and end the stall)."""
    try:
        sock.send(b"PING\r\n", socket.MSG_DONTWAIT)
        time.sleep(0.01)
        sock.send(b"PING\r\n", socket.MSG_DONTWAIT)
    except (BrokenPipeError, ConnectionResetError):
        return True
    except BlockingIOError:
        return False
    return False


def _wait_closed(sock: socket.socket, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if _peer_closed(sock):
            return True
        time.sleep(0.1)
    return False


def test_two_thousand_connections_each_answered(servers: tuple[Gateway, NatsServer]) -> None:
    gateway = servers[0]
    socks = []
    try:
        for _ in range(2000):
            s = socket.create_connection(("127.0.0.1", gateway.nats_port), timeout=10)
            socks.append(s)
        for s in socks:
            s.sendall(QUIET + b"PING\r\n")
        for s in socks:
            got = b""
            while not got.endswith(b"PONG\r\n"):
                chunk = s.recv(4096)
                assert chunk, "a connection was closed"
                got += chunk
            assert got.startswith(b"INFO ")
    finally:
        for s in socks:
            s.close()
    out, closed = converse(gateway.nats_port, QUIET + b"PING\r\n")
    assert not closed and out == b"PONG\r\n"
