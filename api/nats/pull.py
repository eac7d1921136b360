"""Pull requests: `$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>` served as nats-server serves them.

A request (empty = one message, a number, or `{"batch","expires","max_bytes","no_wait",
"idle_heartbeat"}`) waits on the consumer until its batch is delivered to its reply inbox, its
`expires` runs out (`408 Request Timeout`), or — with `no_wait` — the stream runs dry (`404 No
Messages`); a `no_wait` request whose messages earlier requests already claim gets `408 Requests
Pending`, one past the consumer's `max_batch`, `max_expires`, `max_bytes` or `max_waiting` a `409
Exceeded …`. Under `replay_policy: original` messages go one at a time, each after the gap between
the stored timestamps (engine/pacing.py, one pacer per consumer, as nats-server keeps one). It
sends `100 Idle Heartbeat` while idle, `409 Message Size Exceeds MaxBytes` or `409 Batch
Completed` around `max_bytes`, `409 Consumer Deleted` when the consumer goes and `409 Server
Shutdown` when the server stops, and stops when nobody listens on its inbox any more. Each request
is a task that fetches from the engine (on the loop when it needs no waiting) and sleeps on the
stream's waiters between fetches.
Counterpart: server/consumer.go (processNextMsgRequest, nextReqFromMsg, processWaiting,
releaseAnyPendingRequests).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from api.nats import protocol as p
from api.nats.delivery import ack_prefix, send_deliveries, send_status
from api.nats.errors import go_json_error
from api.nats.fetcher import Fetcher
from api.nats.priority import PriorityGroups, PriorityRequest
from engine import JetStreamError
from engine.consumer import Consumer, Delivery
from engine.consumer_config import go_duration
from engine.pacing import Pacer

if TYPE_CHECKING:
    from api.nats.subscriptions import Router
    from engine import JetStream

NS = 1_000_000_000
INTEREST_CHECK = 1.0
_FIELDS = {"batch", "expires", "max_bytes", "no_wait", "idle_heartbeat", "group", "min_pending", "min_ack_pending", "id", "priority"}


class BadPull(ValueError):
    """A request nats-server answers with `400 Bad Request - <reason>`."""


@dataclass(slots=True)
class PullRequest:
    batch: int = 1
    expires: int = 0
    max_bytes: int = 0
    no_wait: bool = False
    heartbeat: int = 0
    priority: PriorityRequest = field(default_factory=PriorityRequest)


def parse_request(body: bytes) -> PullRequest:
    """nextReqFromMsg: empty is one message, a number is a batch, else the JSON request."""
    text = body.strip()
    if not text:
        return PullRequest()
    if text[:1] == b"{":
        try:
            raw = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise BadPull(go_json_error(exc)) from None
        if not isinstance(raw, dict):
            raise BadPull("json: cannot unmarshal into Go value of type server.JSApiConsumerGetNextRequest")
        req = PullRequest(
            batch=_int(raw, "batch"), expires=_int(raw, "expires"), max_bytes=_int(raw, "max_bytes"),
            no_wait=bool(raw.get("no_wait", False)), heartbeat=_int(raw, "idle_heartbeat"),
        )
        if req.heartbeat > 0 and req.heartbeat * 2 > req.expires:
            raise BadPull("heartbeat value too large")
        group, pin_id = raw.get("group", ""), raw.get("id", "")
        if not isinstance(group, str) or not isinstance(pin_id, str):
            raise BadPull("json: cannot unmarshal into Go struct field .group of type string")
        req.priority = PriorityRequest(group, _int(raw, "min_pending"), _int(raw, "min_ack_pending"), _int(raw, "priority"), pin_id)
        return req
    try:
        return PullRequest(batch=int(text))
    except ValueError:
        return PullRequest()


def _int(raw: dict[str, Any], key: str) -> int:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadPull(f"json: cannot unmarshal {type(value).__name__} into Go struct field .{key} of type int")
    return value


class Pulls:
    """Every waiting pull request of the door."""

    def __init__(self, server: Router, engine: JetStream, fetcher: Fetcher, priority: PriorityGroups) -> None:
        self.server = server
        self.engine = engine
        self.fetcher = fetcher
        self.priority = priority
        self.tasks: set[asyncio.Task[None]] = set()
        self._claimed: dict[str, int] = {}  # by consumer id: messages the waiting requests still want
        self._pacers: dict[str, Pacer] = {}  # by consumer id, for replay_policy original
        self.stopping = False

    def request(self, stream: str, consumer: str, reply: bytes | None, body: bytes) -> bool:
        """A MSG.NEXT; False when the stream or consumer is missing (the client gets no responders)."""
        try:
            target = self.engine.consumers.get(self.engine.stream(stream), consumer)
        except JetStreamError:
            return False
        if not reply:
            return True
        inbox = reply.decode("utf-8", "surrogateescape")
        status = self._refusal(target, body)
        if isinstance(status, bytes):
            if status:
                send_status(self.server, inbox, status)
            return True
        self._enter(target, status)  # counted now, as processNextMsgRequest does: the next request sees it waiting
        task = asyncio.get_running_loop().create_task(self._serve(stream, target, inbox, status))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def stop(self) -> None:
        """The server stops: every waiting request ends with `409 Server Shutdown`."""
        self.stopping = True
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _enter(self, target: Consumer, req: PullRequest) -> None:
        """A request starts waiting; `_serve`'s end undoes it."""
        target.waiting += 1
        self._claimed[target.consumer_id] = self._claimed.get(target.consumer_id, 0) + req.batch
        self.priority.entered(target, req.priority)

    def _refusal(self, target: Consumer, body: bytes) -> bytes | PullRequest:
        """The status that refuses a request at once, or the parsed request."""
        config = target.config
        if config.deliver_subject:
            return p.PUSH_BASED
        try:
            req = parse_request(body)
        except BadPull as exc:
            return p.status_headers(400, f"Bad Request - {exc}")
        if req.batch <= 0:
            req.batch = 1
        if config.max_batch and req.batch > config.max_batch:
            return p.status_headers(409, f"Exceeded MaxRequestBatch of {config.max_batch}")
        if config.max_expires and req.expires > config.max_expires:
            return p.status_headers(409, f"Exceeded MaxRequestExpires of {go_duration(config.max_expires)}")
        if config.max_bytes and req.max_bytes > config.max_bytes:
            return p.status_headers(409, f"Exceeded MaxRequestMaxBytes of {config.max_bytes}")
        refused = self.priority.refusal(target, req.priority, req.batch, req.max_bytes)
        if refused is not None:
            return refused
        if req.no_wait:
            # processNextMsgRequest: messages there, but the waiting requests already claim them all
            available = target.num_pending_after([]) + target.redeliveries_queued()
            if 0 < available < self._claimed.get(target.consumer_id, 0):
                return p.status_headers(408, "Requests Pending")
        if target.waiting >= (config.max_waiting or 512):
            return b"" if req.heartbeat else p.EXCEEDED_MAX_WAITING  # a request with heartbeats waits for them to stop
        return req

    async def _serve(self, stream: str, target: Consumer, inbox: str, req: PullRequest) -> None:
        prefix = ack_prefix(stream, target.name)
        headers_only = bool(target.config.headers_only)
        started = time.monotonic()
        deadline = started + req.expires / NS if req.expires else None
        heartbeat = req.heartbeat / NS
        last_sent = started
        left, budget, delivered = req.batch, req.max_bytes, 0
        claims = self._claimed
        key = target.consumer_id
        priority = self.priority
        try:
            while True:
                if target.deleted:
                    send_status(self.server, inbox, p.CONSUMER_DELETED)
                    return
                if not self.server.sublist.has_interest(inbox):
                    return
                try:
                    pacer = self._pacer(target)
                    may_take = priority.may_take(target, req.priority)
                    got = await self.fetcher.fetch(stream, target.name, 1 if pacer else left, budget) if may_take else []
                    if got and pacer is not None:
                        delay = pacer.delay_ns(got[0].msg.ts, got[0].size, time.monotonic_ns())
                        if delay:
                            await asyncio.sleep(delay / NS)
                        pacer.delivered(got[0].msg.ts, got[0].size, time.monotonic_ns())
                except JetStreamError as exc:
                    if exc.code == 409:  # the next message is larger than the request's max_bytes
                        send_status(self.server, inbox, p.pending_status(409, "Message Size Exceeds MaxBytes", left, budget))
                    elif exc.code == 404:
                        send_status(self.server, inbox, p.CONSUMER_DELETED)
                    return
                if got:
                    pin = priority.pin_headers(target, req.priority)
                    if not send_deliveries(self.server, inbox, got, prefix, headers_only, pin):
                        return  # the deliveries stay pending and are redelivered after ack_wait, as in nats-server
                    last_sent = time.monotonic()
                    delivered += len(got)
                    left -= len(got)
                    claims[key] -= len(got)
                    if req.max_bytes:
                        budget -= _bytes(got)
                    if left <= 0:
                        if req.max_bytes and budget > 0:
                            send_status(self.server, inbox, p.pending_status(409, "Batch Completed", 0, budget))
                        return
                    if req.max_bytes and (budget <= 0 or target.budget_exhausted):
                        if budget > 0:
                            send_status(self.server, inbox, p.pending_status(409, "Message Size Exceeds MaxBytes", left, budget))
                        return
                if req.no_wait and (not req.expires or delivered):
                    send_status(self.server, inbox, p.NO_MESSAGES)
                    return
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    send_status(self.server, inbox, p.pending_status(408, "Request Timeout", left, budget))
                    return
                if heartbeat and now - last_sent >= heartbeat:
                    st = target.state
                    send_status(self.server, inbox, p.idle_heartbeat(st.delivered_consumer_seq, st.delivered_stream_seq))
                    last_sent = now
                wait = INTEREST_CHECK
                if deadline is not None:
                    wait = min(wait, deadline - now)
                if heartbeat:
                    wait = min(wait, last_sent + heartbeat - now)
                await self.fetcher.wait(stream, max(min(wait, self.fetcher.redelivery_wait(target)), 0.0005))
        except asyncio.CancelledError:
            if self.stopping:  # releaseAnyPendingRequests: each waiter hears why it ends
                send_status(self.server, inbox, p.pending_status(409, "Server Shutdown", left, budget))
            raise
        finally:
            target.waiting -= 1
            priority.left(target, req.priority)
            claims[key] -= left
            if claims[key] <= 0:
                del claims[key]


    def _pacer(self, target: Consumer) -> Pacer | None:
        if target.config.replay_policy != "original":
            return None
        found = self._pacers.get(target.consumer_id)
        if found is None:
            if len(self._pacers) > 10_000:
                self._pacers.clear()
            found = self._pacers[target.consumer_id] = Pacer(replay_original=True)
        return found


def _bytes(got: list[Delivery]) -> int:
    return sum(d.size for d in got)
