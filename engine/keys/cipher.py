"""Sealed values: the one layout of encrypted message content, in the write-ahead log and the tables.

```
byte 0      layout version (1: AES-256-GCM, 12-byte IV, 16-byte tag)
bytes 1-4   key id (u32, big-endian): which data key of the stream's keyring
bytes 5-16  IV (the nonce, see nonces.py)      ┐
bytes 17-   ciphertext                         │ Spark's `aes_decrypt(…, 'GCM')` layout
last 16     GCM tag                            ┘
```
The first five bytes are the key reference: SQL joins a stream's rows to its keys on
`substring(value, 1, 5)` and decrypts `substring(value, 6)` with Spark's built-in
`aes_decrypt(…, key, 'GCM', 'DEFAULT', aad)` (Spark 3.5+ takes the associated data, 4.2 included).
An erased value (its key destroyed) has no key to join: SQL reads NULL, the engine `KeyDestroyedError`.

The associated data binds a value to where it belongs, so bytes moved to another stream, message,
field or subject fail authentication:
    "<stream id>:<seq>:<field>:<subject>"   (field data | headers | subject; the subject field
                                              itself is bound with an empty subject)
Values are always AES-256-GCM, whatever the master key's `cipher`: SQL must read them and Spark
decrypts no other authenticated cipher; `cipher` chooses how the keyring wraps the data keys.

Sealing a batch joins every value into one buffer that becomes an Arrow binary array (the log record
and the flushed column at once); per value there is one `encrypt` call, driven by `map`.
Counterpart: the encrypted message blocks of server/filestore.go (`genEncryptionKeys`, `encryptMsgBlock`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from engine.errors import JetStreamError
from engine.keys import crypto
from engine.keys.errors import ValueAuthenticationError
from engine.keys.keyfile import is_stream_id
from engine.keys.nonces import NONCE_SIZE

VERSION = 1
HEADER_SIZE = 5  # version, key id
TAG_SIZE = 16
PREFIX_SIZE = HEADER_SIZE + NONCE_SIZE
OVERHEAD = PREFIX_SIZE + TAG_SIZE
DATA_KEY_SIZE = 32  # AES-256
FIELDS = ("data", "headers", "subject")
MAX_KEY_ID = (1 << 32) - 1

Payloads = Sequence[bytes | bytearray | memoryview | None] | pa.BinaryArray


def key_ref(key_id: int) -> bytes:
    """The five bytes that start every value sealed with key `key_id`."""
    return bytes([VERSION]) + key_id.to_bytes(4, "big")


class DataKey:
    """One data key (AES-256-GCM) and its id in the stream's keyring."""

    __slots__ = ("key_id", "ref", "aead")

    def __init__(self, key_id: int, key: bytes) -> None:
        if len(key) != DATA_KEY_SIZE or not 0 <= key_id <= MAX_KEY_ID:
            raise ValueError("a data key is 32 bytes with an id below 2^32")
        self.key_id = key_id
        self.ref = key_ref(key_id)
        self.aead = crypto.AESGCM(key)


def associated_data(stream_id: str, seq: int, field: str, subject: str = "") -> bytes:
    """What a value is bound to; `subject` is empty for the subject field itself."""
    return f"{stream_id}:{seq}:{field}:{subject}".encode()


def associated_data_batch(stream_id: str, seqs: Sequence[int], field: str,
                          subjects: Sequence[str] | None = None) -> list[bytes]:
    head = f"{stream_id}:".encode()
    tail = f":{field}:".encode()
    if subjects is None:
        return [b"%b%d%b" % (head, seq, tail) for seq in seqs]
    tails = {subject: tail + subject.encode() for subject in set(subjects)}  # a batch's subjects repeat
    return [b"%b%d%b" % (head, seq, tails[subject]) for seq, subject in zip(seqs, subjects)]


