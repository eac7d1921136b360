"""What routes take from the gate: the caller's account's engine and pull waiters (api/http/gate.py).

`engine(request)` is the engine of the account the request acts in. A route whose checked subject
is in its body calls `authorize(request, **values)` first: until then `engine` refuses, so a route
cannot reach an engine unchecked.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from api.http.gate import ACCESS, Access, Gate
from api.waiters import Waiters
from engine import JetStream
from engine.accounts.registry import Account


def access(request: Request) -> Access:
    found: Access | None = request.scope.get(ACCESS)
    if found is None:
        raise RuntimeError(f"{request.method} {request.url.path} is not in api/http/operations.py: no account for it")
    return found


def gate(request: Request) -> Gate:
    return request.app.state.gate  # type: ignore[no-any-return]


def engine(request: Request) -> JetStream:
    """The engine of the caller's account (for a system route: of the account it names)."""
    found = access(request)
    if not found.checked:
        raise RuntimeError(f"route {found.route.name} must call deps.authorize with its body's values first")
    return found.account.jetstream()


def account(request: Request) -> Account:
    return access(request).account


def lookup(request: Request) -> JetStream:
    """The engine, for a lookup whose result names what `authorize` then checks (nothing may be
    answered from it before that)."""
    return access(request).account.jetstream()


def authorize(request: Request, **values: Any) -> JetStream:
    """Checks the route's grants that read values of the body; 403 if one is not allowed."""
    found = access(request)
    params = {**found.params, **values}
    gate(request).check(found, found.route.late, params)
    found.checked = True
    return found.account.jetstream()


def text(value: Any) -> str:
    """A body value that names a subject token: itself if a string, else "" (the engine then refuses it)."""
    return value if isinstance(value, str) else ""


def waiters(request: Request) -> Waiters:
    return access(request).waiters


def count_error(request: Request) -> None:
    """An API error answered to the request, for AccountInfo's `api.errors` and the metrics."""
    found: Access | None = request.scope.get(ACCESS)
    if found is not None:
        found.account.api.errors += 1
    state = getattr(request.app.state, "gate", None)
    if state is not None:
        state.stats.api_errors += 1
