"""The binary answer of `POST .../next` (`Accept: application/x-jetlake-batch`).

A JSON answer costs the gateway a dict, an RFC 3339 time and a base64 payload per message, and the
client a parse of it all; this one carries each message as a fixed header and its bytes as they are:

    body   = "JLD1" record*
    record = seq:u64 consumer_seq:u64 num_delivered:u32 num_pending:u64 time_ns:i64
             subject_len:u32 headers_len:u32 data_len:u32 ack_len:u32
             subject headers data ack                                   (all big-endian)

`time_ns` is the stored time in nanoseconds since the epoch; `headers` is empty (no headers) or the
JSON map of lists of the JSON answer; `ack` is the ack token (ASCII). Records are in delivery order;
`JLD1` alone is an empty answer. Fields mean what the JSON DeliveredMessage's fields mean.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import orjson

from engine.consumer import Delivery

MEDIA_TYPE = "application/x-jetlake-batch"
MAGIC = b"JLD1"
_RECORD = struct.Struct(">QQIQqIIII")


def wants_binary(accept: str) -> bool:
    """Whether an Accept header asks for this format (a plain media-type match, parameters ignored)."""
    return MEDIA_TYPE in accept.lower()


def encode(deliveries: list[Delivery], headers_only: bool) -> bytes:
    """The answer body; one struct pack and four slices a message, joined once."""
    pack = _RECORD.pack
    parts: list[bytes] = [MAGIC]
    add = parts.extend
    for d in deliveries:
        msg = d.msg
        subject = msg.subject.encode()
        token = d.token.encode()
        if headers_only:
            headers = orjson.dumps({**(msg.headers or {}), "Nats-Msg-Size": [str(len(msg.data))]})
            data = b""
        else:
            headers = orjson.dumps(msg.headers) if msg.headers else b""
            data = msg.data
        add((
            pack(msg.seq, d.consumer_seq, d.num_delivered, d.num_pending, msg.ts,
                 len(subject), len(headers), len(data), len(token)),
            subject, headers, data, token,
        ))
    return b"".join(parts)


@dataclass(slots=True)
class DeliveredRecord:
    """One record of a binary answer, as a client reads it."""

    seq: int
    consumer_seq: int
    num_delivered: int
    num_pending: int
    time_ns: int
    subject: str
    headers: dict[str, list[str]] | None
    data: bytes
    ack: str


def decode(body: bytes) -> list[DeliveredRecord]:
    """The records of an answer body (for clients, tests and the benchmark).

    Raises:
        ValueError: the body is not `JLD1` followed by whole records.
    """
    if body[:4] != MAGIC:
        raise ValueError(f"a delivered batch starts with {MAGIC.decode()!r}")
    out: list[DeliveredRecord] = []
    offset, end, head = 4, len(body), _RECORD.size
    while offset < end:
        if offset + head > end:
            raise ValueError(f"record {len(out)} is cut short")
        seq, cseq, count, pending, ts, ls, lh, ld, la = _RECORD.unpack_from(body, offset)
        at = offset + head
        offset = at + ls + lh + ld + la
        if offset > end:
            raise ValueError(f"record {len(out)} runs past the body")
        headers = body[at + ls : at + ls + lh]
        out.append(DeliveredRecord(
            seq, cseq, count, pending, ts, body[at : at + ls].decode(), orjson.loads(headers) if headers else None,
            body[at + ls + lh : at + ls + lh + ld], body[offset - la : offset].decode(),
        ))
    return out
