"""A consumer's state as it survives a restart, and the snapshot it is written as.

The snapshot is what a snapshot row of the ack table (and a new consumer's config record, its `start`)
holds: recovery restores it, then applies the events logged after it (engine/ack_ledger.py). The
retention rules read the state alone, so they are asked here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(slots=True)
class Pending:
    consumer_seq: int
    delivered_at: int
    deadline: int


@dataclass
class ConsumerState:
    """What survives a restart, as a snapshot row of the ack table holds it."""

    next_seq: int
    delivered_consumer_seq: int = 0
    delivered_stream_seq: int = 0
    ack_floor_consumer_seq: int = 0
    ack_floor_stream_seq: int = 0
    pending: dict[int, Pending] = field(default_factory=dict)
    deliveries: dict[int, int] = field(default_factory=dict)
    last_per_subject: deque[int] = field(default_factory=deque)
    exhausted: set[int] = field(default_factory=set)
    last_delivered_at: int = 0
    last_acked_at: int = 0

    def snapshot(self) -> dict[str, Any]:
        return {
            "next_seq": self.next_seq,
            "delivered": [self.delivered_consumer_seq, self.delivered_stream_seq, self.last_delivered_at],
            "ack_floor": [self.ack_floor_consumer_seq, self.ack_floor_stream_seq, self.last_acked_at],
            "pending": [[s, p.consumer_seq, p.delivered_at, p.deadline, self.deliveries.get(s, 1)]
                        for s, p in self.pending.items()],
            "last_per_subject": list(self.last_per_subject),
            "exhausted": sorted(self.exhausted),
        }

    @classmethod
    def from_snapshot(cls, snap: dict[str, Any]) -> ConsumerState:
        st = cls(next_seq=snap["next_seq"])
        st.delivered_consumer_seq, st.delivered_stream_seq, st.last_delivered_at = snap["delivered"]
        st.ack_floor_consumer_seq, st.ack_floor_stream_seq, st.last_acked_at = snap["ack_floor"]
        for seq, cseq, at, deadline, count in snap["pending"]:
            st.pending[seq] = Pending(cseq, at, deadline)
            st.deliveries[seq] = count
        st.last_per_subject = deque(snap["last_per_subject"])
        st.exhausted = set(snap["exhausted"])
        return st

    # -- retention ----------------------------------------------------------------------------

    def needs(self, seqs: np.ndarray, subjects_match: np.ndarray) -> np.ndarray:
        """Which of `seqs` this consumer still needs (JetStream's interest rule)."""
        above = seqs > self.ack_floor_stream_seq
        undelivered = seqs >= self.next_seq
        held = np.isin(seqs, np.fromiter(list(self.pending) + list(self.exhausted), np.int64))
        return subjects_match & above & (undelivered | held)

    def acknowledged(self, seq: int) -> bool:
        return (seq < self.next_seq and seq not in self.pending and seq not in self.exhausted
                and seq not in self.last_per_subject)
