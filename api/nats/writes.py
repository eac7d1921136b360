"""A connection's JetStream writes — publishes to streams and acks — applied in the order it sent them.

Everything one read of a connection brings is collected, then applied at the end of the read: on the
event loop when the engine needs no waiting (`publish_nowait`, `ack_nowait`: no thread hand-off on
the hot path), else in a worker thread. While a batch is in a thread, later writes of the connection
queue behind it, so a client's messages are stored in the order it published them; past
`MAX_QUEUED` queued writes the connection stops being read until the engine catches up (nats-server
bounds its ingest queue the same way). Answers — PubAcks, double-ack replies — follow each batch;
applied acks are told to the callback the JetStream API gives (pulls waiting on room wake up).
A PING takes its place among the writes (`Then`): its PONG follows the PubAcks of what came before it.
Counterpart: the ingest path of server/stream.go (processInboundJetStreamMsg) and consumer.go
(processAck).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import pyarrow as pa

from api.nats import protocol as p
from api.nats.advisories import Advisories
from api.nats.errors import wire_error
from engine import AckRun, InboundMessage, JetStreamError, PlainBatch, PubAck
from engine.messages import PublishResult

if TYPE_CHECKING:
    from api.nats.subscriptions import Client, Router
    from engine import JetStream

log = logging.getLogger(__name__)

MAX_QUEUED = 20_000


@dataclass(slots=True)
class Ack:
    """One `$JS.ACK` message: what to apply, and where the double-ack reply goes."""

    stream: str
    consumer: str
    seq: int
    kind: str
    delay: int
    reply: bytes | None
    reason: str = ""
    deliveries: int = 0


@dataclass(slots=True)
class PlainAcks:
    """Consecutive plain acks (`+ACK`, no reply) of one consumer: a read's worth, kept as sequences."""

    stream: str
    consumer: str
    seqs: list[int]


@dataclass(slots=True)
class Then:
    """A point in a connection's writes: `callback` runs once every write queued before it is applied
    and answered (a PING's PONG waits there)."""

    callback: Callable[[], None]


class _Queue:
    __slots__ = ("items", "busy", "paused")

    def __init__(self) -> None:
        self.items: list[tuple[InboundMessage, bytes | None] | Ack | PlainAcks | Then] = []
        self.busy = False
        self.paused = False


