"""Group commit: concurrent publishes to one stream share one log append.

The first caller to find the stream idle becomes the leader: it takes every request queued so far,
runs them through the stream in one `process` call (one write-ahead-log append, one fsync under
`--sync always`) and hands each caller its results. Callers that arrive meanwhile queue and wait;
when the leader is done, one of them leads the next round with everything queued by then. Under load
the rounds grow, so the log sees few large writes; idle, a publish goes straight through. This is
the one place where the engine is concurrent; the stream state machine stays synchronous.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class Request(Generic[In, Out]):
    """One caller's items in a round, and what the round answered them."""

    __slots__ = ("items", "results", "error", "done")

    def __init__(self, items: list[In]) -> None:
        self.items = items
        self.results: list[Out] = []
        self.error: BaseException | None = None
        self.done = False


class GroupCommit(Generic[In, Out]):
    def __init__(self, process: Callable[[list[list[In]]], list[list[Out]]]) -> None:
        self._process = process
        self._cv = threading.Condition()
        self._queue: list[Request[In, Out]] = []
        self._leading = False
        self.rounds = 0
        self.requests = 0

    @property
    def idle(self) -> bool:
        """No round under way or queued: a hint (racy by nature) that `submit` now would lead at once."""
        return not self._leading and not self._queue

    def submit(self, items: list[In]) -> list[Out]:
        return self.wait(self.enqueue(items))

    def enqueue(self, items: list[In]) -> Request[In, Out]:
        """Queues `items` without waiting: rounds keep the order of `enqueue` calls, so a caller that
        enqueues under its own lock gets the order of its state changes in the log."""
        request: Request[In, Out] = Request(items)
        with self._cv:
            self._queue.append(request)
        return request

    def wait(self, request: Request[In, Out]) -> list[Out]:
        """The results of an enqueued request; leads a round if no one else is."""
        with self._cv:
            while self._leading and not request.done:
                self._cv.wait()
            if request.done:
                return self._result(request)
            self._leading = True
            round_, self._queue = self._queue, []
        try:
            outputs = self._process([r.items for r in round_])
            for r, out in zip(round_, outputs, strict=True):
                r.results = out
        except BaseException as exc:  # every waiter of the round gets the failure
            for r in round_:
                r.error = exc
        with self._cv:
            for r in round_:
                r.done = True
            self.rounds += 1
            self.requests += len(round_)
            self._leading = False
            self._cv.notify_all()
        return self._result(request)

    @staticmethod
    def _result(request: Request[In, Out]) -> list[Out]:
        if request.error is not None:
            raise request.error
        return request.results
