"""A read that brings one publish (a sync publisher's) takes the lean path: the door answers it without
the run machinery, the stream stores a message without headers by scalar steps, and a KV put past its
history removes the subject's first message by scalars. Every JetStream check still holds there:
duplicates by Nats-Msg-Id, Nats-Expected-Last-Sequence, max_msgs with discard new, per-subject history
and the stream's first sequence after removals. The door, engine and sockets are real (as in
test_single_op.py); each publish is its own read.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from api.nats.connection import Connection
from engine import JetStream
from tests.nats.test_single_op import run_with_door


async def _answer(client: socket.socket) -> Any:
    """The PubAck of the last publish: one MSG, read without blocking the loop (a publish that had to
    wait for the stream's lock is answered from a worker thread through the loop)."""
    data = b""
    deadline = time.monotonic() + 10
    while data.count(b"\r\n") < 2:
        assert time.monotonic() < deadline, f"no answer, got {data!r}"
        try:
            chunk = client.recv(65536)
        except BlockingIOError:
            await asyncio.sleep(0.001)
            continue
        assert chunk, "the door closed the connection"
        data += chunk
    head, _, body = data.partition(b"\r\n")
    assert head.startswith(b"MSG _INBOX.t.1 1 "), head
    return orjson.loads(body.rstrip(b"\r\n"))


async def _pub(conn: Connection, client: socket.socket, subject: str, payload: bytes, headers: dict[str, str] | None = None) -> Any:
    if headers is None:
        conn.data_received(b"PUB %b _INBOX.t.1 %d\r\n%b\r\n" % (subject.encode(), len(payload), payload))
    else:
        hdr = b"NATS/1.0\r\n" + b"".join(b"%b: %b\r\n" % (k.encode(), v.encode()) for k, v in headers.items()) + b"\r\n"
        conn.data_received(b"HPUB %b _INBOX.t.1 %d %d\r\n%b%b\r\n" % (subject.encode(), len(hdr), len(hdr) + len(payload), hdr, payload))
    return await _answer(client)


def _state(engine: JetStream, stream: str) -> tuple[int, int, int]:
    state = engine.stream_info(stream)["state"]
    return state["messages"], state["first_seq"], state["last_seq"]


def test_lone_publishes_keep_every_jetstream_check(tmp_path: Path) -> None:
    async def scenario(conn: Connection, client: socket.socket, engine: JetStream) -> None:
        engine.add_stream({"name": "S", "subjects": ["s"], "max_msgs": 3, "discard": "new"})
        engine.add_stream({"name": "KV_b", "subjects": ["$KV.b.>"], "max_msgs_per_subject": 1, "discard": "new",
                           "allow_rollup_hdrs": True, "deny_delete": True})
        client.setblocking(False)

        assert await _pub(conn, client, "s", b"a") == {"stream": "S", "seq": 1}
        assert await _pub(conn, client, "s", b"b", {"Nats-Msg-Id": "m1"}) == {"stream": "S", "seq": 2}
        assert await _pub(conn, client, "s", b"b", {"Nats-Msg-Id": "m1"}) == {"stream": "S", "seq": 2, "duplicate": True}
        wrong = await _pub(conn, client, "s", b"c", {"Nats-Expected-Last-Sequence": "1"})
        assert wrong["error"]["err_code"] == 10071 and wrong["seq"] == 0
        assert await _pub(conn, client, "s", b"c", {"Nats-Expected-Last-Sequence": "2"}) == {"stream": "S", "seq": 3}
        full = await _pub(conn, client, "s", b"d")  # max_msgs 3, discard new: refused, takes no sequence
        assert full["error"]["err_code"] == 10077 and "maximum messages exceeded" in full["error"]["description"]
        assert _state(engine, "S") == (3, 1, 3)
        assert [engine.get_message("S", seq).data for seq in (1, 2, 3)] == [b"a", b"b", b"c"]

        # KV puts past a history of one: each removes its key's first message, the stream's first
        # sequence follows the oldest live one.
        for i in range(9):
            assert await _pub(conn, client, f"$KV.b.k{i % 3}", b"v%d" % i) == {"stream": "KV_b", "seq": i + 1}
        assert _state(engine, "KV_b") == (3, 7, 9)
        info = engine.stream_info("KV_b", subjects_filter=">")["state"]
        assert info["subjects"] == {"$KV.b.k0": 1, "$KV.b.k1": 1, "$KV.b.k2": 1}
        assert [engine.get_message("KV_b", seq).data for seq in (7, 8, 9)] == [b"v6", b"v7", b"v8"]
        # A key put twice in a row: its only older message goes, the first sequence stays.
        assert await _pub(conn, client, "$KV.b.k1", b"v9") == {"stream": "KV_b", "seq": 10}
        assert _state(engine, "KV_b") == (3, 7, 10)
        engine.flush()  # the removals reach the table: a restart would find the same state
        assert _state(engine, "KV_b") == (3, 7, 10)

    run_with_door(tmp_path, scenario)


def test_a_flush_answers_after_the_publishes_before_it_are_stored(tmp_path: Path) -> None:
    """`nats pub --count=10` publishes without replies and flushes (PING, PONG) before it exits; a
    `nats stream info` right after must count all ten. Here the stream's lock is held by another thread,
    so the publishes wait in a worker thread: the PONG waits for them, and a PING with no write
    waiting is answered at once."""
    async def scenario(conn: Connection, client: socket.socket, engine: JetStream) -> None:
        engine.add_stream({"name": "S", "subjects": ["s"]})
        client.setblocking(False)
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with engine.stream("S").lock:
                held.set()
                release.wait(10)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert held.wait(10)
            conn.data_received(b"PUB s 1\r\na\r\nPUB s 1\r\nb\r\nPING\r\n")
            await asyncio.sleep(0.2)
            assert _received(client) == b"", "a PONG before the publishes were stored"
        finally:
            release.set()
            holder.join(10)
        got = b""
        deadline = time.monotonic() + 10
        while b"PONG\r\n" not in got:
            assert time.monotonic() < deadline, f"no PONG, got {got!r}"
            got += _received(client)
            await asyncio.sleep(0.001)
        assert got == b"PONG\r\n" and _state(engine, "S") == (2, 1, 2)

        conn.data_received(b"PING\r\n")  # nothing waiting: answered within the read (the loop is not run here)
        got, deadline = b"", time.monotonic() + 10
        while not got:
            assert time.monotonic() < deadline, "no PONG"
            got = _received(client)
        assert got == b"PONG\r\n"

    run_with_door(tmp_path, scenario)


def _received(client: socket.socket) -> bytes:
    """What the non-blocking client has been sent so far."""
    data = b""
    while True:
        try:
            chunk = client.recv(65536)
        except BlockingIOError:
            return data
        assert chunk, "the door closed the connection"
        data += chunk