def seal(key: DataKey, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """One value (the single-message path)."""
    return key.ref + nonce + key.aead.encrypt(nonce, plaintext, aad)


def seal_batch(keys: DataKey | Sequence[DataKey], nonces: np.ndarray, payloads: Payloads,
               aads: Sequence[bytes]) -> pa.BinaryArray:
    """Seals many values into one Arrow binary array; a None payload stays null.

    The prefixes and nonces are cut from two joined buffers by list comprehensions and the values are
    encrypted by `map` over the key's bound `encrypt` (no Python frame per value); the array's data is
    one join of prefixes and ciphertexts (numpy per-row scatters, `encrypt_into` slices and a Python
    loop body per value all cost more than the encryption of a small value).

    Args:
        keys: one key for the whole batch, or one per payload.
        nonces: (n, 12) bytes from a `NonceSource`.
        payloads: the plaintexts.
        aads: the associated data of each value.
    """
    n = len(payloads)
    values, valid, lengths = _plaintexts(payloads)
    sizes = lengths + OVERHEAD * valid
    if int(sizes.sum()) >= 1 << 31:
        raise ValueError("a sealed batch must stay under 2 GiB")
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    prefixes = np.empty((n, PREFIX_SIZE), np.uint8)
    if isinstance(keys, DataKey):
        prefixes[:, :HEADER_SIZE] = np.frombuffer(keys.ref, np.uint8)
    else:
        prefixes[:, :HEADER_SIZE] = np.frombuffer(b"".join([k.ref for k in keys]), np.uint8).reshape(n, HEADER_SIZE)
    prefixes[:, HEADER_SIZE:] = nonces[:n]
    packed, nonce_bytes = prefixes.tobytes(), nonces[:n].tobytes()
    rows: Sequence[int] = range(n) if valid is True else np.flatnonzero(valid).tolist()
    if valid is not True:
        values, aads = [values[i] for i in rows], [aads[i] for i in rows]
    ivs = [nonce_bytes[i * NONCE_SIZE : (i + 1) * NONCE_SIZE] for i in rows]
    if isinstance(keys, DataKey):
        sealed = map(keys.aead.encrypt, ivs, values, aads)
    else:
        sealed = map(_encrypt, [keys[i] for i in rows], ivs, values, aads)
    parts: list[bytes] = [b""] * (2 * len(rows))
    parts[::2] = [packed[i * PREFIX_SIZE : (i + 1) * PREFIX_SIZE] for i in rows]
    parts[1::2] = sealed
    validity = None if valid is True else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(parts))])


def _encrypt(key: DataKey, iv: bytes, value: Any, aad: bytes) -> bytes:
    return key.aead.encrypt(iv, value, aad)


@dataclass
class OpenedBatch:
    """Plaintexts by row; a row that could not be opened is None with its error in `errors`."""

    values: list[bytes | None]
    errors: dict[int, JetStreamError] = field(default_factory=dict)


def open_batch(values: Payloads, aads: Sequence[bytes], key_for: Callable[[int], DataKey]) -> OpenedBatch:
    """Opens many values; a failure is reported for its row and the others are still opened.

    `key_for(key_id)` returns the key or raises the `JetStreamError` the row gets (a destroyed key:
    `KeyDestroyedError`); it is asked once per key id of the batch.
    """
    views, valid, lengths = _views(values)
    opened = OpenedBatch([None] * len(views))
    keys: dict[bytes, DataKey | JetStreamError] = {}
    for i in np.flatnonzero(valid & (lengths >= OVERHEAD)).tolist():
        view = views[i]
        ref = view[:HEADER_SIZE].tobytes()
        key = keys.get(ref)
        if key is None:
            key = keys[ref] = _lookup(key_for, ref)
        if isinstance(key, JetStreamError):
            opened.errors[i] = key
            continue
        try:
            opened.values[i] = key.aead.decrypt(view[HEADER_SIZE:PREFIX_SIZE], view[PREFIX_SIZE:], aads[i])
        except crypto.InvalidTag:
            opened.errors[i] = ValueAuthenticationError()
    for i in np.flatnonzero(valid & (lengths < OVERHEAD)).tolist():
        opened.errors[i] = ValueAuthenticationError("not an encrypted value of a known layout")
    return opened


def open_value(value: memoryview | bytes, aad: bytes, keys: dict[bytes, DataKey | JetStreamError],
               key_for: Callable[[int], DataKey]) -> bytes:
    """Opens one value (a read of one message), as `open_batch` opens each of its rows.

    `keys` caches `key_for`'s answer per key reference across the calls of one reader.

    Raises:
        JetStreamError: what `key_for` raised for the value's key (a destroyed key: `KeyDestroyedError`).
        ValueAuthenticationError: the value is not of a known layout or fails authentication.
    """
    if len(value) < OVERHEAD:
        raise ValueAuthenticationError("not an encrypted value of a known layout")
    ref = bytes(value[:HEADER_SIZE])
    key = keys.get(ref)
    if key is None:
        key = keys[ref] = _lookup(key_for, ref)
    if isinstance(key, JetStreamError):
        raise key
    try:
        return key.aead.decrypt(value[HEADER_SIZE:PREFIX_SIZE], value[PREFIX_SIZE:], aad)
    except crypto.InvalidTag:
        raise ValueAuthenticationError() from None


