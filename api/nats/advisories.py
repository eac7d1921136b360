"""JetStream advisories on `$JS.EVENT.ADVISORY.>`: stream and consumer actions, max deliveries, terms, pins.

Each is a JSON event `{"type", "id", "timestamp", ...}` published by the server; one nobody subscribes
to is not even built. Counterpart: server/jetstream_events.go and the sendAdvisory calls of
server/stream.go and server/consumer.go.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from engine.accounts.config import wire_account
from engine.info import rfc3339

if TYPE_CHECKING:
    from api.nats.subscriptions import Router

PREFIX = "$JS.EVENT.ADVISORY."
TYPE = "io.nats.jetstream.advisory.v1."
METRIC_ACK = "$JS.EVENT.METRIC.CONSUMER.ACK."
METRIC_TYPE = "io.nats.jetstream.metric.v1.consumer_ack"


class Advisories:
    def __init__(self, server: Router) -> None:
        self.server = server

    def _send(self, subject: str, kind: str, fields: dict[str, Any], event_type: str = "") -> None:
        if not self.server.sublist.has_interest(subject):
            return
        event = {"type": event_type or TYPE + kind, "id": secrets.token_hex(11), "timestamp": rfc3339(time.time_ns()), **fields}
        self.server.send(subject, orjson.dumps(event))

    def later(self, send: Callable[[], None]) -> None:
        """Advisories of threaded calls (the API's creates, updates, deletes) are sent on the loop."""
        loop = self.server.loop
        if loop is not None:
            loop.call_soon_threadsafe(send)

    def stream_action(self, stream: str, action: str) -> None:
        """action: create, delete or modify."""
        verb = {"create": "CREATED", "delete": "DELETED", "modify": "UPDATED"}[action]
        self._send(f"{PREFIX}STREAM.{verb}.{stream}", "stream_action", {"stream": stream, "action": action})

    def consumer_action(self, stream: str, consumer: str, action: str) -> None:
        verb = {"create": "CREATED", "delete": "DELETED"}[action]
        fields = {"stream": stream, "consumer": consumer, "action": action}
        self._send(f"{PREFIX}CONSUMER.{verb}.{stream}.{consumer}", "consumer_action", fields)

    def max_deliveries(self, stream: str, consumer: str, stream_seq: int, deliveries: int) -> None:
        fields = {"stream": stream, "consumer": consumer, "stream_seq": stream_seq, "deliveries": deliveries}
        self._send(f"{PREFIX}CONSUMER.MAX_DELIVERIES.{stream}.{consumer}", "max_deliver", fields)

    def terminated(self, stream: str, consumer: str, stream_seq: int, deliveries: int, reason: str) -> None:
        fields: dict[str, Any] = {"stream": stream, "consumer": consumer, "stream_seq": stream_seq, "deliveries": deliveries}
        if reason:
            fields["reason"] = reason
        self._send(f"{PREFIX}CONSUMER.MSG_TERMINATED.{stream}.{consumer}", "terminated", fields)

    def ack_metric(self, stream: str, consumer: str, consumer_seq: int, stream_seq: int, ack_time: int, deliveries: int) -> None:
        """A sampled ack (`sample_freq`): how long the message waited for it, in ns (consumer.go sampleAck)."""
        fields = {"stream": stream, "consumer": consumer, "consumer_seq": consumer_seq, "stream_seq": stream_seq,
                  "ack_time": ack_time, "deliveries": deliveries}
        self._send(f"{METRIC_ACK}{stream}.{consumer}", "", fields, METRIC_TYPE)

    def pinned(self, stream: str, consumer: str, group: str, pin_id: str) -> None:
        """A priority group's new pinned client (consumer.go sendPinnedAdvisoryLocked)."""
        fields = {"account": wire_account(self.server.name), "stream": stream, "consumer": consumer, "group": group,
                  "pinned_id": pin_id}
        self._send(f"{PREFIX}CONSUMER.PINNED.{stream}.{consumer}", "consumer_group_pinned", fields)

    def unpinned(self, stream: str, consumer: str, group: str, reason: str) -> None:
        """A pin lost: `timeout` (the pinned client went quiet) or `admin` (the unpin API)."""
        fields = {"account": wire_account(self.server.name), "stream": stream, "consumer": consumer, "group": group,
                  "reason": reason}
        self._send(f"{PREFIX}CONSUMER.UNPINNED.{stream}.{consumer}", "consumer_group_unpinned", fields)

    def naked(self, stream: str, consumer: str, stream_seq: int, deliveries: int) -> None:
        fields = {"stream": stream, "consumer": consumer, "stream_seq": stream_seq, "deliveries": deliveries}
        self._send(f"{PREFIX}CONSUMER.MSG_NAKED.{stream}.{consumer}", "nak", fields)
