"""A decoded row group of an encrypted stream, opened one message at a time as reads ask for it.

Reads by sequence (a consumer's pull, a KV get, a direct get) decode whole row groups and keep them
(table_reads.py's `Window`, in the byte-bounded row-group cache); opening every value of a group up
front cost more than the reads that use it. A `SealedWindow` keeps the sealed `subject` (protected),
`data` and `headers` values as the Parquet file gave them and opens a message's values when it is
read: a point read (a KV get after a restart) converts and opens its one row, a consumer's window
lists the sealed values once (slices of their buffers) and opens the rows a pull delivers. A value
that does not open (its key destroyed, or bytes that fail authentication) raises its error for that
message only. Keys are looked up once per key reference of the window; a crypto-shredding or an
erasure drops every window (TableReads.forget), so a destroyed key is never used from here.
Counterpart: the per-message decryption of server/filestore.go's cache loads (`msgFromBuf` after `loadMsgsWithLock`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from engine import headers as hdr
from engine.errors import JetStreamError
from engine.keys import StreamKeys, crypto
from engine.keys.cipher import HEADER_SIZE, PREFIX_SIZE, DataKey, open_value
from engine.store.stored_message import StoredMessage
from engine.store.table_reads import Window

SUBJECT, DATA, HEADERS = "subject", "data", "headers"


class SealedValues:
    """One sealed binary column as zero-copy slices of its buffer, cut when a value is read."""

    __slots__ = ("_buffer", "_bounds", "_valid")

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        n = len(array)
        _, offsets, data = array.buffers()
        width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        bounds = np.frombuffer(offsets, width)[array.offset : array.offset + n + 1] if n else np.zeros(1, width)
        self._bounds: list[int] = bounds.tolist()
        self._buffer = memoryview(data).cast("B") if data is not None else memoryview(b"")
        self._valid: list[bool] | None = array.is_valid().to_pylist() if array.null_count else None

    def __getitem__(self, i: int) -> memoryview | None:
        if self._valid is not None and not self._valid[i]:
            return None
        return self._buffer[self._bounds[i] : self._bounds[i + 1]]


class SealedWindow(Window):
    """Messages of one decoded row group by sequence; `get` opens the one asked for."""

    def __init__(self, keys: StreamKeys, table: pa.Table) -> None:
        super().__init__(table)
        self._keys = keys
        self._refs: dict[bytes, DataKey | JetStreamError] = {}  # key reference -> key, or the error its values get
        self._last: DataKey | None = None  # the key of the last value opened
        self._protected = pa.types.is_binary(table.schema.field(SUBJECT).type)  # sealed subjects
        self._aad_head = f"{keys.stream_id}:".encode()

    def _columns(self) -> tuple[Any, ...]:
        subject = self.table.column(SUBJECT)
        subjects = SealedValues(subject) if self._protected else subject.to_pylist()
        return subjects, SealedValues(self.table.column(DATA)), SealedValues(self.table.column(HEADERS))

    def _message(self, row: int, seq: int) -> StoredMessage:
        """The message at `row`, opened.

        Raises:
            KeyDestroyedError: its key was destroyed (the message is erased).
            ValueAuthenticationError: one of its values fails authentication.
        """
        if self._lists is not None:
            subjects, data_, headers_ = self._lists
            subject, data, headers = subjects[row], data_[row], headers_[row]
        else:
            columns = self.table.columns
            names = self.table.column_names
            subject, data, headers = (columns[names.index(name)][row].as_py() for name in (SUBJECT, DATA, HEADERS))
        head = b"%b%d:" % (self._aad_head, seq)
        if self._protected:
            subject = self._open(subject, head + b"subject:").decode()
        encoded = subject.encode()
        data = b"" if data is None else self._open(data, b"%bdata:%b" % (head, encoded))
        if headers is not None:
            headers = orjson.loads(self._open(headers, b"%bheaders:%b" % (head, encoded))) or None
        ts = int(self._ts[row]) * 1000
        return StoredMessage(subject, seq, ts, data, headers, hdr.first(headers, hdr.MSG_ID))

    def _messages(self, rows: np.ndarray, seqs: list[int]) -> list[StoredMessage]:
        return [self._message(row, seq) for row, seq in zip(rows.tolist(), seqs)]

    def _open(self, sealed: memoryview | bytes, aad: bytes) -> bytes:
        """Opens one value; a window's values mostly share one key, so the last key found is tried
        first (anything else, a failure included, goes through `open_value` for its answer)."""
        key = self._last
        if key is not None and sealed[:HEADER_SIZE] == key.ref:
            try:
                return key.aead.decrypt(sealed[HEADER_SIZE:PREFIX_SIZE], sealed[PREFIX_SIZE:], aad)
            except crypto.InvalidTag:
                pass
        opened = open_value(sealed, aad, self._refs, self._keys.key)
        found = self._refs.get(bytes(sealed[:HEADER_SIZE]))
        self._last = found if isinstance(found, DataKey) else None
        return opened
