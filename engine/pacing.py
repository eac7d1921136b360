"""How fast a push consumer may deliver: `replay_policy: original` and `rate_limit_bps`.

With `replay_policy: original` the gap between two deliveries is the gap between the two messages'
stored timestamps (the first goes at once; gaps under a millisecond are not waited for), so a
consumer replays a stream at the pace it was written. With `rate_limit_bps` deliveries are held
to that many bits per second by a token bucket whose depth is one message of the largest size
allowed (nats-server's `rate.Limiter` with the stream's max message size, else max_payload, as the
burst), counting what nats-server counts: subject, reply, headers and data. The pacer only says how
long to wait; a front door waits it and delivers. Deterministic: time comes in as arguments.
Counterpart: server/consumer.go (`loopAndGatherMsgs`'s replay delay, `o.rlimit`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

NS = 1_000_000_000
MIN_REPLAY_DELAY = 1_000_000  # ns: nats-server does not sleep for gaps under a millisecond


@dataclass
class Pacer:
    """The delivery pace of one push consumer (see the module docstring)."""

    replay_original: bool = False
    rate_limit_bps: int = 0
    burst: int = 0  # bytes the bucket holds; at least one message of any size is let through
    _last_ts: int | None = field(default=None, repr=False)
    _tokens: float = field(default=0.0, repr=False)
    _refilled_at: int | None = field(default=None, repr=False)

    @property
    def active(self) -> bool:
        return self.replay_original or self.rate_limit_bps > 0

    def delay_ns(self, stored_ts: int, size: int, now: int) -> int:
        """Nanoseconds to wait, from `now`, before delivering a message stored at `stored_ts` of `size` bytes."""
        wait = 0
        if self.replay_original and self._last_ts is not None:
            gap = stored_ts - self._last_ts
            if gap > MIN_REPLAY_DELAY:
                wait = gap
        if self.rate_limit_bps > 0:
            wait = max(wait, self._rate_wait(size, now))
        return wait

    def delivered(self, stored_ts: int, size: int, at: int) -> None:
        """Records a delivery made at `at` (after its wait)."""
        self._last_ts = stored_ts
        if self.rate_limit_bps > 0:
            self._refill(at, max(self.burst, size))
            self._tokens -= size

    def _rate_wait(self, size: int, now: int) -> int:
        self._refill(now, max(self.burst, size))
        need = size - self._tokens
        if need <= 0:
            return 0
        return int(need * 8 * NS / self.rate_limit_bps) + 1

    def _refill(self, now: int, depth: int) -> None:
        if self._refilled_at is None:
            self._tokens, self._refilled_at = depth, now
            return
        elapsed = max(now - self._refilled_at, 0)
        self._tokens = min(depth, self._tokens + elapsed * self.rate_limit_bps / 8 / NS)
        self._refilled_at = now
