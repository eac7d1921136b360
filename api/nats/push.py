"""Push consumers: what the engine's `fetch` returns, pushed to the consumer's deliver subject.

One task per push consumer. It delivers only while somebody subscribes to the deliver subject (one
member of `deliver_group`, if set), sends `100 Idle Heartbeat` (`Nats-Last-Consumer`,
`Nats-Last-Stream`) when idle for `idle_heartbeat`, and with `flow_control` sends `100 FlowControl
Request` with a `$JS.FC.…` reply after each window of bytes and waits for the client's answer
(heartbeats then carry `Nats-Consumer-Stalled`). Ordered consumers, as nats.py and nats.go build them
for KV watches and object gets, are ephemeral push consumers of this kind. While bound, a consumer
counts as active, so an ephemeral one is removed only once its subscriber has been gone for its
`inactive_threshold`. With `replay_policy: original` or `rate_limit_bps` deliveries go one at a time,
each after the wait engine/pacing.py computes (the stored timestamps' gaps; bits per second).
Counterpart: server/consumer.go (deliverMsg, sendFlowControl, processFlowControl,
sendIdleHeartbeat, loopAndGatherMsgs's replay and rate limit).
"""

from __future__ import annotations

import asyncio
import secrets
import string
import time
from typing import TYPE_CHECKING

from api.nats import protocol as p
from api.nats.delivery import ack_prefix, frames, receivers, send_frames, send_status
from api.nats.fetcher import Fetcher
from engine import JetStreamError
from engine.consumer import Consumer
from engine.pacing import Pacer
from engine.subjects import subject_matches

if TYPE_CHECKING:
    from api.nats.subscriptions import Router
    from engine import JetStream

NS = 1_000_000_000
BATCH = 256
FLOW_WINDOW = 2 * 1024 * 1024
UNBOUND_CHECK = 1.0
_FC_ALPHABET = string.ascii_letters + string.digits


class _Push:
    """One push consumer's delivery state."""

    __slots__ = ("stream", "consumer", "fc_reply", "window", "pacer")

    def __init__(self, stream: str, consumer: Consumer, pacer: Pacer) -> None:
        self.stream = stream
        self.consumer = consumer
        self.fc_reply: str | None = None  # the flow-control request waiting for its answer
        self.window = 0  # bytes delivered since the last flow-control request
        self.pacer = pacer


