"""The keyring's files: the one reader and writer of their formats, and writes that leave no old copy.

```
<warehouse>/<account>/_system/keys/keyring.json     the account's header (JSON)
<warehouse>/<account>/_system/keys/<stream id>.keys  one stream's keys (records)
<warehouse>/<account>/_system/keys/.lock             taken (flock; a lease object on S3) by every change
```
On an s3:// warehouse these are objects of the warehouse's store (storage.py); what follows on
fsyncs, renames and zeroing is the local folder's.
The header holds the KDF salt, the cipher that wraps the data keys, a check value (a constant sealed
with the key-encryption key: the wrong master key fails it before anything is written), the number of
nonce writers handed out, and a MAC over all of it.

A stream's file is `JLK1` and then records, each `u32 length ‖ u8 kind ‖ body ‖ MAC`, the MAC being
the first 16 bytes of HMAC-SHA256(account MAC key, stream id ‖ kind ‖ body):
- EPOCH: u32, the epoch new writes use (the last one counts);
- KEY: u32 key id, u32 epoch, u8 purpose (1 data, 2 subject hash), 16-byte prefix tag, i64 created
  (ns), then the key wrapped by the KEK (nonce ‖ ciphertext ‖ tag), its associated data binding it
  to the account, stream, key id, epoch, purpose and prefix tag;
- DESTROYED: (u32 key id, i64 destroyed at) pairs: keys that existed and are gone for good.
New keys are appended (one fsync per batch of new keys); anything that removes a key rewrites the
whole file. A record cut short at the end is a torn append (never used: a key is used only once its
append is durable) and is dropped; a record whose MAC fails is damage or tampering, and refused.

Rewrites go to `<name>.tmp`, are fsynced, renamed over the file, the folder fsynced, and then the
replaced file's bytes are overwritten with zeros in place (through a descriptor opened before the
rename) and fsynced. A `.tmp` only ever holds a newer state, and stale ones are zeroed and removed.
That is what software can do: on copy-on-write file systems, snapshots or backups older blocks may
survive; they hold only wrapped keys, useless without the master key.
"""

from __future__ import annotations

import base64
import fcntl
import hmac
import json
import os
import re
import struct
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from engine.keys.errors import KeyringCorruptError

HEADER_NAME = "keyring.json"
STREAM_SUFFIX = ".keys"
TMP_SUFFIX = ".tmp"
NEW_SUFFIX = ".new"
LOCK_NAME = ".lock"
FORMAT = "jetlake-keyring"
FORMAT_VERSION = 1
KDF = "HKDF-SHA256"
CIPHERS = ("aes", "chachapoly")

MAGIC = b"JLK1"
EPOCH, KEY, DESTROYED = 1, 2, 3
DATA, SUBJECT_HASH = 1, 2
MAC_SIZE = 16
TAG_SIZE = 16
_RECORD = struct.Struct(">IB")
_EPOCH = struct.Struct(">I")
_KEY = struct.Struct(">IIB16sq")
_DESTROYED = struct.Struct(">Iq")
_KEY_AAD = struct.Struct(">IIB")
_STREAM_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def is_stream_id(text: str) -> bool:
    """Stream ids name files and appear in SQL text: letters, digits, `_` and `-` only."""
    return _STREAM_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class Header:
    """The account's keyring header, as stored (binary fields base64 in the file)."""

    account: str
    cipher: str
    salt: bytes
    check: bytes
    writers: int
    created_ns: int

    def fields(self) -> dict[str, object]:
        return {
            "format": FORMAT, "version": FORMAT_VERSION, "account": self.account, "cipher": self.cipher,
            "kdf": KDF, "salt": _b64(self.salt), "check": _b64(self.check), "writers": self.writers,
            "created_ns": self.created_ns,
        }


@dataclass(frozen=True)
class KeyRecord:
    key_id: int
    epoch: int
    purpose: int
    tag: bytes
    created_ns: int
    wrapped: bytes


