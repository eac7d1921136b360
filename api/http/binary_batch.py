"""The binary batch body of `POST /v1/publish` (`Content-Type: application/x-jetlake-batch`).

JSON batches cost the gateway a parse of the whole body and a base64 decode of every payload; this
format carries payloads as they are, so a batch becomes messages with one slice per field:

    body   = "JLB1" record*
    record = subject_len:u32 headers_len:u32 data_len:u32 subject headers data   (big-endian lengths)

`subject` is UTF-8; `headers` is empty (no headers) or the JSON map of lists of the JSON batch
(`{"Name": ["v"]}`); `data` is the raw payload. A body that cannot be split into records (wrong
magic, a record cut short, a length past the end, a subject that is not UTF-8) is refused whole with
a 400 before anything is published: no later record could be trusted. Everything a JSON batch
reports per message (a subject no stream captures or that NATS forbids, bad headers, limits) is
reported per message here too, so one batch means the same in either format.

A body without headers in any record (the common case) is decoded by `decode_plain` into columns
instead: the payloads are gathered into one Arrow binary array (vectorised when every record has the
same layout, as a producer's batch usually has) and the engine stores that array as it is.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from engine import InboundMessage, JetStreamError, PlainBatch, errors

MEDIA_TYPE = "application/x-jetlake-batch"
MAGIC = b"JLB1"
_RECORD = struct.Struct(">III")

HeaderCheck = Callable[[Any], "dict[str, list[str]] | None"]


def encode(messages: list[tuple[str, bytes, dict[str, list[str]] | None]]) -> bytes:
    """A binary batch body of (subject, data, headers) messages: for clients, tests and the benchmark."""
    parts = [MAGIC]
    for subject, data, headers in messages:
        s = subject.encode()
        h = orjson.dumps(headers) if headers else b""
        parts += (_RECORD.pack(len(s), len(h), len(data)), s, h, data)
    return b"".join(parts)


def decode(body: bytes, check_headers: HeaderCheck) -> list[InboundMessage | JetStreamError]:
    """The messages of a body in order, or per record the error its headers earn.

    `check_headers` validates a record's parsed headers as the JSON batch validates `headers`.

    Raises:
        JetStreamError: 400, err_code 10003, when the body is not a sequence of whole records.
    """
    if body[:4] != MAGIC:
        raise errors.bad_request(f"a binary batch body starts with {MAGIC.decode()!r}")
    subjects: list[str] = []
    data: list[bytes] = []
    headers: dict[int, bytes] = {}
    _split_records(body, subjects, data, headers)
    if not headers:
        return list(map(InboundMessage, subjects, data))
    return [
        _with_headers(subject, payload, headers[i], check_headers) if i in headers else InboundMessage(subject, payload)
        for i, (subject, payload) in enumerate(zip(subjects, data))
    ]


def decode_plain(body: bytes) -> PlainBatch | None:
    """The records as columns when none carries headers; None otherwise (or for an empty or foreign body),
    and then `decode` answers it.

    Raises:
        JetStreamError: 400, err_code 10003, when the body is not a sequence of whole records.
    """
    if body[:4] != MAGIC or len(body) < len(MAGIC) + _RECORD.size:
        return None
    uniform = _uniform(body)
    if uniform is None:
        uniform = _same_layout(body)
    return uniform if uniform is not None else _plain_records(body)


def _uniform(body: bytes) -> PlainBatch | None:
    """Every record with the same subject and payload length: checked and gathered with numpy, no loop."""
    ls, lh, ld = _RECORD.unpack_from(body, len(MAGIC))
    head = _RECORD.size + ls
    stride = head + ld
    count, rest = divmod(len(body) - len(MAGIC), stride)
    if lh or rest:
        return None
    records = np.frombuffer(body, np.uint8, offset=len(MAGIC)).reshape(count, stride)
    if not (records[:, :head] == records[0, :head]).all():
        return None
    subject = _subject(body[len(MAGIC) + _RECORD.size : len(MAGIC) + head], 0)
    data = pa.allocate_buffer(count * ld)
    np.frombuffer(data, np.uint8).reshape(count, ld)[:] = records[:, head:]
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(ld)  # ld may be 0
    return PlainBatch([subject] * count, pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), data]))


def _same_layout(body: bytes) -> PlainBatch | None:
    """Every record with the same lengths but its own subject (a batch of new keys of one width):
    subjects and payloads are cut out with numpy, the subjects checked as UTF-8 by Arrow at once.
    None when the layouts differ or a subject is not UTF-8 (`_plain_records` then reports which)."""
    ls, lh, ld = _RECORD.unpack_from(body, len(MAGIC))
    head = _RECORD.size + ls
    stride = head + ld
    count, rest = divmod(len(body) - len(MAGIC), stride)
    if lh or rest or not ls:
        return None
    records = np.frombuffer(body, np.uint8, offset=len(MAGIC)).reshape(count, stride)
    if not (records[:, : _RECORD.size] == records[0, : _RECORD.size]).all():
        return None
    names = pa.py_buffer(np.ascontiguousarray(records[:, _RECORD.size : head]).tobytes())
    column = pa.Array.from_buffers(pa.string(), count, [None, pa.py_buffer(np.arange(count + 1, dtype=np.int32) * np.int32(ls)), names])
    try:
        column.validate(full=True)
    except pa.ArrowInvalid:
        return None
    data = pa.allocate_buffer(count * ld)
    np.frombuffer(data, np.uint8).reshape(count, ld)[:] = records[:, head:]
    offsets = np.arange(count + 1, dtype=np.int32) * np.int32(ld)  # ld may be 0
    payloads = pa.Array.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), data])
    return PlainBatch(column.to_pylist(), payloads, column)


def _plain_records(body: bytes) -> PlainBatch | None:
    """Records of varied layouts: a loop over the lengths alone, then one join of the payloads."""
    end = len(body)
    offset = len(MAGIC)
    unpack = _RECORD.unpack_from
    head = _RECORD.size
    view = memoryview(body)
    subjects: list[str] = []
    payloads: list[memoryview] = []
    last_raw, last_subject = b"", ""
    while offset < end:
        if offset + head > end:
            raise _truncated(len(subjects), offset)
        ls, lh, ld = unpack(body, offset)
        if lh:
            return None
        start = offset + head
        offset = start + ls + ld
        if offset > end:
            raise _truncated(len(subjects), start - head)
        raw = body[start : start + ls]
        if raw != last_raw or not subjects:
            last_raw, last_subject = raw, _subject(raw, len(subjects))
        subjects.append(last_subject)
        payloads.append(view[offset - ld : offset])
    lengths = np.fromiter(map(len, payloads), np.int64, len(payloads))
    offsets = np.zeros(len(payloads) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = pa.py_buffer(b"".join(payloads))
    return PlainBatch(subjects, pa.Array.from_buffers(pa.binary(), len(subjects), [None, pa.py_buffer(offsets), data]))


def _split_records(body: bytes, subjects: list[str], data: list[bytes], headers: dict[int, bytes]) -> None:
    """Fills the columns of the records; the hot loop of a binary publish, so kept to slices and appends."""
    end = len(body)
    offset = len(MAGIC)
    unpack = _RECORD.unpack_from
    head = _RECORD.size
    add_subject, add_data = subjects.append, data.append
    last_raw, last_subject = b"", ""
    while offset < end:
        if offset + head > end:
            raise _truncated(len(subjects), offset)
        ls, lh, ld = unpack(body, offset)
        start = offset + head
        offset = start + ls + lh + ld
        if offset > end:
            raise _truncated(len(subjects), start - head)
        raw = body[start : start + ls]
        if raw != last_raw or not subjects:
            last_raw, last_subject = raw, _subject(raw, len(subjects))
        if lh:
            headers[len(subjects)] = body[start + ls : start + ls + lh]
        add_subject(last_subject)
        add_data(body[offset - ld : offset])


def _with_headers(subject: str, data: bytes, raw: bytes, check: HeaderCheck) -> InboundMessage | JetStreamError:
    try:
        return InboundMessage(subject, data, check(orjson.loads(raw)))
    except orjson.JSONDecodeError as exc:
        return errors.invalid_json(f"headers: {exc}")
    except JetStreamError as exc:
        return exc


def _subject(raw: bytes, index: int) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise errors.bad_request(f"binary batch record {index}: the subject is not UTF-8") from None


def _truncated(index: int, offset: int) -> JetStreamError:
    return errors.bad_request(f"binary batch record {index} at byte {offset} is cut short or its lengths run past the body")
