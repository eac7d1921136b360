"""The system account's operator requests over NATS: account deletion and key rotation in any account.

They are the subjects the HTTP door's system routes declare (api/http/operations.py), answered for a
user of the system account (or anyone on a gateway without a config) once the connection's publish
permission on the subject passed, as nats-server answers its system subscriptions only in the system
account:
- `$JS.API.ACCOUNT.PURGE.<account>`: deletes an account that left the config (engine/accounts/
  deletion.py), answered `{"type": "io.nats.jetstream.api.v1.account_purge_response", "initiated":
  true, "receipt": {...}}`;
- `$SYS.REQ.ACCOUNT.<account>.KEY.ROTATE.<stream>`: a new key epoch for an encrypted stream's new
  writes, answered `{"type": "io.nats.jetlake.api.v1.key_rotate_response", "stream", "epoch"}`.
Both call the engine in a worker thread; failures are the engine's errors in JetStream's envelope.
Other `$SYS.REQ.` subjects have no responder here. Counterpart: server/jetstream_api.go
(`jsLeaderAccountPurgeRequest`) and server/events.go (the `$SYS.REQ.ACCOUNT.<account>.<request>` handlers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from api.nats.errors import api_error, error_body
from engine.accounts.config import account_from_wire
from engine.errors import ErrorCode, JetStreamError

if TYPE_CHECKING:
    from api.nats.subscriptions import Router
    from engine.accounts.registry import Accounts

log = logging.getLogger(__name__)

PURGE = "$JS.API.ACCOUNT.PURGE."
ACCOUNT_REQUEST = "$SYS.REQ.ACCOUNT."
PURGE_TYPE = "io.nats.jetstream.api.v1.account_purge_response"
ROTATE_TYPE = "io.nats.jetlake.api.v1.key_rotate_response"


def handles(subject: str) -> bool:
    """Whether a publish of a system-account user is one of these requests."""
    return subject.startswith(PURGE) or subject.startswith(ACCOUNT_REQUEST)


class SystemRequests:
    """Answers the system account's requests over the gateway's accounts."""

    def __init__(self, accounts: Accounts) -> None:
        self.accounts = accounts

    def handle(self, space: Router, subject: str, reply: bytes | None, payload: bytes) -> bool:
        """A request of a system-account user; False when nothing here answers the subject (no responders)."""
        if subject.startswith(PURGE):
            name = subject[len(PURGE):]
            self._answer(space, reply, PURGE_TYPE, lambda: self._purge(name))
            return True
        tokens = subject[len(ACCOUNT_REQUEST):].split(".")
        if len(tokens) == 4 and tokens[1:3] == ["KEY", "ROTATE"] and tokens[0] and tokens[3]:
            account, stream = account_from_wire(tokens[0]), tokens[3]  # `$G` names the global account
            self._answer(space, reply, ROTATE_TYPE, lambda: self._rotate(account, stream))
            return True
        return False

    def _purge(self, name: str) -> dict[str, Any]:
        if not name or "." in name:
            raise JetStreamError(400, ErrorCode.BAD_REQUEST, "an account purge names one account")
        return {"initiated": True, "receipt": self.accounts.delete(name)}

    def _rotate(self, name: str, stream: str) -> dict[str, Any]:
        account = self.accounts.get(name)
        if account is None:
            raise JetStreamError(404, ErrorCode.NONE, "account not found")
        return {"stream": stream, "epoch": account.jetstream().rotate_key(stream)}

    @staticmethod
    def _answer(space: Router, reply: bytes | None, kind: str, call: Callable[[], dict[str, Any]]) -> None:
        """Runs the engine call in a worker thread and answers on the loop (no answer without a reply
        subject: the call still runs, as a request published without one does in nats-server)."""
        loop = asyncio.get_running_loop()

        def run() -> dict[str, Any]:
            try:
                return call()
            except JetStreamError as exc:
                return error_body(kind, exc)
            except Exception as exc:  # noqa: BLE001 - a 500 to this request, not a dead door
                log.exception("system request %s failed", kind)
                return error_body(kind, api_error(exc))

        def done(future: asyncio.Future[dict[str, Any]]) -> None:
            if reply:
                space.reply(reply, orjson.dumps({"type": kind, **future.result()}))

        loop.run_in_executor(None, run).add_done_callback(done)
