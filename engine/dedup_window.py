"""JetStream's duplicate window: the `Nats-Msg-Id`s published within `duplicate_window`, so that a
message published again is acknowledged as a duplicate and not stored twice. Counterpart:
server/stream.go's ddmap. The last message's id (`Nats-Expected-Last-Msg-Id`) stays the stream's
`last_msg_id`: every publish sets it, a lone one on the hot path too."""

from __future__ import annotations

from collections import deque


class DuplicateWindow:
    """The ids seen, oldest first for expiry. The stream's lock guards it."""

    def __init__(self) -> None:
        self.ids: dict[str, tuple[int, int]] = {}  # msg id -> (seq, ts)
        self._order: deque[tuple[int, str]] = deque()

    def clear(self) -> None:
        """Forgets every id: a reload rebuilds the window from the disk."""
        self.ids = {}
        self._order = deque()

    def remember(self, msg_id: str, seq: int, ts: int) -> None:
        self.ids[msg_id] = (seq, ts)
        self._order.append((ts, msg_id))

    def expire(self, now: int, window: int) -> None:
        """Drops the ids older than `window`; an id published again since keeps its newer entry."""
        cutoff = now - window
        order = self._order
        while order and order[0][0] < cutoff:
            ts, msg_id = order.popleft()
            seen = self.ids.get(msg_id)
            if seen is not None and seen[1] == ts:
                del self.ids[msg_id]

    def entries(self) -> list[tuple[str, int, int]]:
        """The window's (msg_id, seq, ts) in sequence order."""
        return sorted(((msg_id, seq, ts) for msg_id, (seq, ts) in self.ids.items()), key=lambda e: e[1])

    def forget(self, erased: set[int]) -> None:
        """GDPR erasure: the erased messages' ids leave the window, so a re-publish is a new message."""
        for msg_id in [m for m, (seq, _) in self.ids.items() if seq in erased]:
            del self.ids[msg_id]
