"""The HTTP door's check: who is asking, which account they act in, and whether the route's NATS operation is allowed.

An ASGI middleware in front of everything else. For each request it finds the route in the one
declaration (api/http/operations.py), reads the credentials (`Authorization: Bearer <token>` or
`Basic <user:password>`, and the verified client certificate the TLS layer put in the scope), asks
api/auth.py for the principal, checks the route's subjects against the principal's permissions,
and hands the route its account (`scope["jetlake.access"]`): every engine a route reaches is the
caller's account's, so nothing of another account can be seen, named or counted. Refusals are 401
(missing or bad credentials) and 403 (permission) in JetStream's ApiError shape, change nothing,
and are counted (`/metrics`). A route whose subject is in the body (a stream create, a batch
publish) is checked by its handler through `deps.authorize` before it may reach the engine.
`/healthz` needs no credentials. Counterpart: the permission checks of server/client.go, for HTTP.
"""

from __future__ import annotations

import asyncio
import binascii
import logging
from dataclasses import dataclass, field
from typing import Any

import pybase64
from starlette.types import ASGIApp, Receive, Scope, Send

from api.http import operations
from api.auth import AuthError, Authenticator, CertIdentity, Principal
from api.http.responses import json_response
from api.waiters import Waiters
from engine.accounts.config import ServerConfig
from engine.accounts.registry import Account, Accounts
from engine.errors import ErrorCode, JetStreamError

log = logging.getLogger(__name__)
CACHE_LIMIT = 10_000
_MISSING = object()
ACCESS = "jetlake.access"
ROUTE = "jetlake.route"  # (route, path parameters) as matched, for api/http/fast_paths.py
TLS_IDENTITY = "jetlake.tls_identity"  # set in the scope's TLS extension by api/http/tls.py
CHALLENGE = [(b"www-authenticate", b'Bearer realm="jetlake", Basic realm="jetlake"')]


def unauthorized() -> JetStreamError:
    return JetStreamError(401, ErrorCode.NONE, "Authorization Violation")


def forbidden(subject: str) -> JetStreamError:
    return JetStreamError(403, ErrorCode.NONE, f'Permissions Violation for Publish to "{subject}"')


def account_not_found() -> JetStreamError:
    return JetStreamError(404, ErrorCode.NONE, "account not found")


@dataclass
class Stats:
    """Gateway-wide counters (the system account's view); per-account ones are on each Account."""

    api_total: int = 0
    api_errors: int = 0
    unauthorized: int = 0
    denied: int = 0


@dataclass(slots=True)
class Access:
    """What the gate grants a request: its principal, the account it acts in, and whether its check is done."""

    principal: Principal
    account: Account
    route: operations.Route
    params: dict[str, Any]
    waiters: Waiters
    checked: bool = False


