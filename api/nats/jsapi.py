"""The JetStream API over NATS: `$JS.API.…` requests, `$JS.ACK.…` acks and `$JS.FC.…` answers.

Each request subject maps to one engine call (the stream requests in api/nats/stream_requests.py,
the consumer requests in api/nats/consumer_requests.py); answers are nats-server's JSON with its `type`
(`io.nats.jetstream.api.v1.<x>_response`) and, on failure, the engine's error as
`{"error": {"code", "err_code", "description"}}`. Calls that write files or tables (create, update,
delete, purge) run in a worker thread; lookups and gets answer on the loop. MSG.NEXT, DIRECT.GET and
acks are, as in nats-server, per-object subscriptions: a missing stream or consumer is nobody
listening (the 503 no-responders status), not a JSON error. Counterpart: server/jetstream_api.go.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from api.nats.acks import Acks
from api.nats.advisories import Advisories
from api.nats.consumer_requests import ConsumerRequests
from api.nats.errors import api_error, error_body
from api.nats.fetcher import Fetcher
from api.nats.messages import DirectGets
from api.nats.priority import PriorityGroups
from api.nats.pull import Pulls
from api.nats.push import PushConsumers
from api.nats.stream_requests import StreamRequests
from api.nats.writes import Writes
from engine import JetStreamError

if TYPE_CHECKING:
    from api.nats.subscriptions import Client, Router
    from api.waiters import Waiters
    from engine import JetStream

log = logging.getLogger(__name__)

TYPE = "io.nats.jetstream.api.v1."
API = "$JS.API."
HOUSEKEEPING = 1.0

Handler = Callable[[list[str], bytes], dict[str, Any]]

# $JS.API.<tokens> -> (response type, handler, whether it runs in a worker thread): the handler is
# an attribute path from the JetStreamApi. Calls that write files or tables run in a thread; lookups
# answer on the loop.
ROUTES: dict[tuple[str, ...], tuple[str, str, bool]] = {
    ("INFO",): ("account_info_response", "_account_info", False),
    ("STREAM", "INFO"): ("stream_info_response", "streams.info", False),
    ("STREAM", "NAMES"): ("stream_names_response", "streams.names", False),
    ("STREAM", "LIST"): ("stream_list_response", "streams.list_page", False),
    ("STREAM", "MSG", "GET"): ("stream_msg_get_response", "streams.msg_get", False),
    ("CONSUMER", "INFO"): ("consumer_info_response", "consumers.info", False),
    ("CONSUMER", "NAMES"): ("consumer_names_response", "consumers.names", False),
    ("CONSUMER", "LIST"): ("consumer_list_response", "consumers.list_page", False),
    ("STREAM", "CREATE"): ("stream_create_response", "streams.create", True),
    ("STREAM", "UPDATE"): ("stream_update_response", "streams.update", True),
    ("STREAM", "DELETE"): ("stream_delete_response", "streams.delete", True),
    ("STREAM", "PURGE"): ("stream_purge_response", "streams.purge", True),
    ("STREAM", "MSG", "DELETE"): ("stream_msg_delete_response", "streams.msg_delete", True),
    ("CONSUMER", "CREATE"): ("consumer_create_response", "consumers.create", True),
    ("CONSUMER", "DURABLE", "CREATE"): ("consumer_create_response", "consumers.create", True),
    ("CONSUMER", "DELETE"): ("consumer_delete_response", "consumers.delete", True),
    ("CONSUMER", "UNPIN"): ("consumer_unpin_response", "consumers.unpin", False),
}


def response_kind(tokens: list[str]) -> str | None:
    """The response type of an API request subject's tokens (after `$JS.API.`); None if unknown."""
    for length in (3, 2, 1):
        route = ROUTES.get(tuple(tokens[:length]))
        if route is not None:
            return route[0]
    return None


