"""What a pull hands out: one message with its delivery's counts, and what it weighs in a pull's budget."""

from __future__ import annotations

from dataclasses import dataclass

from engine.index import MessageIndex
from engine.messages import STORE_OVERHEAD
from engine.store.base import StoredMessage


def message_bytes(index: MessageIndex, seq: int) -> int:
    """What a message counts for in a pull's `max_bytes`: subject, headers and data."""
    return index.size_of(seq) - STORE_OVERHEAD


@dataclass(slots=True)
class Delivery:
    msg: StoredMessage
    consumer_seq: int
    num_delivered: int
    num_pending: int
    consumer_id: str
    size: int

    @property
    def token(self) -> str:
        """The HTTP door's ack token, made when asked: the NATS door acks by reply subject instead."""
        return f"{self.consumer_id}.{self.msg.seq}.{self.consumer_seq}.{self.num_delivered}"
