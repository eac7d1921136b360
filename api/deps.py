"""What routes take from the application: the engine and the pull waiters, set up by create_app."""

from __future__ import annotations

from fastapi import Request

from api.waiters import Waiters
from engine import JetStream


def engine(request: Request) -> JetStream:
    return request.app.state.engine  # type: ignore[no-any-return]


def waiters(request: Request) -> Waiters:
    return request.app.state.waiters  # type: ignore[no-any-return]
