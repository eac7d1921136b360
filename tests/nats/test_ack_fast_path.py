"""The plain-ack fast path (a `+ACK` PUB to `$JS.ACK.…` without a reply, taken before the general
publish): it acks exactly the message its subject names, keeps the publish permission check and its
-ERR, and steps aside when the general way does more (a subscriber of the ack subject, `verbose`).
A read of many acks — the plain ones of one consumer matched whole — applies each exactly once,
wherever the reads are cut, and leaves every other ack to the general way.

The door runs in-process on real engines, with a config of a user who may ack and subscribe to ack
subjects, one who may only pull, one who may ack only stream sequence 1 and one without
permissions; the wire is a raw socket.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from api.auth import Authenticator
from api.http.gate import Gate
from api.nats.server import NatsServer
from api.nats.subscriptions import Sublist, Subscription
from engine import EngineOptions, JetStream
from engine.accounts.config import loads
from engine.accounts.registry import Accounts
from engine.messages import InboundMessage

CONFIG = """
accounts {
  default {
    jetstream: enabled
    users: [
      { user: worker, password: w, permissions: { publish: ["$JS.API.>", "$JS.ACK.S.C.>"], subscribe: ["_INBOX.>", "$JS.ACK.>"] } }
      { user: reader, password: r, permissions: { publish: ["$JS.API.>"], subscribe: ["_INBOX.>"] } }
      { user: first, password: f, permissions: { publish: ["$JS.API.>", "$JS.ACK.S.C.*.1.>"], subscribe: ["_INBOX.>"] } }
      { user: free, password: x }
    ]
  }
}
"""
MSG = re.compile(rb"MSG s 1 (\S+) 2\r\nm\d\r\n")


class Client:
    """A raw connection: what it sends, and reads up to a PONG."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def converse(self, data: bytes) -> bytes:
        self.writer.write(data + b"PING\r\n")
        await self.writer.drain()
        out = b""
        while not out.endswith(b"PONG\r\n"):
            chunk = await asyncio.wait_for(self.reader.read(65536), 10)
            assert chunk, f"closed after {out!r}"
            out += chunk
        return out


@asynccontextmanager
async def _door(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, JetStream]]:
    """The door, with stream S (subject `s`, 40 messages) and explicit-ack pull consumer C."""
    config = loads(CONFIG)
    accounts = Accounts(tmp_path / "warehouse", EngineOptions(), config)
    accounts.open(start_flusher=False)
    auth = Authenticator(config)
    gate = Gate(accounts, auth)
    gate.bind(asyncio.get_running_loop())
    server = NatsServer(accounts, port=0, auth=auth)
    await server.start(gate)
    account = accounts.get("default")
    assert account is not None and account.engine is not None
    engine = account.engine
    engine.add_stream({"name": "S", "subjects": ["s"]})
    engine.publish([InboundMessage("s", b"m%d" % (i % 10)) for i in range(1, 41)])
    engine.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit", "ack_wait": 3600 * 10**9}, "C")
    try:
        yield server, engine
    finally:
        await server.stop()
        accounts.close()


@asynccontextmanager
async def _client(server: NatsServer, user: str, password: str, verbose: bool = False) -> AsyncIterator[Client]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    await reader.readline()  # INFO
    client = Client(reader, writer)
    flags = b"true" if verbose else b"false"
    login = b'CONNECT {"verbose":%b,"pedantic":false,"user":"%b","pass":"%b"}\r\n' % (flags, user.encode(), password.encode())
    assert (await client.converse(login)).endswith(b"PONG\r\n")
    try:
        yield client
    finally:
        writer.close()


async def _pull(client: Client, batch: int) -> list[bytes]:
    """The ack subjects of a pull's `batch` messages, in order."""
    body = b'{"batch":%d,"no_wait":true}' % batch
    out = await client.converse(b"SUB _INBOX.t 1\r\nPUB $JS.API.CONSUMER.MSG.NEXT.S.C _INBOX.t %d\r\n%b\r\n" % (len(body), body))
    while len(MSG.findall(out)) < batch:
        out += await client.converse(b"")
    return MSG.findall(out)[:batch]


async def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


def _pending(engine: JetStream) -> set[int]:
    return set(engine.consumers.get(engine.stream("S"), "C").state.pending)


