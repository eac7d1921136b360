"""The JetStream API over NATS: `$JS.API.…` requests, `$JS.ACK.…` acks and `$JS.FC.…` answers.

Each request subject maps to one engine call; answers are nats-server's JSON with its `type`
(`io.nats.jetstream.api.v1.<x>_response`) and, on failure, the engine's error as
`{"error": {"code", "err_code", "description"}}`. Calls that write files or tables (create, update,
delete, purge) run in a worker thread; lookups and gets answer on the loop. MSG.NEXT, DIRECT.GET and
acks are, as in nats-server, per-object subscriptions: a missing stream or consumer is nobody
listening (the 503 no-responders status), not a JSON error. Counterpart: server/jetstream_api.go.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from api.nats import protocol as p
from api.nats.acks import Acks
from api.nats.advisories import Advisories
from api.nats.errors import api_error, error_body, go_json_error
from api.nats.fetcher import Fetcher
from api.nats.messages import DirectGets, is_count, lookup
from api.nats.priority import PriorityGroups
from api.nats.pull import Pulls
from api.nats.push import PushConsumers
from api.nats.writes import Writes
from engine import JetStreamError, errors
from engine.info import rfc3339

if TYPE_CHECKING:
    from api.nats.subscriptions import Client, Router
    from api.waiters import Waiters
    from engine import JetStream

log = logging.getLogger(__name__)

TYPE = "io.nats.jetstream.api.v1."
API = "$JS.API."
NAMES_LIMIT = 1024
LIST_LIMIT = 256
HOUSEKEEPING = 1.0

Handler = Callable[[list[str], bytes], dict[str, Any]]

# $JS.API.<tokens> -> (response type, handler, whether it runs in a worker thread). Calls that write
# files or tables run in a thread; lookups answer on the loop.
ROUTES: dict[tuple[str, ...], tuple[str, str, bool]] = {
    ("INFO",): ("account_info_response", "_account_info", False),
    ("STREAM", "INFO"): ("stream_info_response", "_stream_info", False),
    ("STREAM", "NAMES"): ("stream_names_response", "_stream_names", False),
    ("STREAM", "LIST"): ("stream_list_response", "_stream_list", False),
    ("STREAM", "MSG", "GET"): ("stream_msg_get_response", "_msg_get", False),
    ("CONSUMER", "INFO"): ("consumer_info_response", "_consumer_info", False),
    ("CONSUMER", "NAMES"): ("consumer_names_response", "_consumer_names", False),
    ("CONSUMER", "LIST"): ("consumer_list_response", "_consumer_list", False),
    ("STREAM", "CREATE"): ("stream_create_response", "_stream_create", True),
    ("STREAM", "UPDATE"): ("stream_update_response", "_stream_update", True),
    ("STREAM", "DELETE"): ("stream_delete_response", "_stream_delete", True),
    ("STREAM", "PURGE"): ("stream_purge_response", "_stream_purge", True),
    ("STREAM", "MSG", "DELETE"): ("stream_msg_delete_response", "_msg_delete", True),
    ("CONSUMER", "CREATE"): ("consumer_create_response", "_consumer_create", True),
    ("CONSUMER", "DURABLE", "CREATE"): ("consumer_create_response", "_consumer_create", True),
    ("CONSUMER", "DELETE"): ("consumer_delete_response", "_consumer_delete", True),
    ("CONSUMER", "UNPIN"): ("consumer_unpin_response", "_consumer_unpin", False),
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
        self.total = 0
        self.errors = 0
        self._housekeeping: asyncio.Task[None] | None = None
        self._inline: dict[tuple[str, ...], tuple[str, Handler]] = {}
        self._threaded: dict[tuple[str, ...], tuple[str, Handler]] = {}
        for tokens, (kind, method, threaded) in ROUTES.items():
            (self._threaded if threaded else self._inline)[tokens] = (kind, getattr(self, method))

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
                elif handler == self._consumer_info and len(tokens) == 4:
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

    # -- account and streams --------------------------------------------------------------------

    def _account_info(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        info = self.engine.account_info()
        info["api"] = {"level": 1, "total": self.total, "errors": self.errors}
        return info

    def _stream_create(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = _token(tokens, 2)
        config = _json(payload)
        if config.get("name") != name:
            raise errors.stream_mismatch()
        if "/" in name or "\\" in name:
            raise errors.name_has_path_separators()
        info, created = self.engine.add_stream(config)
        if created:
            self.advisories_later(lambda: self.advisories.stream_action(name, "create"))
        return {**info, "did_create": True} if created else info

    def _stream_update(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = _token(tokens, 2)
        info = self.engine.update_stream(name, _json(payload))
        self.advisories_later(lambda: self.advisories.stream_action(name, "modify"))
        return info

    def _stream_delete(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = _token(tokens, 2)
        _empty(payload)
        self.engine.delete_stream(name)
        self.advisories_later(lambda: self.advisories.stream_action(name, "delete"))
        return {"success": True}

    def advisories_later(self, send: Callable[[], None]) -> None:
        """Advisories of threaded calls are sent on the loop."""
        loop = self.server.loop
        if loop is not None:
            loop.call_soon_threadsafe(send)

    def _stream_info(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = _token(tokens, 2)
        req = _json(payload, {"deleted_details", "subjects_filter", "offset"}) if payload.strip() else {}
        subjects_filter = req.get("subjects_filter") or None
        info = self.engine.stream_info(name, subjects_filter, _offset(req) if subjects_filter else 0)
        return {"total": 0, "offset": 0, "limit": 0, **info}  # the engine pages the subjects as nats-server

    def _stream_names(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = _json(payload, {"offset", "subject"}) if payload.strip() else {}
        page = self.engine.stream_names(req.get("subject") or None, _offset(req), NAMES_LIMIT)
        return {"total": page["total"], "offset": page["offset"], "limit": NAMES_LIMIT, "streams": page["streams"] or None}

    def _stream_list(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = _json(payload, {"offset", "subject"}) if payload.strip() else {}
        page = self.engine.list_streams(req.get("subject") or None, _offset(req), LIST_LIMIT)
        return {"total": page["total"], "offset": page["offset"], "limit": LIST_LIMIT, "streams": page["streams"]}

    def _stream_purge(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = _token(tokens, 2)
        req = _json(payload, {"filter", "seq", "keep"}) if payload.strip() else {}
        filter_, seq, keep = req.get("filter") or None, req.get("seq", 0), req.get("keep", 0)
        if filter_ is not None and not isinstance(filter_, str):
            raise errors.invalid_json("purge filter must be a string")
        if not is_count(seq) or not is_count(keep):
            raise errors.invalid_json("purge seq and keep must be non-negative integers")
        return {"success": True, "purged": self.engine.purge(name, filter_, seq, keep)}

    def _msg_get(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        stream = self.engine.stream(_token(tokens, 3))
        if not payload.strip():
            raise errors.bad_request()
        req = _json(payload, {"seq", "last_by_subj", "next_by_subj", "start_time", "no_hdr", "batch", "max_bytes", "multi_last", "up_to_seq", "up_to_time"})
        msg = lookup(stream, req)
        message: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
        if msg.headers and not req.get("no_hdr"):
            message["hdrs"] = base64.b64encode(p.encode_headers(msg.headers)).decode()
        if msg.data:
            message["data"] = base64.b64encode(msg.data).decode()
        message["time"] = rfc3339(msg.ts)
        return {"message": message}

    def _msg_delete(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = _token(tokens, 3)
        if not payload.strip():
            raise errors.bad_request()
        req = _json(payload, {"seq", "no_erase"})
        seq = req.get("seq", 0)
        if not is_count(seq) or seq == 0:
            raise errors.bad_request("a message sequence must be a positive integer")
        self.engine.delete_message(name, seq, erase=not req.get("no_erase", False))
        return {"success": True}

    # -- consumers ----------------------------------------------------------------------------

    def _consumer_create(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = _json(payload, {"stream_name", "config", "action", "pedantic"})
        config = req.get("config") or {}
        if not isinstance(config, dict):
            raise errors.invalid_json("json: cannot unmarshal into Go struct field CreateConsumerRequest.config")
        config = dict(config)
        durable = config.get("durable_name") or ""
        if tokens[1] == "DURABLE":  # CONSUMER.DURABLE.CREATE.<stream>.<durable>
            if len(tokens) != 5:
                raise errors.JetStreamError(400, 10016, "consumer expected to be durable but no durable name set in subject")
            stream, name = tokens[3], tokens[4]
            if not durable:
                raise errors.JetStreamError(400, 10018, "consumer expected to be durable but a durable name was not set")
            if durable != name:
                raise errors.JetStreamError(400, 10017, "consumer name in subject does not match durable name in request")
            filtered = ""
        elif len(tokens) == 3:  # legacy ephemeral: CONSUMER.CREATE.<stream>
            stream, name, filtered = tokens[2], config.get("name") or "", ""
            if durable:
                raise errors.JetStreamError(400, 10020, "consumer expected to be ephemeral but a durable name was set in request")
        else:  # CONSUMER.CREATE.<stream>.<consumer>[.<filter>]
            stream, name, filtered = tokens[2], tokens[3], ".".join(tokens[4:])
            if durable and durable != name:
                raise errors.JetStreamError(400, 10017, "consumer name in subject does not match durable name in request")
        if req.get("stream_name") != stream:
            raise errors.stream_mismatch()
        if "/" in name or "\\" in name:
            raise errors.JetStreamError(400, 10127, "Consumer name can not contain path separators")
        if name:
            config["name"] = name
        if filtered and config.get("filter_subjects"):
            raise errors.JetStreamError(400, 10137, "consumer with multiple subject filters cannot use subject based API")
        if filtered and config.get("filter_subject") != filtered:
            raise errors.JetStreamError(400, 10131, "Consumer create request did not match filtered subject from create subject")
        return self._create_or_update(stream, name, config, req.get("action") or "")

    def _create_or_update(self, stream: str, name: str, config: dict[str, Any], action: str) -> dict[str, Any]:
        if action not in ("", "create", "update"):
            raise errors.invalid_json(f"unknown consumer action {action!r}")
        target = self.engine.stream(stream)
        exists = bool(name) and name in target.consumers
        if action == "update" and not exists:
            raise errors.JetStreamError(400, 10149, "consumer does not exist")
        if exists and action != "create":
            info = self.engine.update_consumer(stream, name, config)
            created = False
        else:
            info, created = self.engine.add_consumer(stream, config)
        consumer = target.consumers.get(info["name"])
        if consumer is not None and consumer.config.deliver_subject:
            loop = self.server.loop
            if loop is not None:
                loop.call_soon_threadsafe(self.push.ensure, stream, consumer)
        if created:
            self.advisories_later(lambda: self.advisories.consumer_action(stream, info["name"], "create"))
        return info

    def _consumer_info(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        _empty(payload)
        return self.engine.consumer_info(_token(tokens, 2), _token(tokens, 3))

    def _consumer_delete(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        stream, name = _token(tokens, 2), _token(tokens, 3)
        _empty(payload)
        self.engine.delete_consumer(stream, name)
        self.advisories_later(lambda: self.advisories.consumer_action(stream, name, "delete"))
        return {"success": True}

    def _consumer_unpin(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        """CONSUMER.UNPIN.<stream>.<consumer> `{"group": G}`: the request is checked before the
        consumer is looked up, as jsConsumerUnpinRequest checks it; the answer is the bare type."""
        stream, name = _token(tokens, 2), _token(tokens, 3)
        # on_unpin (`_unpinned`) announces it and wakes the pulls it held back
        self.engine.consumers.unpin(self.engine.stream, stream, name, _unpin_group(payload))
        return {}

    def _consumer_names(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = _json(payload, {"offset"}) if payload.strip() else {}
        offset = _offset(req)
        target = self.engine.stream(_token(tokens, 2))
        names = sorted(target.consumers)
        return {"total": len(names), "offset": offset, "limit": NAMES_LIMIT, "consumers": names[offset : offset + NAMES_LIMIT]}

    def _consumer_list(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = _json(payload, {"offset"}) if payload.strip() else {}
        page = self.engine.list_consumers(_token(tokens, 2), _offset(req), LIST_LIMIT)
        return {"total": page["total"], "offset": page["offset"], "limit": LIST_LIMIT, "consumers": page["consumers"]}

def _token(tokens: list[str], i: int) -> str:
    if len(tokens) <= i or not tokens[i]:
        raise errors.bad_request()
    return tokens[i]


def _json(payload: bytes, fields: set[str] | None = None) -> dict[str, Any]:
    """A request's JSON object; unknown fields are refused as nats-server's strict decoder refuses them."""
    try:
        value = orjson.loads(payload) if payload.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise errors.invalid_json(go_json_error(exc, streaming=True)) from None
    if not isinstance(value, dict):
        raise errors.invalid_json("json: cannot unmarshal into a request object")
    if fields is not None:
        unknown = set(value) - fields
        if unknown:
            raise errors.invalid_json(f'json: unknown field "{sorted(unknown)[0]}"')
    return value


def _unpin_group(payload: bytes) -> str:
    """JSApiConsumerUnpinRequest as Go's json.Unmarshal reads it (unknown fields ignored)."""
    try:
        req = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise errors.invalid_json(go_json_error(exc)) from None
    if not isinstance(req, dict):
        raise errors.invalid_json(f"json: cannot unmarshal {_go_type(req)} into Go value of type server.JSApiConsumerUnpinRequest")
    group = req.get("group")
    if group is not None and not isinstance(group, str):
        raise errors.invalid_json(f"json: cannot unmarshal {_go_type(group)} into Go struct field JSApiConsumerUnpinRequest.group of type string")
    return group or ""  # the engine checks the name


def _go_type(value: Any) -> str:
    """The JSON type's name in Go's unmarshal errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {list: "array", dict: "object"}.get(type(value), "string")


def _empty(payload: bytes) -> None:
    if payload.strip() not in (b"", b"{}"):
        raise errors.JetStreamError(400, 10038, "expected an empty request payload")


def _offset(req: dict[str, Any]) -> int:
    offset = req.get("offset", 0)
    if not is_count(offset):
        raise errors.invalid_json("offset must be a non-negative integer")
    return offset
