"""engine/pacing.py with an explicit clock: replay gaps and the rate limit's token bucket."""

from __future__ import annotations

from engine.pacing import NS, Pacer


def test_replay_original_waits_the_stored_gaps() -> None:
    pacer = Pacer(replay_original=True)
    waits = []
    for stored in (0, 5 * NS, 5 * NS + 500_000, 7 * NS):
        waits.append(pacer.delay_ns(stored, 10, now=0))
        pacer.delivered(stored, 10, at=0)
    assert waits == [0, 5 * NS, 0, 2 * NS - 500_000]  # the first at once; under a millisecond is not waited


def test_rate_limit_lets_a_burst_through_then_holds_to_the_rate() -> None:
    pacer = Pacer(rate_limit_bps=8000, burst=1000)  # 1000 bytes a second
    now, waits = 0, []
    for _ in range(4):
        wait = pacer.delay_ns(0, 600, now)
        now += wait
        pacer.delivered(0, 600, now)
        waits.append(wait)
    assert waits[0] == 0
    assert abs(waits[1] - NS * 200 // 1000) <= 1  # 400 bytes left of the burst: 200 more to wait for
    assert all(abs(w - NS * 600 // 1000) <= 1 for w in waits[2:])  # then 600 bytes at 1000 B/s


def test_a_message_larger_than_the_burst_still_goes() -> None:
    pacer = Pacer(rate_limit_bps=8000, burst=100)
    first = pacer.delay_ns(0, 5000, 0)
    pacer.delivered(0, 5000, first)
    second = pacer.delay_ns(0, 5000, first)
    assert first == 0 and abs(second - 5 * NS) <= 1
