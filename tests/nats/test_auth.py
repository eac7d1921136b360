"""CONNECT's credentials and per-subject permissions through api/auth.py, with a real config.

The door runs in-process on real engines with a config of one user in the global account (publish
only to `orders.>` and `$JS.API.>`, subscribe only to `_INBOX.>`) and one user of another account,
so the texts and closes nats-server uses for each violation are checked.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from api.auth import Authenticator
from api.http.gate import Gate
from api.nats.server import NatsServer
from engine import EngineOptions
from engine.accounts.config import loads
from engine.accounts.registry import Accounts

CONFIG = """
accounts {
  default {
    jetstream: enabled
    users: [
      { user: alice, password: s3cret, permissions: { publish: ["orders.>", "$JS.API.>"], subscribe: ["_INBOX.>"] } }
    ]
  }
  OTHER { jetstream: enabled, users: [ { user: bob, password: b0b } ] }
}
"""


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
        config = loads(CONFIG)
        accounts = Accounts(tmp_path / "warehouse", EngineOptions(), config)
        accounts.open(start_flusher=False)
        auth = Authenticator(config)
        gate = Gate(accounts, auth)
        gate.bind(asyncio.get_running_loop())
        server = NatsServer(accounts, port=0, auth=auth)
        await server.start(gate)
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
            other = b'CONNECT {"verbose":false,"user":"bob","pass":"b0b"}\r\nPING\r\n'
            assert await _talk(server.port, other) == (b"PONG\r\n", False), "every account is served over NATS"
        finally:
            await server.stop()
            accounts.close()

    asyncio.run(scenario())