class Writes:
    def __init__(self, server: Router, engine: JetStream, advisories: Advisories, acks_applied: Callable[[str, str], None]) -> None:
        self.server = server
        self.engine = engine
        self.advisories = advisories
        self.acks_applied = acks_applied
        self._queues: dict[int, _Queue] = {}

    def _queue(self, conn: Client) -> _Queue:
        queue = self._queues.get(conn.cid)
        if queue is None:
            queue = self._queues[conn.cid] = _Queue()
        return queue

    def publish(self, conn: Client, subject: str, reply: bytes | None, hdr: bytes | None, payload: bytes) -> None:
        headers = None
        if hdr is not None:
            try:
                _, headers = p.decode_headers(hdr)  # a status line is never stored
            except ValueError:
                headers = None
        self._queue(conn).items.append((InboundMessage(subject, payload, headers), reply))

    def ack(self, conn: Client, ack: Ack) -> None:
        self._queue(conn).items.append(ack)

    def plain_ack(self, conn: Client, stream: str, consumer: str, seq: int) -> None:
        """A `+ACK` without a reply: joins the plain acks of the same consumer just before it."""
        self.plain_acks(conn, stream, consumer, [seq])

    def plain_acks(self, conn: Client, stream: str, consumer: str, seqs: list[int]) -> None:
        """`plain_ack` of each of `seqs`, in order."""
        items = self._queue(conn).items
        last = items[-1] if items else None
        if type(last) is PlainAcks and last.consumer == consumer and last.stream == stream:
            last.seqs += seqs
        else:
            items.append(PlainAcks(stream, consumer, seqs))

    def after_writes(self, conn: Client, callback: Callable[[], None]) -> bool:
        """Runs `callback` once the writes `conn` sent before now are applied and answered, so that a
        client's flush (PING, then PONG) means its publishes are stored and visible to every connection.
        False when none is waiting: the caller runs it at once."""
        queue = self._queues.get(conn.cid)
        if queue is None or not (queue.items or queue.busy):
            return False
        queue.items.append(Then(callback))
        return True

    def forget(self, conn: Client) -> None:
        queue = self._queues.get(conn.cid)
        if queue is not None and not queue.busy:
            del self._queues[conn.cid]

    def submit(self, conn: Client) -> None:
        """Applies what the last read of `conn` brought (unless a batch of it is still in a thread)."""
        queue = self._queues.get(conn.cid)
        if queue is None or not queue.items:
            return
        if queue.busy:
            if len(queue.items) > MAX_QUEUED and not queue.paused:
                queue.paused = True
                conn.pause_reading()
            return
        items, queue.items = queue.items, []
        runs = [items] if len(items) == 1 else _runs(items)  # one write (a sync publisher's): its own run
        done = 0
        if len(items) == 1 and type(items[0]) is tuple:
            done = int(self._publish_lone(items[0]))
        else:
            for run in runs:
                if not self._apply_now(run):
                    break
                done += 1
        if done < len(runs):
            queue.busy = True
            rest = runs[done:]
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(None, self._apply_all, rest)
            future.add_done_callback(lambda f: self._applied(conn, queue, f))
        elif conn.closed:
            self._queues.pop(conn.cid, None)

    def _applied(self, conn: Client, queue: _Queue, future: asyncio.Future[list[Any]]) -> None:
        queue.busy = False
        try:
            answers = future.result()
        except Exception:  # noqa: BLE001 - the engine failed as a whole: every write of the batch is refused
            log.exception("applying a connection's JetStream writes failed")
            answers = []
        for answer in answers:
            answer()
        if queue.paused and not conn.closed:
            queue.paused = False
            conn.resume_reading()
        if conn.closed and not queue.items:
            self._queues.pop(conn.cid, None)
            return
        self.submit(conn)

    # -- one run of publishes or of acks --------------------------------------------------------

    def _apply_now(self, run: list[Any]) -> bool:
        """Applies a run on the loop if the engine can do it without waiting; False: it needs a thread."""
        first = run[0]
        if type(first) is Then:
            first.callback()
            return True
        if type(first) is PlainAcks:
            try:
                if self.engine.ack_run_nowait(first.stream, first.consumer, first.seqs, "ack") is None:
                    return False
            except JetStreamError:  # the stream or consumer went meanwhile: no reply was asked for
                pass
            self.acks_applied(first.stream, first.consumer)
            return True
        if isinstance(first, Ack):
            try:
                results = self.engine.ack_nowait(run[0].stream, run[0].consumer, [(a.seq, a.kind, a.delay) for a in run])
            except JetStreamError as exc:
                results = [exc] * len(run)
            if results is None:
                return False
            self._answer_acks(run, results)
            return True
        batch = _plain(run)
        try:
            if batch is not None:
                answer = self.engine.publish_batch_nowait(batch)
            else:
                answer = self.engine.publish_nowait([m for m, _ in run])
        except JetStreamError as exc:  # the stream is offline, its log full, or it was deleted meanwhile
            answer = [exc] * len(run)
        if answer is None:
            return False
        self._answer_publishes(run, answer.results() if isinstance(answer, AckRun) else answer, answer)
        return True

    def _publish_lone(self, item: tuple[InboundMessage, bytes | None]) -> bool:
        """A read that brought one publish (a sync publisher's): stored and answered here, without the
        run machinery; False if the engine must wait (the caller then takes the general way)."""
        msg, reply = item
        try:
            results = self.engine.publish_nowait([msg])
        except JetStreamError as exc:  # the stream is offline, its log full, or it was deleted meanwhile
            results = [exc]
        if results is None:
            return False
        if reply:
            self.server.reply(reply, puback_json(results[0], msg.subject, self.engine))
        return True

    def _apply_all(self, runs: list[list[Any]]) -> list[Any]:
        """In a worker thread: applies the runs in order; returns the answers to send on the loop."""
        answers: list[Any] = []
        for run in runs:
            first = run[0]
            if type(first) is Then:
                answers.append(first.callback)
            elif type(first) is PlainAcks:
                try:
                    self.engine.ack_run(first.stream, first.consumer, first.seqs, "ack")
                except JetStreamError:
                    pass
                answers.append(lambda first=first: self.acks_applied(first.stream, first.consumer))
            elif isinstance(first, Ack):
                results = self._ack_blocking(run)
                answers.append(lambda run=run, results=results: self._answer_acks(run, results))
            else:
                batch = _plain(run)
                try:
                    answer = self.engine.publish_batch(batch) if batch is not None else self.engine.publish([m for m, _ in run])
                except JetStreamError as exc:
                    answer = [exc] * len(run)
                results = answer.results() if isinstance(answer, AckRun) else answer
                answers.append(lambda run=run, results=results, answer=answer: self._answer_publishes(run, results, answer))
        return answers

    def _ack_blocking(self, run: list[Ack]) -> list[JetStreamError | None]:
        try:
            return self.engine.ack(run[0].stream, run[0].consumer, [(a.seq, a.kind, a.delay) for a in run])
        except JetStreamError as exc:
            return [exc] * len(run)

    def _answer_publishes(self, run: list[tuple[InboundMessage, bytes | None]], results: list[PublishResult], answer: Any = None) -> None:
        send = self.server.reply
        if isinstance(answer, AckRun):  # a whole run accepted: one prefix, consecutive sequences
            prefix = _ack_prefix(answer.stream)
            for i, (_, reply) in enumerate(run):
                if reply:
                    send(reply, prefix % (answer.first_seq + i))
            return
        for (msg, reply), result in zip(run, results, strict=True):
            if reply:
                send(reply, puback_json(result, msg.subject, self.engine))

    def _answer_acks(self, run: list[Ack], results: list[JetStreamError | None]) -> None:
        self.acks_applied(run[0].stream, run[0].consumer)
        for ack, result in zip(run, results, strict=True):
            if ack.kind == "term" and result is None:
                self.advisories.terminated(ack.stream, ack.consumer, ack.seq, ack.deliveries, ack.reason)
            if ack.reply:
                self.server.reply(ack.reply, b"")


