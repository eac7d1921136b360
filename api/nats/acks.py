"""Acks on `$JS.ACK.…`: what a delivered message's reply subject and the ack payload ask for.

The subject is the v1 form `$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` or
the v2 form with a domain and an account hash in front (11 tokens or more). The payload: empty,
`+ACK` or `+OK` ack; `-NAK` redelivers (after `{"delay": ns}` or a Go duration); `+WPI` restarts the
ack timer; `+TERM [reason]` stops redelivery; `+NXT [request]` acks and pulls the next message to the
ack's reply subject. An ack with a reply subject (a double ack) is answered with an empty message once
applied. Under `sample_freq` a sampled ack of a pending message publishes its metric on
`$JS.EVENT.METRIC.CONSUMER.ACK.<stream>.<consumer>` (`ack_time`: ns since its delivery). Acks are
applied in order with the connection's other writes (api/nats/writes.py). The bulk of ack traffic —
a plain `+ACK` on a v1 subject, no reply — is recognised from the subject's bytes (`plain_of`)
before any other routing, with the consumer looked up once per run of its acks; the plain acks of the
same consumer that follow it in a read are matched whole by one pattern (`PlainAckOf.run`).
Counterpart: server/consumer.go (processAck, processNak, ackReplyInfo).
"""

from __future__ import annotations

import random
import re
import time
from typing import TYPE_CHECKING, NamedTuple

from api.nats.advisories import Advisories
from api.nats.messages import loads_or_none
from api.nats.pull import Pulls
from api.nats.writes import Ack, Writes
from engine import JetStreamError

if TYPE_CHECKING:
    from api.nats.subscriptions import Client
    from engine import JetStream
    from engine.consumer import Consumer

NS = 1_000_000_000
_NAK = b"-NAK"
_PLAIN = (b"+ACK", b"", b"+OK")  # the payloads of a plain ack, as sent (anything else goes the general way)


class PlainAckOf(NamedTuple):
    """What `Acks.plain_of` found: the consumer, the stream sequence acked, and the pattern of the same
    consumer's next plain acks in the read (group 1: the stream sequence)."""

    stream: str
    consumer: str
    seq: int
    run: re.Pattern[bytes]


