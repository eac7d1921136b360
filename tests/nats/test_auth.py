"""CONNECT's credentials and per-subject permissions through the `api.auth` interface.

The door runs in-process on a real engine, with an authenticator of the accounts work's shape that
knows one user (publish only to `orders.>` and `$JS.API.>`, subscribe only to `_INBOX.>`), so the
texts and closes nats-server uses for each violation are checked without the accounts work itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.auth import Authenticator, AuthError, Principal
from api.nats.server import NatsServer
from api.waiters import Waiters
from engine import EngineOptions, JetStream
from engine.subjects import subject_matches


@dataclass(frozen=True)
class Allowed:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


class OnePrincipal(Principal):
    def can_publish(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.permissions.publish)

    def can_subscribe(self, subject: str, queue: str | None = None) -> bool:
        return any(subject_matches(p, subject) for p in self.permissions.subscribe)


class OneUser(Authenticator):
    required = True

    def authenticate(self, *, user=None, password=None, token=None, tls_subject=None):  # type: ignore[no-untyped-def]
        if (user, password) != ("alice", "s3cret"):
            raise AuthError("bad credentials")
        return OnePrincipal("default", "alice", Allowed(("orders.>", "$JS.API.>"), ("_INBOX.>",)))


async def _talk(port: int, data: bytes) -> tuple[bytes, bool]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await reader.readline()  # INFO
    writer.write(data)
    await writer.drain()
    out = b""
    closed = False
    while not out.endswith(b"PONG\r\n"):
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        if not chunk:
            closed = True
            break
        out += chunk
    writer.close()
    return out, closed


def test_credentials_and_permissions(tmp_path: Path) -> None:
    async def scenario() -> None:
        engine = JetStream(tmp_path / "warehouse", EngineOptions())
        engine.open(start_flusher=False)
        server = NatsServer(engine, port=0, auth=OneUser())
        await server.start(Waiters())
        try:
            login = b'CONNECT {"verbose":false,"pedantic":false,"user":"alice","pass":"s3cret"}\r\n'
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            assert b'"auth_required":true' in await reader.readline()
            assert await asyncio.wait_for(reader.read(), 10) == b"-ERR 'Authentication Timeout'\r\n"  # no CONNECT in 2 s
            writer.close()
            assert await _talk(server.port, b"PING\r\n") == (b"-ERR 'Authorization Violation'\r\n", True)
            bad = b'CONNECT {"verbose":false,"user":"alice","pass":"nope"}\r\nPING\r\n'
            assert await _talk(server.port, bad) == (b"-ERR 'Authorization Violation'\r\n", True)
            assert await _talk(server.port, login + b"PING\r\n") == (b"PONG\r\n", False)
            out, closed = await _talk(server.port, login + b"PUB secret.x 1\r\nx\r\nSUB orders.> 1\r\nSUB _INBOX.a q 2\r\nPING\r\n")
            assert not closed
            assert out == (
                b"-ERR 'Permissions Violation for Publish to \"secret.x\"'\r\n"
                b"-ERR 'Permissions Violation for Subscription to \"orders.>\"'\r\nPONG\r\n"
            )
        finally:
            await server.stop()
            engine.close()

    asyncio.run(scenario())