def sql_key_ref(value_sql: str) -> str:
    """The SQL expression of a value's key reference, to join with the keys' `key_ref` column."""
    return f"substring({value_sql}, 1, {HEADER_SIZE})"


def sql_decrypt(value_sql: str, key_sql: str, stream_id: str, field: str, *, seq_sql: str = "seq",
                subject_sql: str | None = None, strict: bool = False) -> str:
    """The Spark SQL expression that decrypts a sealed column for a key holder.

    `try_aes_decrypt` (the default) gives NULL for an erased or unauthentic value; `strict` uses
    `aes_decrypt`, which fails the query instead. `subject_sql` is the plain subject (a column, or the
    decrypted subject of a protected stream); None for the subject field itself.
    """
    if not is_stream_id(stream_id) or field not in FIELDS:
        raise ValueError("stream ids are [A-Za-z0-9_-] and fields data, headers or subject")
    function = "aes_decrypt" if strict else "try_aes_decrypt"
    subject = subject_sql or "''"
    aad = f"concat('{stream_id}:', CAST({seq_sql} AS STRING), ':{field}:', {subject})"
    return f"{function}(substring({value_sql}, {HEADER_SIZE + 1}), {key_sql}, 'GCM', 'DEFAULT', {aad})"


def sql_encrypt(plain_sql: str, key_sql: str, ref_sql: str, stream_id: str, field: str, *, seq_sql: str = "seq",
                subject_sql: str | None = None) -> str:
    """The Spark SQL expression that seals a value in this layout (for re-encryption by a job): the key
    reference, then Spark's `aes_encrypt(..., 'GCM')` with a random IV (Spark's; safe below 2^32 values
    per key, far above what one rotation rewrites) and the same associated data as `sql_decrypt`."""
    if not is_stream_id(stream_id) or field not in FIELDS:
        raise ValueError("stream ids are [A-Za-z0-9_-] and fields data, headers or subject")
    subject = subject_sql or "''"
    aad = f"concat('{stream_id}:', CAST({seq_sql} AS STRING), ':{field}:', {subject})"
    return f"concat({ref_sql}, aes_encrypt({plain_sql}, {key_sql}, 'GCM', 'DEFAULT', '', {aad}))"


def _lookup(key_for: Callable[[int], DataKey], ref: bytes) -> DataKey | JetStreamError:
    if ref[0] != VERSION:
        return ValueAuthenticationError("not an encrypted value of a known layout")
    try:
        return key_for(int.from_bytes(ref[1:], "big"))
    except JetStreamError as error:
        return error


def _plaintexts(values: Payloads) -> tuple[Sequence[Any], np.ndarray | bool, np.ndarray]:
    """The values as `encrypt` takes them, which rows are not null (True: all), and their lengths."""
    if isinstance(values, pa.Array):
        views, valid, lengths = _views(values)
        return views, True if valid.all() else valid, lengths
    try:
        return values, True, np.fromiter(map(len, values), np.int64, len(values))
    except TypeError:  # a None among them
        pass
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    return values, valid, np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))


def _views(values: Payloads) -> tuple[list[memoryview], np.ndarray, np.ndarray]:
    """Zero-copy views of each value, which rows are not null, and their lengths."""
    if isinstance(values, pa.Array):
        n = len(values)
        _, offsets_buffer, data_buffer = values.buffers()
        offsets = np.frombuffer(offsets_buffer, np.int32)[values.offset : values.offset + n + 1]
        data = memoryview(data_buffer).cast("B") if data_buffer is not None else memoryview(b"")  # Arrow says "b"
        valid = values.is_valid().to_numpy(zero_copy_only=False) if values.null_count else np.ones(n, bool)
        bounds = offsets.tolist()
        return [data[a:b] for a, b in zip(bounds, bounds[1:])], valid, np.diff(offsets).astype(np.int64)
    valid = np.fromiter((v is not None for v in values), bool, len(values))
    views = [memoryview(b"" if v is None else v) for v in values]
    return views, valid, np.fromiter((v.nbytes for v in views), np.int64, len(views))