class Acks:
    def __init__(self, engine: JetStream, advisories: Advisories, writes: Writes, pulls: Pulls) -> None:
        self.engine = engine
        self.advisories = advisories
        self.writes = writes
        self.pulls = pulls
        self._targets: dict[tuple[str, str], Consumer] = {}  # a consumer's acks arrive in runs: one lookup per run
        self._plain: dict[tuple[bytes, bytes], tuple[str, str, Consumer, re.Pattern[bytes]]] = {}  # by the subject's bytes

    def _target(self, stream: str, consumer: str) -> Consumer | None:
        """The consumer acked, as `engine.stream(...)` then `consumers.get(...)` find it (None: nobody listens);
        a cached one is used while it, its stream and the stream's availability are as they were."""
        key = (stream, consumer)
        target = self._targets.get(key)
        if target is not None and _usable(target):
            return target
        try:
            target = self.engine.consumers.get(self.engine.stream(stream), consumer)
        except JetStreamError:
            self._targets.pop(key, None)
            return None
        if len(self._targets) > 1024:
            self._targets.clear()
        self._targets[key] = target
        return target

    def plain_of(self, subject: bytes, payload: bytes) -> PlainAckOf | None:
        """The consumer and stream sequence of a reply-less publish that `handle` would take as a plain
        ack (`plain_ack`), read from the subject's bytes; None for anything else (it goes through `handle`)."""
        if payload not in _PLAIN:
            return None
        tokens = subject.split(b".")
        if len(tokens) != 9:
            return None
        seq = tokens[5]
        if not seq.isdigit() or not tokens[4].isdigit():
            return None
        key = (tokens[2], tokens[3])
        known = self._plain.get(key)
        if known is None or not _usable(known[2]):
            stream, consumer = tokens[2].decode("utf-8", "surrogateescape"), tokens[3].decode("utf-8", "surrogateescape")
            target = self._target(stream, consumer)
            if target is None:
                return None
            if len(self._plain) > 1024:
                self._plain.clear()
            known = self._plain[key] = (stream, consumer, target, _run_pattern(tokens[2], tokens[3]))
        target = known[2]
        if target.config.sample_freq or target.ack_none:
            return None
        return PlainAckOf(known[0], known[1], int(seq), known[3])

    def handle(self, conn: Client, subject: str, reply: bytes | None, payload: bytes) -> bool:
        """`$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>` (or the v2 form)."""
        tokens = subject.split(".")
        if len(tokens) == 9:
            stream, consumer, delivered, seq = tokens[2], tokens[3], tokens[4], tokens[5]
        elif len(tokens) >= 11:
            stream, consumer, delivered, seq = tokens[4], tokens[5], tokens[6], tokens[7]
        else:
            return False
        if not seq.isdigit() or not delivered.isdigit():
            return False
        target = self._target(stream, consumer)
        if target is None:
            return False
        body = payload.strip()
        kind, delay, reason, next_request = "ack", 0, "", None
        if not body or body in (b"+ACK", b"+OK"):
            if not reply and not target.config.sample_freq and not target.ack_none:
                self.writes.plain_ack(conn, stream, consumer, int(seq))  # the bulk of ack traffic
                return True
        elif body.startswith(_NAK):
            kind, delay = "nak", _nak_delay(body[len(_NAK) :].strip())
            self.advisories.naked(stream, consumer, int(seq), int(delivered))
        elif body == b"+WPI":
            kind = "wpi"
        elif body.startswith(b"+TERM"):
            kind, reason = "term", body[5:].strip().decode("utf-8", "replace")
        elif body.startswith(b"+NXT"):
            next_request = body[4:].strip()
        else:
            return True  # an unknown ack payload is ignored, as nats-server does
        if target.ack_none:
            return True
        if kind == "ack" and target.config.sample_freq:
            self._sample(target, stream, consumer, int(seq), int(delivered))
        ack = Ack(stream, consumer, int(seq), kind, delay, None if next_request is not None else reply, reason, int(delivered))
        self.writes.ack(conn, ack)
        if next_request is not None and reply:
            self.pulls.request(stream, consumer, reply, next_request)
        return True


    def _sample(self, target: Consumer, stream: str, consumer: str, seq: int, delivered: int) -> None:
        """consumer.go shouldSample/sampleAck: a pending message's ack, sampled at `sample_freq` percent."""
        pending = target.state.pending.get(seq)
        if pending is None or not _sampled(target.config.sample_freq or ""):
            return
        ack_time = time.time_ns() - pending.delivered_at
        self.advisories.ack_metric(stream, consumer, pending.consumer_seq, seq, ack_time, delivered)


def _run_pattern(stream: bytes, consumer: bytes) -> re.Pattern[bytes]:
    """A whole `PUB <v1 ack subject of this consumer> <size>\r\n<plain payload>\r\n`, written as the
    parser's hot path and `plain_of` take it (single spaces, ASCII digits for the delivery count and the
    stream sequence, tokens without whitespace); anything else does not match and goes the general way."""
    token = rb"[^.\s]*"
    return re.compile(
        rb"PUB \$JS\.ACK\." + re.escape(stream) + rb"\." + re.escape(consumer) + rb"\.\d+\.(\d+)\."
        + token + rb"\." + token + rb"\." + token + rb" (?:4\r\n\+ACK|3\r\n\+OK|0\r\n)\r\n"
    )


def _usable(target: Consumer) -> bool:
    """Whether a looked-up consumer is still the one its name finds: not deleted, its stream neither."""
    held = target.stream
    return not target.deleted and not held.deleted and held.unavailable is None


def _sampled(sample_freq: str) -> bool:
    text = sample_freq.strip().removesuffix("%")
    percent = int(text) if text.isdigit() else 0
    return percent >= 100 or (percent > 0 and random.randrange(100) <= percent)


def _nak_delay(text: bytes) -> int:
    """`-NAK {"delay": ns}` or `-NAK <go duration>`; anything else is an immediate redelivery."""
    if not text:
        return 0
    if text.startswith(b"{"):
        value = loads_or_none(text)
        delay = value.get("delay", 0) if isinstance(value, dict) else 0
        return delay if isinstance(delay, int) and not isinstance(delay, bool) and delay > 0 else 0
    return _go_duration_ns(text.decode("ascii", "replace"))


_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": NS, "m": 60 * NS, "h": 3600 * NS}
_GO_DURATION = re.compile(r"((?:\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+")
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def _go_duration_ns(text: str) -> int:
    """Go's time.ParseDuration for the positive forms a -NAK carries (`5s`, `1m30s`, `250ms`); 0 if not one."""
    if not _GO_DURATION.fullmatch(text):
        return 0
    return int(sum(float(number) * _UNITS[unit] for number, unit in _GO_PART.findall(text)))