@dataclass
class Gate:
    """The state behind the middleware: accounts, authenticator, pull waiters per account, counters."""

    accounts: Accounts
    authenticator: Authenticator
    stats: Stats = field(default_factory=Stats)
    waiters: dict[str, Waiters] = field(default_factory=dict)
    loop: asyncio.AbstractEventLoop | None = None
    # Per config (cleared when the authenticator reloads): principals by Authorization header and
    # client identity, and route decisions by permissions, route and the values the route's subjects read.
    _principals: dict[tuple[Any, ...], Principal | None] = field(default_factory=dict)
    _decisions: dict[tuple[Any, ...], str | None] = field(default_factory=dict)
    _generation: int = -1

    def principal(self, scope: Scope) -> Principal:
        """Who the request is (`AuthError` if nobody): remembered per Authorization header, so a client
        that keeps sending the same credentials costs one dict lookup."""
        authenticator = self.authenticator
        if not authenticator.required:  # credentials are ignored, as nats-server ignores them
            return authenticator.authenticate()
        if authenticator.generation != self._generation:
            self._principals.clear()
            self._decisions.clear()
            self._generation = authenticator.generation
        header, count = None, 0
        for name, value in scope["headers"]:
            if name == b"authorization":
                header, count = value, count + 1
        extensions = scope.get("extensions")
        key = (header, (extensions.get("tls") or {}).get(TLS_IDENTITY) if extensions else None)
        found = self._principals.get(key, _MISSING) if count <= 1 else None
        if found is _MISSING:
            try:
                found = authenticator.authenticate(**credentials(scope), connection_type="HTTP")
            except AuthError:
                found = None
            if len(self._principals) >= CACHE_LIMIT:
                self._principals.clear()
            self._principals[key] = found
        if found is None:
            raise AuthError()
        return found  # type: ignore[return-value]

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Binds every account's waiters to the loop and their engine's notifications to them."""
        self.loop = loop
        for account in self.accounts:
            self.waiters_of(account)

    def waiters_of(self, account: Account) -> Waiters:
        found = self.waiters.get(account.name)
        if found is None:
            found = self.waiters[account.name] = Waiters()
            if self.loop is not None:
                found.bind(self.loop)
        if account.engine is not None and account.engine.notify is None and self.loop is not None:
            account.engine.notify = found.wake_threadsafe
        return found

    def reload(self, config: ServerConfig) -> list[str]:
        """Applies a new config: accounts first (a new account's engine opens before its users may log
        in), then the users; waiters for new accounts. Settings that need a restart are reported."""
        old = self.authenticator.config
        changes = self.accounts.reload(config)
        self.authenticator.reload(config)
        for account in self.accounts:
            self.waiters_of(account)
        if config.tls != old.tls:
            changes.append("tls settings changed: they apply at the next start")
        if config.jetstream != old.jetstream:
            changes.append("jetstream settings changed: they apply at the next start")
        changes += [f"config: {w}" for w in config.warnings if w not in old.warnings]
        return changes

    def unbind(self) -> None:
        for engine in self.accounts.engines():
            engine.notify = None

    def check(self, access: Access, grants: tuple[tuple[str, ...], ...], values: dict[str, Any]) -> None:
        """Raises 403 unless every grant has an applicable subject the principal may publish to."""
        permissions = access.principal.permissions
        if permissions is None or not grants:
            return
        route = access.route
        if grants is route.early:  # decided by the path and query alone: remembered
            key = (id(permissions), route.name, tuple(map(values.get, route.early_params)))
            denied = self._decisions.get(key, _MISSING)
            if denied is _MISSING:
                denied = self._denied(access, grants, values)
                if len(self._decisions) >= CACHE_LIMIT:
                    self._decisions.clear()
                self._decisions[key] = denied
            if denied is not None:
                self.deny(access.account)
                raise forbidden(denied)  # type: ignore[arg-type]
            return
        denied = self._denied(access, grants, values)
        if denied is not None:
            self.deny(access.account)
            raise forbidden(denied)

    def _denied(self, access: Access, grants: tuple[tuple[str, ...], ...], values: dict[str, Any]) -> str | None:
        """The subject a refusal names, or None when every grant is met."""
        permissions = access.principal.permissions
        assert permissions is not None
        route = access.route
        many = values.get(route.many) if route.many else None
        for params in _each(values, route.many, many) if isinstance(many, (list, tuple)) else (values,):
            for grant in grants:
                candidates = operations.subjects(route, params, grant)
                if not any(permissions.can_publish(s) for s in candidates):  # none applies: refused too
                    return candidates[0] if candidates else grant[0]
        return None

    def deny(self, account: Account) -> None:
        """Counts a permission refusal (its error is counted where it is answered)."""
        account.api.denied += 1
        self.stats.denied += 1


def _each(values: dict[str, Any], key: str, items: list[Any] | tuple[Any, ...]) -> list[dict[str, Any]]:
    """One params dict per distinct value of the route's list param (a batch's subjects)."""
    return [{**values, key: item} for item in dict.fromkeys(items)]


class GateMiddleware:
    """Authenticates, routes to the caller's account, checks the route's subjects (see the module)."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app = app
        self.gate = gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        found = scope[ROUTE] = operations.match(scope["method"], scope["path"])
        if found is None or found[0].open:
            await self.app(scope, receive, send)
            return
        route, path_params = found
        try:
            scope[ACCESS] = self._admit(scope, route, path_params)
        except JetStreamError as exc:
            headers = CHALLENGE if exc.code == 401 else []
            await _refuse(exc, headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _admit(self, scope: Scope, route: operations.Route, path_params: dict[str, str]) -> Access:
        gate = self.gate
        try:
            principal = gate.principal(scope)
            own = gate.accounts.get(principal.account)
            if own is None:  # its account left the config in a reload that raced this request
                raise AuthError()
        except AuthError:
            gate.stats.unauthorized += 1
            gate.stats.api_errors += 1
            raise unauthorized() from None
        if scope["path"].startswith("/v1/"):
            own.api.total += 1
            gate.stats.api_total += 1
        params = operations.request_params(route, path_params, scope.get("query_string", b""))
        access = Access(principal, own, route, params, gate.waiters_of(own))
        try:
            if route.system and not principal.system:
                gate.deny(own)
                raise forbidden(operations.subjects(route, params, route.grants[0])[0])
            gate.check(access, route.early, params)
            if route.system and "account" in params and not route.removed:
                target = gate.accounts.get(params["account"])
                if target is None:
                    raise account_not_found()
                access = Access(principal, target, route, params, gate.waiters_of(target))
            if route.jetstream and (access.account.engine is None or access.account.config.jetstream is None):
                raise JetStreamError(503, ErrorCode.NOT_ENABLED_FOR_ACCOUNT, "JetStream not enabled for account")
        except JetStreamError:
            own.api.errors += 1
            gate.stats.api_errors += 1
            raise
        access.checked = not route.deferred
        return access


def credentials(scope: Scope) -> dict[str, Any]:
    """The credentials of a request: `Authorization` (Bearer or Basic) and the TLS client identity."""
    found: dict[str, Any] = {}
    extensions = scope.get("extensions")
    if extensions:
        identity = (extensions.get("tls") or {}).get(TLS_IDENTITY)
        if isinstance(identity, CertIdentity):
            found["tls_identity"] = identity
    value: bytes | None = None
    for name, raw in scope["headers"]:
        if name == b"authorization":
            if value is not None:
                raise AuthError()
            value = raw
    if value is None:
        return found
    scheme, _, rest = value.decode("latin-1").strip().partition(" ")
    rest = rest.strip()
    scheme = scheme.lower()
    if scheme == "bearer" and rest:
        found["token"] = rest
    elif scheme == "basic" and rest:
        try:
            decoded = pybase64.b64decode(rest, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            raise AuthError() from None
        user, sep, password = decoded.partition(":")
        if not sep or not user:
            raise AuthError()
        found["user"], found["password"] = user, password
    else:
        raise AuthError()
    return found


def _refuse(exc: JetStreamError, headers: list[tuple[bytes, bytes]]) -> Any:
    response = json_response({"type": "io.nats.jetstream.api.v1.error_response", "error": exc.to_dict()}, exc.code)
    response.raw_headers.extend(headers)
    return response
