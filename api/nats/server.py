"""The NATS door: a listener on the gateway's event loop; each client lands in its account's space.

Connections are accepted on the same loop as the HTTP door (uvloop under uvicorn) and share its
engines and its pull waiters. CONNECT's credentials name the client's account (api/auth.py, the check
both doors use); from then on everything the client publishes or subscribes to lives in that
account's `AccountSpace` (api/nats/account.py): its subjects, its engine, its JetStream API. Without
authentication every client is in the global account, as in nats-server's `$G`.
Counterpart: server/server.go (accept loop, INFO) and server/accounts.go.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import TYPE_CHECKING, Any

from api.auth import Authenticator
from api.nats import protocol as p
from api.nats.account import AccountSpace
from api.nats.connection import Connection
from api.nats.system import SystemRequests
from engine.accounts.config import GLOBAL_ACCOUNT

if TYPE_CHECKING:
    from api.waiters import WaitersByAccount
    from engine.accounts.registry import Accounts

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 65536


class NatsServer:
    """The NATS client protocol over the accounts' engines: start it on a running loop, stop it before they close."""

    def __init__(
        self,
        accounts: Accounts,
        host: str = "127.0.0.1",
        port: int = 4222,
        auth: Authenticator | None = None,
        max_payload: int | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.accounts = accounts
        self.host = host
        self.port = port
        self.auth = auth or Authenticator()
        self.max_payload = max_payload or accounts.options.max_payload
        self.max_connections = max_connections
        self.spaces: dict[str, AccountSpace] = {}
        self.system = SystemRequests(accounts)
        self.connections: dict[int, Connection] = {}
        self.server_id = p.server_id()
        self.slow_consumers = 0
        self._next_cid = 0
        self._server: asyncio.AbstractServer | None = None
        self._gate: WaitersByAccount | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._info: dict[str, Any] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self, gate: WaitersByAccount) -> None:
        """Listens; every account's space is opened now (push consumers deliver from the start)."""
        self.loop = asyncio.get_running_loop()
        self._gate = gate
        for name in self.accounts.names():
            self.space(name)
        self.accounts.on_deleted.append(self._deleted_threadsafe)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(1024)
        sock.setblocking(False)
        self._server = await self.loop.create_server(self._accept, sock=sock)
        self.port = sock.getsockname()[1]
        self._info = {
            "server_id": self.server_id,
            "server_name": self.server_id,
            "version": p.VERSION,
            "proto": p.PROTO,
            "go": "jetlake",
            "host": self.host,
            "port": self.port,
            "headers": True,
            "max_payload": self.max_payload,
            "jetstream": True,
        }
        if self.auth.required:
            self._info["auth_required"] = True
        log.info("NATS clients on nats://%s:%d (accounts %s)", self.host, self.port, ", ".join(self.spaces))

    async def stop(self) -> None:
        """Stops accepting, ends deliveries and closes every connection (queued bytes are sent)."""
        if self._deleted_threadsafe in self.accounts.on_deleted:
            self.accounts.on_deleted.remove(self._deleted_threadsafe)
        if self._server is not None:
            self._server.close()
        for space in list(self.spaces.values()):
            await space.stop()
        for conn in list(self.connections.values()):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def space(self, name: str) -> AccountSpace | None:
        """The account's space, opened on first use (an account a reload added); None: no such account."""
        found = self.spaces.get(name)
        account = self.accounts.get(name)
        if account is None:
            return None
        if found is not None and found.engine is account.engine:
            return found
        if found is not None:  # a reload turned JetStream on: later clients get the new engine
            log.info("account %s: JetStream changed; new NATS clients use the new engine", name)
            assert self.loop is not None
            self.loop.create_task(found.stop())
        assert self.loop is not None and self._gate is not None
        found = self.spaces[name] = AccountSpace(name, account.engine, self.loop, self.system)
        found.start(self._gate.waiters_of(account))
        return found

    def _deleted_threadsafe(self, name: str) -> None:
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._deleted, name)

    def _deleted(self, name: str) -> None:
        """An account was deleted: its space stops and its clients still connected are closed."""
        space = self.spaces.pop(name, None)
        if space is None:
            return
        closed = [conn for conn in list(self.connections.values()) if conn.space is space]
        for conn in closed:
            conn.close()
        assert self.loop is not None
        self.loop.create_task(space.stop())
        log.info("account %s deleted: its NATS space stopped, %d client(s) closed", name, len(closed))

    def _accept(self) -> Connection:
        self._next_cid += 1
        return Connection(self, self._next_cid)

    def info_for(self, conn: Connection) -> dict[str, Any]:
        info = dict(self._info, client_id=conn.cid)
        peer = conn.transport.get_extra_info("peername") if conn.transport else None
        if peer:
            info["client_ip"] = peer[0]
        if self.auth.nonce_required:
            conn.nonce = p.nonce()
            info["nonce"] = conn.nonce
        return info

    def register(self, conn: Connection) -> bool:
        if len(self.connections) >= self.max_connections:
            return False
        self.connections[conn.cid] = conn
        return True

    def unregister(self, conn: Connection) -> None:
        self.connections.pop(conn.cid, None)
        if conn.space is not None:
            conn.space.forget(conn)

    def pinged(self, conn: Connection) -> None:
        """After the first PONG of a connected client, nats-server sends INFO with `connect_info`."""
        if conn.connected and not conn.info_confirmed and conn.protocol >= 1:
            conn.info_confirmed = True
            info = dict(self._info, client_id=conn.cid, connect_info=True)
            info["remote_account"] = conn.principal.account if conn.principal else ""
            conn.send(p.info_line(info))

    def after_read(self, conn: Connection) -> None:
        if conn.space is not None:
            conn.space.after_read(conn)

    def global_space(self) -> AccountSpace:
        found = self.space(GLOBAL_ACCOUNT)
        assert found is not None, "the global account is always configured"
        return found