class PushConsumers:
    def __init__(self, server: Router, engine: JetStream, fetcher: Fetcher) -> None:
        self.server = server
        self.engine = engine
        self.fetcher = fetcher
        self._tasks: dict[str, asyncio.Task[None]] = {}  # by consumer id
        self._states: dict[str, _Push] = {}
        self._flow: dict[str, _Push] = {}  # by flow-control reply subject

    def ensure_all(self) -> None:
        """Starts delivery for every push consumer that has none (recovered, or created over HTTP)."""
        for stream in self.engine.streams():
            for consumer in list(stream.consumers.values()):
                if consumer.config.deliver_subject and consumer.consumer_id not in self._tasks:
                    self.ensure(stream.name, consumer)

    def ensure(self, stream: str, consumer: Consumer) -> None:
        if consumer.consumer_id in self._tasks or not consumer.config.deliver_subject:
            return
        config = consumer.config
        max_msg_size = consumer.stream.config.max_msg_size
        burst = max_msg_size if max_msg_size and max_msg_size > 0 else self.engine.options.max_payload
        state = _Push(stream, consumer, Pacer(config.replay_policy == "original", config.rate_limit_bps, burst))
        task = asyncio.get_running_loop().create_task(self._run(state))
        self._tasks[consumer.consumer_id] = task
        self._states[consumer.consumer_id] = state
        task.add_done_callback(lambda _t, cid=consumer.consumer_id: self._ended(cid))

    def _ended(self, consumer_id: str) -> None:
        self._tasks.pop(consumer_id, None)
        state = self._states.pop(consumer_id, None)
        if state is not None and state.fc_reply:
            self._flow.pop(state.fc_reply, None)

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def interest_changed(self, subject: str) -> None:
        """A new subscription: push consumers delivering to it start now, not at their next check."""
        for state in self._states.values():
            if subject_matches(subject, state.consumer.config.deliver_subject or ""):
                self.fetcher.wake(state.stream)

    def flow_control_answer(self, subject: str) -> bool:
        """A client's answer to a flow-control request (or to a stalled heartbeat)."""
        state = self._flow.pop(subject, None)
        if state is None:
            return subject.startswith("$JS.FC.")  # an answer to a superseded request: consumed silently
        if state.fc_reply == subject:
            state.fc_reply = None
            state.window = 0
            self.fetcher.wake(state.stream)
        return True

    async def _run(self, state: _Push) -> None:
        consumer, stream = state.consumer, state.stream
        config = consumer.config
        target = config.deliver_subject or ""
        heartbeat = config.idle_heartbeat / NS
        prefix = ack_prefix(stream, consumer.name)
        headers_only = bool(config.headers_only)
        bound = False
        last_sent = time.monotonic()
        try:
            while not consumer.deleted:
                match = self.server.sublist.match(target)
                if bool(match) != bound:
                    bound = bool(match)
                    consumer.waiting += 1 if bound else -1
                    last_sent = time.monotonic()
                if not bound:
                    await self.fetcher.wait(stream, UNBOUND_CHECK)
                    continue
                if state.fc_reply is None and all(s.conn.writable for s in receivers(match)):
                    try:
                        got = await self.fetcher.fetch(stream, consumer.name, 1 if state.pacer.active else BATCH, 0)
                    except JetStreamError:
                        return  # the consumer or its stream is gone
                    if got:
                        framed = frames(got, prefix, headers_only)
                        if state.pacer.active:
                            await self._pace(state.pacer, got[0].msg.ts, framed[0])
                        send_frames(self.server, target, framed)
                        last_sent = time.monotonic()
                        if config.flow_control:
                            state.window += sum(d.size for d in got)
                            if state.window >= FLOW_WINDOW:
                                self._request_flow_control(state, target)
                        await asyncio.sleep(0)
                        continue
                now = time.monotonic()
                if heartbeat and now - last_sent >= heartbeat:
                    st = consumer.state
                    hb = p.idle_heartbeat(st.delivered_consumer_seq, st.next_seq - 1, state.fc_reply)
                    send_status(self.server, target, hb)
                    last_sent = now
                wait = heartbeat - (now - last_sent) if heartbeat else UNBOUND_CHECK
                if state.fc_reply is None:
                    wait = min(wait, self.fetcher.redelivery_wait(consumer))
                await self.fetcher.wait(stream, max(min(wait, UNBOUND_CHECK), 0.001))
        finally:
            if bound:
                consumer.waiting -= 1

    @staticmethod
    async def _pace(pacer: Pacer, stored_ts: int, frame: tuple[bytes, bytes, bytes | None, bytes]) -> None:
        subject, reply, hdr, payload = frame
        size = len(subject) + len(reply) + len(hdr or b"") + len(payload)
        delay = pacer.delay_ns(stored_ts, size, time.monotonic_ns())
        if delay:
            await asyncio.sleep(delay / NS)
        pacer.delivered(stored_ts, size, time.monotonic_ns())

    def _request_flow_control(self, state: _Push, target: str) -> None:
        token = "".join(secrets.choice(_FC_ALPHABET) for _ in range(4))
        reply = f"$JS.FC.{state.stream}.{state.consumer.name}.{token}"
        if state.fc_reply:
            self._flow.pop(state.fc_reply, None)
        state.fc_reply = reply
        self._flow[reply] = state
        send_status(self.server, target, p.FLOW_CONTROL_REQUEST, reply)
