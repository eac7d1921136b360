"""Watching a subject filter of a stream: initial messages, then every later one, in sequence order.

What JetStream builds with an ordered consumer for the KV and object-store watchers: the initial set
is the last message per subject (`last_per_subject`), all of them (`all`) or none (`new`), taken at
one instant under the stream's lock; `updates` then answers the messages published after that
instant. A message that a limit, rollup or purge removed before it was read is not answered.
"""

from __future__ import annotations

from typing import Literal

from engine import errors
from engine.store.base import StoredMessage
from engine.stream import Stream
from engine.subjects import is_valid_subject, subject_matches

Initial = Literal["last_per_subject", "all", "new"]


class SubjectWatch:
    def __init__(self, stream: Stream, filter_: str, initial: Initial = "last_per_subject") -> None:
        if not is_valid_subject(filter_):
            raise errors.bad_request(f"invalid subject filter {filter_[:64]!r}")
        self.stream = stream
        self.filter = filter_
        self.mode = initial
        self.after = 0

    @property
    def closed(self) -> bool:
        return self.stream.deleted

    @property
    def behind(self) -> bool:
        """Whether messages arrived since the last `updates`: checked before waiting for a wake-up,
        so a publish whose wake-up came while `updates` ran is not left for the next heartbeat."""
        return self.stream.index.last_seq > self.after

    def initial(self) -> list[StoredMessage]:
        with self.stream.lock:
            self.after = self.stream.index.last_seq
            if self.mode == "new":
                return []
            seqs = self.stream.live_seqs(self.filter) if self.mode == "all" else self.stream.last_seqs(self.filter)
        return self.stream.load_many(seqs)

    def updates(self, limit: int = 1000) -> list[StoredMessage]:
        """Matching messages published since the previous call, at most `limit` sequences further."""
        index = self.stream.index
        with self.stream.lock:
            if self.stream.deleted or index.last_seq <= self.after:
                return []
            seqs = index.live_seqs(start=self.after + 1)[:limit]
            wanted = [int(s) for s in seqs if subject_matches(self.filter, index.subject_of(int(s)))]
            self.after = int(seqs[-1]) if len(seqs) == limit else index.last_seq
        return self.stream.load_many(wanted)
