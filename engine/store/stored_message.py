"""A message as a store hands it back: subject, sequence, time, payload, headers, message id.

The record every reader of a stream's bytes returns (the log, the row groups, the table). It sits
below engine/store/base.py (the store contract, which re-exports it) and engine/store/rows.py, so
the contract can name row groups without an import circle. Counterpart: server/store.go (StoreMsg).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StoredMessage:
    subject: str
    seq: int
    ts: int
    data: bytes
    headers: dict[str, list[str]] | None = None
    msg_id: str | None = None