@dataclass
class StreamFile:
    """What a stream's key file says, and the byte length of its valid records."""

    epoch: int = 0
    keys: dict[int, KeyRecord] = field(default_factory=dict)
    destroyed: dict[int, int] = field(default_factory=dict)
    size: int = len(MAGIC)


def key_aad(account: str, stream_id: str, record: KeyRecord) -> bytes:
    """What a wrapped data key is bound to: it unwraps nowhere else."""
    ids = _KEY_AAD.pack(record.key_id, record.epoch, record.purpose)
    return b"jetlake-key\x00" + account.encode() + b"\x00" + stream_id.encode() + b"\x00" + ids + record.tag


def header_mac(mac_key: bytes, header: Header) -> bytes:
    return hmac.digest(mac_key, json.dumps(header.fields(), sort_keys=True).encode(), "sha256")


def encode_header(header: Header, mac_key: bytes) -> bytes:
    """The header file's bytes, with its MAC."""
    fields = {**header.fields(), "mac": _b64(header_mac(mac_key, header))}
    return json.dumps(fields, indent=1, sort_keys=True).encode() + b"\n"


def decode_header(path: Path) -> tuple[Header, bytes]:
    """The header file's header and its stored MAC; raises KeyringCorruptError when it does not parse."""
    return parse_header(path.read_bytes(), str(path))


def parse_header(data: bytes, where: str) -> tuple[Header, bytes]:
    """The header and its stored MAC from the file's bytes (`where` names it in errors)."""
    path = where
    try:
        raw = json.loads(data)
        if raw["format"] != FORMAT or raw["version"] != FORMAT_VERSION or raw["kdf"] != KDF:
            raise ValueError(f"format {raw['format']} {raw['version']} ({raw['kdf']}) is not this version's")
        if raw["cipher"] not in CIPHERS:
            raise ValueError(f"unknown cipher {raw['cipher']!r}")
        header = Header(str(raw["account"]), str(raw["cipher"]), _unb64(raw["salt"]), _unb64(raw["check"]),
                        int(raw["writers"]), int(raw["created_ns"]))
        return header, _unb64(raw["mac"])
    except (ValueError, KeyError, TypeError) as error:
        raise KeyringCorruptError(f"keyring header {path} is damaged: {error}") from None


def encode_records(mac_key: bytes, stream_id: str, records: Iterable[tuple[int, bytes]]) -> bytes:
    out = bytearray()
    for kind, body in records:
        out += _RECORD.pack(len(body), kind) + body + _mac(mac_key, stream_id, kind, body)
    return bytes(out)


def epoch_record(epoch: int) -> tuple[int, bytes]:
    return EPOCH, _EPOCH.pack(epoch)


def key_record(record: KeyRecord) -> tuple[int, bytes]:
    return KEY, _KEY.pack(record.key_id, record.epoch, record.purpose, record.tag, record.created_ns) + record.wrapped


def destroyed_record(destroyed: dict[int, int]) -> tuple[int, bytes]:
    return DESTROYED, b"".join(_DESTROYED.pack(key_id, at) for key_id, at in sorted(destroyed.items()))


def encode_stream_file(mac_key: bytes, stream_id: str, state: StreamFile) -> bytes:
    """A whole stream file: the epoch, the destroyed ids, the live keys."""
    records = [epoch_record(state.epoch), destroyed_record(state.destroyed)]
    records += [key_record(r) for _, r in sorted(state.keys.items())]
    return MAGIC + encode_records(mac_key, stream_id, records)


def read_stream_file(path: Path, mac_key: bytes, stream_id: str, start: StreamFile | None = None) -> StreamFile:
    """Reads a stream's key file (from `start.size` on, to pick up what another process appended)."""
    return parse_stream_file(path.read_bytes(), str(path), mac_key, stream_id, start)


