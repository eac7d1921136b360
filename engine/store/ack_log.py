"""The ack log's records: one group commit of consumer events, packed for the write-ahead log.

A pull of 500 messages logs 500 deliveries before it is answered, so the record is built for the
request path: a small JSON description of its blocks (names, kinds, snapshot fields) and the numbers
as raw int64 columns, no Arrow on the way in. The flusher turns records into the ack table's Arrow
rows (`engine.store.acks._batch`), and recovery reads them back as the same blocks. Records of the
older Arrow IPC kind are still read.

    payload = first_event_seq:i64 rows:i64 meta_len:u32 meta column*      (little-endian)
    meta    = JSON [[stream, consumer, consumer_id, n, kind | [kind, ...], [delivered, floor, state] | null], ...]
    column  = rows int64 values: stream_seq, consumer_seq, count, ts (ns), delay, in that order
"""

from __future__ import annotations

import struct

import numpy as np
import orjson

from engine.ack_events import AckEvents

KIND_ARROW_EVENTS = 1
KIND_PACKED_EVENTS = 2
_HEAD = struct.Struct("<qqI")
_COLUMNS = ("stream_seq", "consumer_seq", "count", "ts", "delay")


def encode(blocks: list[tuple[str, str, str, AckEvents, list[object] | None]], first_event_seq: int) -> bytes:
    """A record of `(stream, consumer, consumer_id, events, snapshot fields or None)` blocks."""
    meta: list[list[object]] = []
    for stream, consumer, consumer_id, events, extra in blocks:
        kinds: object = events.kind[0] if events.kind.count(events.kind[0]) == len(events) else events.kind
        meta.append([stream, consumer, consumer_id, len(events), kinds, extra])
    merged = AckEvents.concat([b[3] for b in blocks])
    head = orjson.dumps(meta)
    columns = np.concatenate([getattr(merged, c) for c in _COLUMNS]).astype("<i8", copy=False)
    return _HEAD.pack(first_event_seq, len(merged), len(head)) + head + columns.tobytes()


def decode(payload: bytes) -> tuple[int, list[tuple[str, str, str, AckEvents, list[object] | None]]]:
    """(first event sequence, blocks) of a packed record."""
    first, rows, meta_len = _HEAD.unpack_from(payload, 0)
    at = _HEAD.size
    meta = orjson.loads(payload[at : at + meta_len])
    numbers = np.frombuffer(payload, "<i8", count=5 * rows, offset=at + meta_len).astype(np.int64).reshape(5, rows)
    blocks = []
    offset = 0
    for stream, consumer, consumer_id, n, kinds, extra in meta:
        cut = slice(offset, offset + n)
        events = AckEvents([kinds] * n if isinstance(kinds, str) else kinds, *(numbers[i, cut].copy() for i in range(5)))
        blocks.append((stream, consumer, consumer_id, events, extra))
        offset += n
    return first, blocks
