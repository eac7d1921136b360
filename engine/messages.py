"""What a publish carries in and what it answers: messages, PubAcks, and their columnar forms.

A publish arrives as `InboundMessage`s, or as a `PlainBatch` (columns, no headers: a decoded binary
batch), and is answered per message with a `PubAck` or the error, or for a plain batch accepted whole
with one `AckRun`. Counterpart: the PubAck of server/stream.go.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import JetStreamError

DEFAULT_MAX_PAYLOAD = 1024 * 1024
STORE_OVERHEAD = 16


@dataclass(slots=True)
class InboundMessage:
    subject: str
    data: bytes
    headers: dict[str, list[str]] | None = None


@dataclass(slots=True)
class PubAck:
    stream: str
    seq: int
    duplicate: bool = False

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"stream": self.stream, "seq": self.seq}
        if self.duplicate:
            out["duplicate"] = True
        return out


PublishResult = PubAck | JetStreamError


@dataclass(slots=True)
class PlainBatch:
    """Messages without headers as columns: a decoded binary batch with no Python object per message.

    `data` is one Arrow binary array holding every payload once; it becomes the stored column as it is.
    """

    subjects: list[str]
    data: pa.BinaryArray
    _subject_column: pa.StringArray | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.subjects)

    def subject_column(self) -> pa.StringArray:
        """The subjects as one Arrow string column (made once: routing checks it, the table stores it)."""
        if self._subject_column is None:
            self._subject_column = pa.array(self.subjects, pa.string())
        return self._subject_column

    def lengths(self) -> np.ndarray:
        """Payload lengths from the array's offsets, without touching a payload."""
        offsets = np.frombuffer(self.data.buffers()[1], np.int32, len(self.data) + 1, self.data.offset * 4)
        return np.diff(offsets).astype(np.int64)

    def messages(self) -> list[InboundMessage]:
        """The same messages one by one, for the per-message path (checks a plain run cannot skip)."""
        return list(map(InboundMessage, self.subjects, self.data.to_pylist()))


@dataclass(slots=True, frozen=True)
class AckRun:
    """The PubAcks of a plain batch accepted whole: `count` consecutive sequences from `first_seq`."""

    stream: str
    first_seq: int
    count: int

    def results(self) -> list[PublishResult]:
        return [PubAck(self.stream, seq) for seq in range(self.first_seq, self.first_seq + self.count)]


PublishRequest = list[InboundMessage] | PlainBatch
PublishAnswer = list[PublishResult] | AckRun


def message_size(subject: str, headers_size: int, data_len: int) -> int:
    """Bytes a message counts for in `max_bytes` and the stream state (memstore's formula)."""
    return len(subject) + headers_size + data_len + STORE_OVERHEAD
