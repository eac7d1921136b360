"""Work-queue and interest retention: which messages leave a stream as its consumers acknowledge them.

On work-queue streams an acknowledged message leaves the stream at once; on interest streams a message
leaves once no consumer that matches it still needs it. Those removals are tombstones, like purges.
The caller holds the stream's lock. Counterpart: the retention parts of server/stream.go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.consumer import Consumer
    from engine.stream import Stream


def retain(stream: Stream, consumer: Consumer) -> None:
    """Work queue: acknowledged messages leave. Interest: once nobody matching needs them."""
    ledger = consumer.ledger
    acked, ledger.acked = ledger.acked, []
    if not acked or stream.config.retention == "limits":
        return
    seqs = np.array(sorted(set(acked)), np.int64)
    seqs = seqs[stream.index.live_mask(seqs)]
    if stream.config.retention == "interest":
        seqs = seqs[~needed(stream, seqs)]
    stream.remove_seqs(seqs, stream.config.retention)


def needed(stream: Stream, seqs: np.ndarray) -> np.ndarray:
    """Which of `seqs` (live) a consumer of the stream still needs."""
    subjects = [stream.index.subject_of(int(s)) for s in seqs]
    wanted = np.zeros(len(seqs), np.bool_)
    for consumer in stream.consumers.values():
        match = np.fromiter((consumer.matches(s) for s in subjects), np.bool_, len(subjects))
        wanted |= consumer.state.needs(seqs, match)
    return wanted


def sweep(stream: Stream) -> None:
    """Interest streams: drop every message no remaining consumer needs (after a delete or restart)."""
    if stream.config.retention == "workqueue":
        seqs = stream.index.live_seqs()
        acked = [int(s) for s in seqs if any(c.matches(stream.index.subject_of(int(s))) and c.state.acknowledged(int(s))
                                             for c in stream.consumers.values())]
        stream.remove_seqs(np.array(acked, np.int64), "workqueue")
    elif stream.config.retention == "interest":
        seqs = stream.index.live_seqs()
        stream.remove_seqs(seqs[~needed(stream, seqs)], "interest")


def interested(stream: Stream, subject: str) -> bool:
    return any(c.matches(subject) for c in stream.consumers.values())