_PREFIXES: dict[str, bytes] = {}


def _ack_prefix(stream: str) -> bytes:
    """`{"stream":"S","seq":%d}`, kept per stream: a PubAck is one %-format."""
    prefix = _PREFIXES.get(stream)
    if prefix is None:
        if len(_PREFIXES) > 4096:
            _PREFIXES.clear()
        prefix = _PREFIXES[stream] = b'{"stream":' + orjson.dumps(stream).replace(b"%", b"%%") + b',"seq":%d}'
    return prefix


def _plain(run: list[tuple[InboundMessage, bytes | None]]) -> PlainBatch | None:
    """A run without headers as columns, the engine's cheapest way in; None if a message has headers."""
    if len(run) < 2 or any(m.headers is not None for m, _ in run):
        return None
    return PlainBatch([m.subject for m, _ in run], pa.array([m.data for m, _ in run], pa.binary()))


def puback_json(result: PublishResult, subject: str, engine: JetStream) -> bytes:
    """nats-server's PubAck, or its error form `{"error": {...}, "stream": S, "seq": 0}`."""
    if type(result) is PubAck:
        if result.duplicate:
            return b'{"stream":%b,"seq":%d,"duplicate":true}' % (orjson.dumps(result.stream), result.seq)
        return _ack_prefix(result.stream) % result.seq
    assert isinstance(result, JetStreamError)
    stream = engine.stream_name_for_subject(subject)
    return orjson.dumps({"error": wire_error(result), "stream": stream or "", "seq": 0})


def _runs(items: list[Any]) -> list[list[Any]]:
    """Consecutive publishes, and consecutive acks of one consumer, each a run; plain acks are one
    already, and so is a `Then`."""
    runs: list[list[Any]] = []
    last_key: Any = None
    for item in items:
        kind = type(item)
        if kind is PlainAcks or kind is Then:
            runs.append([item])
            last_key = item
            continue
        key = (item.stream, item.consumer) if kind is Ack else None
        if runs and key == last_key:
            runs[-1].append(item)
        else:
            runs.append([item])
            last_key = key
    return runs