class JetStreamApi:
    def __init__(self, server: Router, engine: JetStream) -> None:
        """The parts below are handed what they use (the account's router, the engine, the fetcher,
        each other), not this object: none of them knows the API above it."""
        self.server = server
        self.engine = engine
        self.fetcher = Fetcher(engine)
        self.advisories = Advisories(server)
        self.writes = Writes(server, engine, self.advisories, self.fetcher.acks_applied)
        self.priority = PriorityGroups(self.advisories.pinned, self.advisories.unpinned)
        self.pulls = Pulls(server, engine, self.fetcher, self.priority)
        self.push = PushConsumers(server, engine, self.fetcher)
        self.acks = Acks(engine, self.advisories, self.writes, self.pulls)
        self.direct = DirectGets(server, engine)
        self.streams = StreamRequests(engine, self.advisories)
        self.consumers = ConsumerRequests(server, engine, self.advisories, self.push)
        self.total = 0
        self.errors = 0
        self._housekeeping: asyncio.Task[None] | None = None
        self._inline: dict[tuple[str, ...], tuple[str, Handler]] = {}
        self._threaded: dict[tuple[str, ...], tuple[str, Handler]] = {}
        for tokens, (kind, method, threaded) in ROUTES.items():
            (self._threaded if threaded else self._inline)[tokens] = (kind, operator.attrgetter(method)(self))

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, waiters: Waiters) -> None:
        self.fetcher.waiters = waiters
        self.engine.consumers.on_max_deliveries = self._max_deliveries_threadsafe
        self.engine.consumers.on_unpin = self._unpinned_threadsafe
        self._housekeeping = asyncio.get_running_loop().create_task(self._keep_push_running())

    async def stop(self) -> None:
        self.engine.consumers.on_max_deliveries = None
        self.engine.consumers.on_unpin = None
        if self._housekeeping is not None:
            self._housekeeping.cancel()
        await self.push.stop()
        await self.pulls.stop()

    async def _keep_push_running(self) -> None:
        while True:
            self.push.ensure_all()
            await asyncio.sleep(HOUSEKEEPING)

    def interest_changed(self, subject: str) -> None:
        self.push.interest_changed(subject)

    def _max_deliveries_threadsafe(self, stream: str, consumer: str, seq: int, deliveries: int) -> None:
        loop = self.server.loop
        if loop is not None:
            loop.call_soon_threadsafe(self.advisories.max_deliveries, stream, consumer, seq, deliveries)

    def _unpinned_threadsafe(self, stream: str, consumer: str, group: str) -> None:
        """The engine dropped a pin (either door's unpin): on the loop, at once when called there, so that
        the advisory precedes the API's answer as in nats-server."""
        loop = self.server.loop
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._unpinned(stream, consumer, group)
        elif loop is not None:
            loop.call_soon_threadsafe(self._unpinned, stream, consumer, group)

    def _unpinned(self, stream: str, consumer: str, group: str) -> None:
        try:
            target = self.engine.consumers.get(self.engine.stream(stream), consumer)
        except JetStreamError:  # deleted meanwhile: nothing held back any more
            return
        self.priority.unpin(target, group)
        self.fetcher.wake(stream)  # requests held back by the pin may take messages now

    # -- dispatch -----------------------------------------------------------------------------

    def handle(self, conn: Client, subject: str, reply: bytes | None, hdr: bytes | None, payload: bytes) -> bool:
        """A publish to `$JS.…`; False when nothing here listens on that subject (no responders)."""
        if subject.startswith(API):
            return self._api(subject[len(API) :].split("."), reply, payload)
        if subject.startswith("$JS.ACK."):
            return self.acks.handle(conn, subject, reply, payload)
        if subject.startswith("$JS.FC."):
            return self.push.flow_control_answer(subject)
        return False

    def _api(self, tokens: list[str], reply: bytes | None, payload: bytes) -> bool:
        if tokens[:3] == ["CONSUMER", "MSG", "NEXT"] and len(tokens) == 5:
            return self.pulls.request(tokens[3], tokens[4], reply, payload)
        if tokens[:2] == ["DIRECT", "GET"] and len(tokens) >= 3:
            return self.direct.direct_get(tokens, reply, payload)
        if not reply and tokens[:2] != ["CONSUMER", "UNPIN"]:  # an unpin acts unanswered too, as in nats-server
            return True
        self.total += 1
        for routes, threaded in ((self._inline, False), (self._threaded, True)):
            for length in (3, 2, 1):
                route = routes.get(tuple(tokens[:length]))
                if route is None:
                    continue
                kind, handler = route
                if threaded:
                    self._answer_in_thread(reply, kind, handler, tokens, payload)
                elif handler == self.consumers.info and len(tokens) == 4:
                    answer = functools.partial(self._answer, reply, kind, handler, tokens, payload)
                    self.fetcher.after_delivery(tokens[2], tokens[3], answer)
                else:
                    self._answer(reply, kind, handler, tokens, payload)
                return True
        log.warning("unknown JetStream API request $JS.API.%s: not answered, as nats-server", ".".join(tokens)[:200])
        return True

    def _answer(self, reply: bytes | None, kind: str, handler: Handler, tokens: list[str], payload: bytes) -> None:
        try:
            body = handler(tokens, payload)
        except JetStreamError as exc:
            self.errors += 1
            body = error_body(kind, exc)
        except Exception as exc:  # noqa: BLE001 - an unexpected failure is a 500 to this request, not a dead door
            log.exception("JetStream API %s failed", ".".join(tokens))
            self.errors += 1
            body = error_body(kind, api_error(exc))
        self.server.reply(reply, orjson.dumps({"type": TYPE + kind, **body}))

    def _answer_in_thread(self, reply: bytes | None, kind: str, handler: Handler, tokens: list[str], payload: bytes) -> None:
        loop = asyncio.get_running_loop()

        def run() -> dict[str, Any]:
            try:
                return handler(tokens, payload)
            except JetStreamError as exc:
                return {"__error__": exc}
            except Exception as exc:  # noqa: BLE001
                log.exception("JetStream API %s failed", ".".join(tokens))
                return {"__error__": api_error(exc)}

        def done(future: asyncio.Future[dict[str, Any]]) -> None:
            body = future.result()
            failure = body.pop("__error__", None)
            if failure is not None:
                self.errors += 1
                body = error_body(kind, failure)
            follow_up = body.pop("__then__", None)
            self.server.reply(reply, orjson.dumps({"type": TYPE + kind, **body}))
            if follow_up is not None:
                follow_up()

        loop.run_in_executor(None, run).add_done_callback(done)

    # -- the account ---------------------------------------------------------------------------

    def _account_info(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        info = self.engine.account_info()
        info["api"] = {"level": 1, "total": self.total, "errors": self.errors}
        return info
