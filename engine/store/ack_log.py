"""The ack log's records: one group commit of consumer events, packed for the write-ahead log.

A pull of 500 messages logs 500 deliveries before it is answered, so the record is built for the
request path: a small JSON description of its blocks (names, kinds, snapshot fields) and the numbers
as raw int64 columns, no Arrow on the way in. A block's numbers other than its stream sequences are
mostly runs (a pull's consumer sequences count up by one, its delivery count, time and delay are one
value; so are an ack request's), and a run is written as its first value and step instead of a column:
a pull's record is a fifth of the bytes it would be. The flusher turns records into the ack table's
Arrow rows (`engine.store.acks._batch`), and recovery reads them back as the same blocks. Records of the
older kinds (Arrow IPC; every column written out) are still read.

    payload = first_event_seq:i64 rows:i64 meta_len:u32 meta stream_seq column*   (little-endian)
    meta    = JSON [[stream, consumer, consumer_id, n, kind | [kind, ...], [delivered, floor, state] | null,
                     [run | null] * 4], ...]
    run     = [first, step]: the column of a block is first + step * i (i = 0 .. n-1)
    column  = int64 values: the stream sequences of every row, then, block by block, the columns
              consumer_seq, count, ts (ns), delay that are not runs, in that order
Kind 2 (`KIND_PACKED_EVENTS`) has no runs: meta entries end at the snapshot fields and its columns are
every row's stream_seq, consumer_seq, count, ts, delay, one whole column after the other.
"""

from __future__ import annotations

import struct

import numpy as np
import orjson

from engine.ack_events import AckEvents

KIND_ARROW_EVENTS = 1
KIND_PACKED_EVENTS = 2
KIND_RUN_EVENTS = 3
_HEAD = struct.Struct("<qqI")
_RUN_COLUMNS = ("consumer_seq", "count", "ts", "delay")

Block = tuple[str, str, str, AckEvents, list[object] | None]


def encode(blocks: list[Block], first_event_seq: int) -> bytes:
    """A `KIND_RUN_EVENTS` record of `(stream, consumer, consumer_id, events, snapshot fields or None)` blocks."""
    meta: list[list[object]] = []
    written: list[np.ndarray] = []
    for stream, consumer, consumer_id, events, extra in blocks:
        kind = events.kind
        kinds: object = kind[0] if kind and kind.count(kind[0]) == len(kind) else kind
        runs = []
        for name in _RUN_COLUMNS:
            column = getattr(events, name)
            run = _run(column)
            runs.append(run)
            if run is None:
                written.append(column)
        meta.append([stream, consumer, consumer_id, len(events), kinds, extra, runs])
    head = orjson.dumps(meta)
    rows = sum(len(b[3]) for b in blocks)
    columns = np.concatenate([b[3].stream_seq for b in blocks] + written).astype("<i8", copy=False)
    return _HEAD.pack(first_event_seq, rows, len(head)) + head + columns.tobytes()


def _run(column: np.ndarray) -> list[int] | None:
    """[first, step] when the column is first + step * i, else None."""
    n = len(column)
    if n == 0:
        return [0, 0]
    first = int(column[0])
    if n == 1:
        return [first, 0]
    step = int(column[1]) - first
    if not (np.diff(column) == step).all():
        return None
    return [first, step]


def decode(payload: bytes | memoryview, kind: int = KIND_RUN_EVENTS) -> tuple[int, list[Block]]:
    """(first event sequence, blocks) of a packed record of `kind` (KIND_RUN_EVENTS or KIND_PACKED_EVENTS)."""
    first, rows, meta_len = _HEAD.unpack_from(payload, 0)
    at = _HEAD.size
    meta = orjson.loads(bytes(payload[at : at + meta_len]))
    values = np.frombuffer(payload, "<i8", offset=at + meta_len).astype(np.int64)
    blocks: list[Block] = []
    offset = 0
    rest = rows  # kind 3: where the next block's written columns start, after every row's stream sequence
    for stream, consumer, consumer_id, n, kinds, extra, *runs in meta:
        stream_seqs = values[offset : offset + n].copy()
        if kind == KIND_PACKED_EVENTS:
            others = [values[i * rows + offset : i * rows + offset + n].copy() for i in range(1, 5)]
        else:
            others = []
            for run in runs[0]:
                if run is None:
                    others.append(values[rest : rest + n].copy())
                    rest += n
                else:
                    others.append(run[0] + run[1] * np.arange(n, dtype=np.int64))
        events = AckEvents([kinds] * n if isinstance(kinds, str) else kinds, stream_seqs, *others)
        blocks.append((stream, consumer, consumer_id, events, extra))
        offset += n
    return first, blocks
