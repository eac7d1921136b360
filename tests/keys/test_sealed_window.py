"""A decoded row group of an encrypted stream (engine/store/sealed_window.py) opens each message as it is
read: rows under several keys (prefix keys, a rotation) in one window, a tampered value and a destroyed
key are each answered for their own message, read in order (a consumer's listed window) or by point."""

from __future__ import annotations

import pyarrow as pa
import pytest

from engine.keys import Keyring, KeyDestroyedError, ValueAuthenticationError
from engine.store.rows import Rows
from engine.store.sealed import DATA, Sealer

from .conftest import new_stream_id

N = 12
TAMPERED = 5  # a users.2 row's data: one byte flipped


def _rows(first: int, n: int) -> Rows:
    subjects = [f"users.{1 + i % 2}.orders" for i in range(first, first + n)]  # two prefix keys, alternating
    return Rows(first, subjects, [1_700_000_000_000_000_000 + i for i in range(first, first + n)], [None] * n,
                [{"X-Trace": [f"t{i}"]} if i % 3 else None for i in range(first, first + n)],
                [f"payload {i}".encode() for i in range(first, first + n)], [20] * n, ["users"] * n)


def _sealed_table(sealer: Sealer) -> pa.Table:
    """Rows 1..N, the second half sealed after a rotation (new keys), one data value tampered."""
    first = sealer.seal(_rows(1, N // 2))
    sealer.keys.rotate()
    second = sealer.seal(_rows(1 + N // 2, N // 2))
    table = pa.Table.from_batches([first, second])
    data = table.column(DATA).to_pylist()
    value = bytearray(data[TAMPERED - 1])
    value[-20] ^= 1
    data[TAMPERED - 1] = bytes(value)
    return table.set_column(table.column_names.index(DATA), DATA, pa.array(data, pa.binary()))


@pytest.mark.parametrize("listed", [True, False], ids=["listed", "point"])
def test_each_message_opens_or_fails_alone(ring: Keyring, listed: bool) -> None:
    sealer = Sealer(ring.stream(new_stream_id(), key_tokens=2))
    table = _sealed_table(sealer)

    window = sealer.window(table)
    if listed:
        window.list()
    for seq in range(1, N + 1):
        if seq == TAMPERED:
            with pytest.raises(ValueAuthenticationError):
                window.get(seq)
            continue
        message = window.get(seq)
        assert message is not None
        assert (message.subject, message.data) == (f"users.{1 + seq % 2}.orders", f"payload {seq}".encode())
        assert message.headers == ({"X-Trace": [f"t{seq}"]} if seq % 3 else None)

    sealer.keys.destroy_prefix("users.2")  # every epoch's key of the prefix: its messages are erased
    window = sealer.window(table)  # a shredding drops the decoded windows (TableReads.forget)
    if listed:
        window.list()
    for seq in range(1, N + 1):
        if seq % 2:  # users.2
            with pytest.raises(KeyDestroyedError):
                window.get(seq)
        else:
            message = window.get(seq)
            assert message is not None and message.data == f"payload {seq}".encode()
