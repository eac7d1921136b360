"""What the HTTP door needs to know of the other gateways, and to keep an answer instead of sending it.

`Locator` says where a stream is served and which gateways are live (engine/cluster/locator.py is the
real one); `Answer` is a whole answer of a gateway; `capture` runs this gateway's own app on a request
and keeps its answer, so a view or a split batch can merge it with the others' (api/http/cluster_views.py,
api/http/batch_split.py); `replay` gives a route a body already read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.types import ASGIApp, Message, Receive, Scope


class Locator(Protocol):
    """Where a stream is served: by this gateway (None) or at another gateway's base URL."""

    def owner_url(self, account: str, stream: str) -> str | None:
        """None: served here; "": owned by a gateway not reachable now; else the owner's base URL."""
        ...

    def stream_for_subject(self, account: str, subject: str) -> str | None: ...

    def stream_subjects(self, account: str) -> list[tuple[str, list[str]]]:
        """Every stream of the account (stored configs) with its subjects."""
        ...

    def peers(self) -> list[str]:
        """The base URLs of the other live gateways."""
        ...


@dataclass
class Answer:
    """A whole answer of a gateway (this one's app or another's), for views and split batches."""

    status: int
    body: bytes


async def capture(app: ASGIApp, scope: Scope, body: bytes, receive: Receive) -> Answer:
    """This gateway's own answer to a request (below forwarding), kept instead of sent."""
    status = 500
    parts: list[bytes] = []

    async def keep(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, replay(body, receive), keep)
    return Answer(status, b"".join(parts))


Ask = Callable[[Scope, bytes, str, "float | None"], Awaitable["Answer | None"]]
"""Asks another gateway (its base URL) the request of a scope with a body, bounded in time; None: no answer."""


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives the already read body once, then what the server sends (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
