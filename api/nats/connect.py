"""CONNECT: the options and credentials a client sends first, read as nats-server reads them.

Options a client leaves out take nats-server's defaults (verbose and pedantic on). A CONNECT that
is not a JSON object closes the connection without a word, as nats-server's parser does; an unknown
protocol, no_responders without headers and the account fields (a leafnode's, not a client's) close
it with nats-server's -ERR. Credentials are checked by api/auth.py, the check both doors use.
Counterpart: server/client.go (processConnect).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from api.auth import AuthError
from api.nats import protocol as p

if TYPE_CHECKING:
    from api.auth import Authenticator, Principal

_CREDENTIALS = ("user", "pass", "auth_token", "nkey", "jwt", "sig")
_DEFAULTS = {"verbose": True, "pedantic": True, "echo": True, "headers": False, "no_responders": False}


@dataclass(frozen=True, slots=True)
class ConnectOptions:
    """What a client asked for in its CONNECT, and the credentials it gave (unchecked)."""

    verbose: bool
    pedantic: bool
    echo: bool
    headers: bool
    no_responders: bool
    name: str
    protocol: int
    credentials: dict[str, Any]


def read_connect(text: bytes) -> ConnectOptions | str | None:
    """The options of CONNECT's JSON; else the -ERR text the connection is closed with, or None when
    it is closed without one."""
    try:
        given = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(given, dict):
        return None
    opts: dict[str, Any] = {**_DEFAULTS, **given}
    if opts.get("protocol", 0) not in (0, 1):
        return p.INVALID_PROTOCOL
    if opts["no_responders"] and not opts["headers"]:
        return p.NO_RESPONDERS_NEEDS_HEADERS
    if "account" in opts or "new_account" in opts:
        return p.AUTH_VIOLATION
    return ConnectOptions(
        verbose=bool(opts["verbose"]), pedantic=bool(opts["pedantic"]), echo=bool(opts["echo"]),
        headers=bool(opts["headers"]), no_responders=bool(opts["no_responders"]),
        name=str(opts.get("name") or ""), protocol=int(opts.get("protocol", 0)),
        credentials={key: opts.get(key) for key in _CREDENTIALS},
    )


def log_in(auth: Authenticator, options: ConnectOptions, nonce: str | None, client_ip: str | None) -> Principal:
    """Who the credentials name; AuthError if nobody (a credential that is not a string names nobody)."""
    given = options.credentials
    if any(v is not None and not isinstance(v, str) for v in given.values()):
        raise AuthError("a credential that is not a string")
    return auth.authenticate(
        user=given["user"], password=given["pass"], token=given["auth_token"],
        nkey=given["nkey"], jwt=given["jwt"], signature=given["sig"],
        nonce=nonce, connection_type="STANDARD", client_ip=client_ip,
    )