def test_plain_ack_acks_exactly_its_message(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _door(tmp_path) as (server, engine), _client(server, "worker", "w") as worker:
            replies = await _pull(worker, 3)
            assert _pending(engine) == {1, 2, 3}
            space = server.spaces["default"]
            assert space.plain_ack_of(replies[1], b"+ACK")[:3] == ("S", "C", 2), "the fast path takes this ack"
            assert await worker.converse(b"PUB %b 4\r\n+ACK\r\n" % replies[1]) == b"PONG\r\n"
            await _until(lambda: _pending(engine) == {1, 3}, "the second message acked, the others pending")
            info = engine.consumers.get(engine.stream("S"), "C").state
            assert info.ack_floor_stream_seq == 0
            assert await worker.converse(b"PUB %b 0\r\n\r\n" % replies[0]) == b"PONG\r\n"  # an empty ack is a plain ack
            await _until(lambda: _pending(engine) == {3}, "the first message acked")
            assert engine.consumers.get(engine.stream("S"), "C").state.ack_floor_stream_seq == 2

    asyncio.run(scenario())


def test_ack_without_permission_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _door(tmp_path) as (server, engine), _client(server, "reader", "r") as reader:
            replies = await _pull(reader, 2)
            assert server.spaces["default"].plain_ack_of(replies[0], b"+ACK") is not None, "the fast path would take it"
            out = await reader.converse(b"PUB %b 4\r\n+ACK\r\n" % replies[0])
            assert out == b"-ERR 'Permissions Violation for Publish to \"%b\"'\r\nPONG\r\n" % replies[0]
            assert await reader.converse(b"") == b"PONG\r\n"  # the connection stays open
            assert _pending(engine) == {1, 2}
            assert engine.consumers.get(engine.stream("S"), "C").state.ack_floor_stream_seq == 0

    asyncio.run(scenario())


def test_a_subscriber_of_ack_subjects_still_hears_them(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            _door(tmp_path) as (server, engine),
            _client(server, "worker", "w") as worker,
            _client(server, "worker", "w") as monitor,
        ):
            replies = await _pull(worker, 2)
            space = server.spaces["default"]
            assert await monitor.converse(b"SUB $JS.ACK.> 9\r\n") == b"PONG\r\n"
            assert space.sublist.ack_interest == 1 and space.plain_ack_of(replies[0], b"+ACK") is None
            assert await worker.converse(b"PUB %b 4\r\n+ACK\r\n" % replies[0]) == b"PONG\r\n"
            heard = await monitor.converse(b"")
            assert heard == b"MSG %b 9 4\r\n+ACK\r\nPONG\r\n" % replies[0]
            await _until(lambda: _pending(engine) == {2}, "the ack applied as well")
            assert await monitor.converse(b"UNSUB 9\r\n") == b"PONG\r\n"
            assert space.sublist.ack_interest == 0 and space.plain_ack_of(replies[1], b"+ACK")[:3] == ("S", "C", 2)

    asyncio.run(scenario())


def test_verbose_client_gets_its_ok_and_the_ack(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _door(tmp_path) as (server, engine), _client(server, "worker", "w", verbose=True) as worker:
            replies = await _pull(worker, 1)
            assert await worker.converse(b"PUB %b 4\r\n+ACK\r\n" % replies[0]) == b"+OK\r\nPONG\r\n"
            await _until(lambda: _pending(engine) == set(), "the ack applied")

    asyncio.run(scenario())


def test_sublist_counts_the_subscriptions_that_may_hear_acks() -> None:
    sublist = Sublist()
    may = ["$JS.ACK.>", ">", "$JS.>", "*.ACK.>", "$JS.*.S.C.*.*.*.*.*", "*.*.>", "$JS.ACK.S.C.1.2.3.4.5"]
    never = ["_INBOX.x.*", "$JS.API.>", "$JS.ACK", "$KV.>", "a.>", "$JS.FC.>"]
    subs = [Subscription(None, subject, None, b"%d" % i) for i, subject in enumerate(may + never)]  # type: ignore[arg-type]
    for sub in subs:
        sublist.insert(sub)
    assert sublist.ack_interest == len(may)
    for sub in subs:
        sublist.remove(sub)
        sublist.remove(sub)  # a second removal changes nothing
    assert sublist.ack_interest == 0 and sublist.count == 0


def test_a_read_of_acks_applies_each_plain_one_and_leaves_the_rest(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _door(tmp_path) as (server, engine), _client(server, "free", "x") as free:
            replies = await _pull(free, 7)
            read = (
                b"PUB %b 4\r\n+ACK\r\n" % replies[0]
                + b"PUB %b 3\r\n+OK\r\n" % replies[1]
                + b"PUB %b 4\r\n-NAK\r\n" % replies[2]  # redelivered: stays pending
                + b"PUB  %b\t4\r\n+ACK\r\n" % replies[3]  # spaced otherwise: the general way, acked too
                + b"PUB %b 0\r\n\r\n" % replies[4]
                + b"PUB %b 5\r\n+WPI \r\n" % replies[5]  # in progress: stays pending
                + b"PUB %b 4\r\n+ACK\r\n" % replies[6]
            )
            assert await free.converse(read) == b"PONG\r\n"
            await _until(lambda: _pending(engine) == {3, 6}, f"only the naked and in-progress messages pending: {_pending(engine)}")
            redelivered = await _pull(free, 1)
            assert redelivered[0].split(b".")[4:6] == [b"2", b"3"], "the naked message comes again, second delivery"

    asyncio.run(scenario())


def test_acks_cut_anywhere_between_reads_are_applied_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _door(tmp_path) as (server, engine), _client(server, "free", "x") as free:
            replies = await _pull(free, 40)
            conn = next(c for c in server.connections.values() if c.principal is not None and c.principal.user == "free")
            for k in range(20):
                pair = b"PUB %b 4\r\n+ACK\r\n" % replies[2 * k] + b"PUB %b 0\r\n\r\n" % replies[2 * k + 1]
                cut = (k * 7919) % len(pair)  # 20 cuts spread over the pair, inside lines and payloads
                conn.data_received(pair[:cut])
                conn.data_received(pair[cut:])
                await _until(lambda k=k: min(_pending(engine), default=41) == 2 * k + 3, f"pair {k} acked, cut at {cut}")
            assert _pending(engine) == set()
            assert engine.consumers.get(engine.stream("S"), "C").state.ack_floor_stream_seq == 40

    asyncio.run(scenario())


def test_each_ack_of_a_read_gets_its_own_permission_check(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with _door(tmp_path) as (server, engine), _client(server, "first", "f") as first:
            replies = await _pull(first, 3)
            read = b"".join(b"PUB %b 4\r\n+ACK\r\n" % r for r in replies)
            refused = b"".join(b"-ERR 'Permissions Violation for Publish to \"%b\"'\r\n" % r for r in replies[1:])
            assert await first.converse(read) == refused + b"PONG\r\n"
            await _until(lambda: _pending(engine) == {2, 3}, "only stream sequence 1 acked")

    asyncio.run(scenario())
