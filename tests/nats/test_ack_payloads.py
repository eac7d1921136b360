"""-NAK's delay as nats-server reads it: `{"delay": ns}` or a Go duration; anything else is no delay."""

from __future__ import annotations

import pytest

from api.nats.acks import _nak_delay

S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "delay"),
    [
        (b"", 0),
        (b'{"delay": 2000000000}', 2 * S),
        (b'{"delay": -5}', 0),
        (b'{"delay": "1s"}', 0),
        (b"{bad", 0),
        (b"5s", 5 * S),
        (b"1m30s", 90 * S),
        (b"250ms", S // 4),
        (b"1.5s", 3 * S // 2),
        (b"5", 0),
        (b"soon", 0),
    ],
)
def test_nak_delay(text: bytes, delay: int) -> None:
    assert _nak_delay(text) == delay
