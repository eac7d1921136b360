"""Consumer events, one by one (`AckEvent`, what recovery replays) and in columns (`AckEvents`).

A pull of 500 messages is 500 deliveries and its ack request 500 acks: the hot paths build their
events as arrays, one block per request, so neither the consumer state nor the ack log walks a
Python object per message. Counterpart: the pending/ack updates of server/consumer.go.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DELIVER, ACK, NAK, WPI, TERM, EXHAUSTED = "deliver", "ack", "nak", "wpi", "term", "max_deliver"


@dataclass(slots=True)
class AckEvent:
    kind: str
    stream_seq: int
    consumer_seq: int = 0
    count: int = 0
    ts: int = 0
    delay: int = 0


@dataclass(slots=True)
class AckEvents:
    """A block of events in columns; `kind` is one string per event (mostly one repeated)."""

    kind: list[str]
    stream_seq: np.ndarray
    consumer_seq: np.ndarray
    count: np.ndarray
    ts: np.ndarray
    delay: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)

    @classmethod
    def empty(cls) -> AckEvents:
        zeros = np.zeros(0, np.int64)
        return cls([], zeros, zeros, zeros, zeros, zeros)

    @classmethod
    def of(cls, events: list[AckEvent]) -> AckEvents:
        """The slow paths' events (redeliveries, naks, timers) as a block."""
        if not events:
            return cls.empty()
        columns = np.array([(e.stream_seq, e.consumer_seq, e.count, e.ts, e.delay) for e in events], np.int64)
        return cls([e.kind for e in events], *(np.ascontiguousarray(columns[:, i]) for i in range(5)))

    @classmethod
    def uniform(cls, kind: str, stream_seqs: np.ndarray, ts: int, *, first_consumer_seq: int = 0, count: int = 0,
                delay: int = 0) -> AckEvents:
        """`len(stream_seqs)` events of one kind at one time: a pull's new deliveries (consumer
        sequences counting up from `first_consumer_seq`) or one request's acks (consumer sequence 0)."""
        n = len(stream_seqs)
        cseqs = np.arange(first_consumer_seq, first_consumer_seq + n, dtype=np.int64) if first_consumer_seq else np.zeros(n, np.int64)
        return cls([kind] * n, stream_seqs.astype(np.int64, copy=False), cseqs, np.full(n, count, np.int64),
                   np.full(n, ts, np.int64), np.full(n, delay, np.int64))

    @classmethod
    def concat(cls, blocks: list[AckEvents]) -> AckEvents:
        blocks = [b for b in blocks if len(b)]
        if len(blocks) == 1:
            return blocks[0]
        if not blocks:
            return cls.empty()
        kinds: list[str] = []
        for b in blocks:
            kinds += b.kind
        return cls(kinds, *(np.concatenate([getattr(b, f) for b in blocks]) for f in ("stream_seq", "consumer_seq", "count", "ts", "delay")))

    def to_list(self) -> list[AckEvent]:
        return [
            AckEvent(k, s, c, n, t, d)
            for k, s, c, n, t, d in zip(self.kind, self.stream_seq.tolist(), self.consumer_seq.tolist(),
                                        self.count.tolist(), self.ts.tolist(), self.delay.tolist(), strict=True)
        ]
