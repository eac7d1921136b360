"""What every stream store provides, and the records that travel through it.

A store keeps the payloads; the stream's `MessageIndex` keeps what is live. `MemoryStore` holds
everything in memory (`storage: memory`, gone after a restart, as in JetStream); `DeltaStore` adds
the write-ahead log and the Delta table. Counterpart: server/store.go (StreamStore).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from typing import TYPE_CHECKING

import numpy as np

from engine.index import MessageIndex
from engine.store.stored_message import StoredMessage

if TYPE_CHECKING:
    from engine.store.layout import Partitioner
    from engine.store.rows import RowGroup

__all__ = ["Recovered", "Removal", "StoredMessage", "StreamStore"]


@dataclass(slots=True)
class Removal:
    """A logical deletion: inclusive sequence ranges, why, and whether it must be erased securely.

    `last_seq` carries the stream's last sequence when it was made, so a purge past the end (which
    moves the next sequence forward) survives a restart.
    """

    ranges: list[tuple[int, int]]
    reason: str
    erase: bool = False
    last_seq: int = 0
    ts: int = 0


@dataclass(slots=True)
class Recovered:
    """What a store hands back after a restart: the rebuilt index and the duplicate window's ids."""

    msg_ids: list[tuple[str, int, int]] = field(default_factory=list)  # (msg_id, seq, ts), in seq order
    last_msg_id: str | None = None
    index: MessageIndex | None = None


class StreamStore(Protocol):
    partitioner: Partitioner  # the table partition of a subject (memory streams: never written)

    def append(self, groups: list[RowGroup], removals: list[Removal]) -> None:
        """Makes the accepted messages (row groups in sequence order) and removals durable (per the sync
        policy) before returning."""

    def load(self, seq: int, index: MessageIndex, subject: str | None = None) -> StoredMessage | None:
        """The live message `seq` or None; `subject`, when the caller knows it, may spare a read."""

    def load_many(self, seqs: list[int], index: MessageIndex) -> dict[int, StoredMessage]: ...

    def new_index(self) -> MessageIndex:
        """An empty index wired to this store (a file stream's reads its details from the table)."""

    def recover(self, msg_id_since_ns: int) -> Recovered: ...

    def drop_snapshot(self) -> None:
        """Forgets any persisted copy of the index (an erasure: the next one is written without it)."""

    def pending_bytes(self) -> int: ...

    def refusal(self) -> str | None:
        """Why new messages are refused now (the unflushed backlog is full); None when they are taken."""

    def log_bytes(self) -> int:
        """Bytes in the write-ahead log not yet removed."""

    def unflushed_age(self, now: float | None = None) -> float:
        """Seconds since the oldest append not yet committed to the table."""

    def forget(self, seqs: np.ndarray) -> None:
        """Drops every in-memory copy of erased messages (GDPR)."""

    def close(self) -> None: ...

    def destroy(self) -> None: ...