def parse_stream_file(data: bytes, path: str, mac_key: bytes, stream_id: str,
                      start: StreamFile | None = None) -> StreamFile:
    """A stream's key file from its bytes (`path` names it in errors), its records from `start.size` on."""
    state = start or StreamFile()
    if data[: len(MAGIC)] != MAGIC:
        raise KeyringCorruptError(f"{path} is not a keyring file")
    offset = state.size
    while offset + _RECORD.size <= len(data):
        length, kind = _RECORD.unpack_from(data, offset)
        end = offset + _RECORD.size + length + MAC_SIZE
        if end > len(data):
            break  # a torn append
        body = data[offset + _RECORD.size : end - MAC_SIZE]
        if not hmac.compare_digest(data[end - MAC_SIZE : end], _mac(mac_key, stream_id, kind, body)):
            raise KeyringCorruptError(
                f"{path} is damaged or was tampered with: the record at byte {offset} fails authentication")
        _apply(state, kind, body, path, offset)
        offset = end
    state.size = offset
    return state


def append_durably(path: Path, valid_size: int, data: bytes) -> int:
    """Appends records after the valid ones (cutting a torn tail) and fsyncs; returns the new size."""
    with open(path, "r+b") as f:
        f.truncate(valid_size)
        f.seek(valid_size)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return valid_size + len(data)


def replace_durably(path: Path, data: bytes) -> None:
    """Replaces a file whole and zeroes the bytes of the file it replaced (see the module docstring)."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    scrub(tmp)
    try:
        _write_new(tmp, data)
    except BaseException:
        scrub(tmp)
        raise
    old = _open_existing(path)
    try:
        os.replace(tmp, path)
        fsync_folder(path.parent)
        if old is not None:
            _zero(old)
    finally:
        if old is not None:
            os.close(old)


def scrub(path: Path) -> None:
    """Overwrites a file with zeros, fsyncs, and removes it (nothing when it does not exist)."""
    fd = _open_existing(path)
    if fd is None:
        return
    try:
        _zero(fd)
    finally:
        os.close(fd)
    path.unlink()
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """The keyring's lock across processes (the gateway, jobs, `jetlake sql`)."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def file_identity(path: Path) -> tuple[int, int]:
    """(inode, size): changes when another process appended to or rewrote the file."""
    st = os.stat(path)
    return st.st_ino, st.st_size


def _apply(state: StreamFile, kind: int, body: bytes, path: str, offset: int) -> None:
    if kind == EPOCH and len(body) == _EPOCH.size:
        state.epoch = _EPOCH.unpack(body)[0]
    elif kind == KEY and len(body) > _KEY.size:
        key_id, epoch, purpose, tag, created = _KEY.unpack_from(body)
        state.keys[key_id] = KeyRecord(key_id, epoch, purpose, tag, created, body[_KEY.size :])
    elif kind == DESTROYED and len(body) % _DESTROYED.size == 0:
        for key_id, at in _DESTROYED.iter_unpack(body):
            state.destroyed[key_id] = at
            state.keys.pop(key_id, None)
    else:
        raise KeyringCorruptError(f"{path}: unknown record kind {kind} at byte {offset}")


def _mac(mac_key: bytes, stream_id: str, kind: int, body: bytes) -> bytes:
    return hmac.digest(mac_key, stream_id.encode() + bytes([kind]) + body, "sha256")[:MAC_SIZE]


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_existing(path: Path) -> int | None:
    try:
        return os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None


def _zero(fd: int) -> None:
    size = os.fstat(fd).st_size
    chunk = b"\x00" * min(size, 1 << 20)
    written = 0
    while written < size:
        written += os.pwrite(fd, chunk[: size - written], written)
    os.fsync(fd)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: object) -> bytes:
    if not isinstance(text, str):
        raise ValueError("a binary field is not base64 text")
    return base64.b64decode(text, validate=True)
