"""The storage interface of the warehouse's shared state: what every backend promises.

Leases, the owner record, configs, tombstones, erasure receipts and (later) the object-store log
are small objects that several gateways and the Spark jobs read and write. They all go through one
`ObjectStore`, whose only coordination primitives are the two conditional writes S3 offers and
delta-rs commits with: create-if-absent (`If-None-Match: *`) and compare-and-swap on the object's
version (`If-Match: <etag>`). A backend that cannot give both atomically is not a backend.

Keys are `/`-separated relative paths (`default/_system/leases/ORDERS.json`); a version is an opaque
string (S3's ETag, a local file's identity) that changes whenever the object is written.
Counterpart: none in nats-server (its state sits on one server's disk); this mirrors the
`object_store` crate's `PutMode` (Create, Update) that delta-rs builds its commits on.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

DEFAULT_CHUNK_SIZE = 1 << 20

_SEGMENT = re.compile(r"[^/\x00]+")
TEMP_PREFIX = ".jl-tmp-"


class ObjectStoreError(Exception):
    """A storage failure (I/O, network, refused credentials): the write may or may not have happened."""


class ObjectNotFoundError(ObjectStoreError):
    """No object under the key."""


class ObjectExistsError(ObjectStoreError):
    """`create` lost: an object already exists under the key."""


class PreconditionFailedError(ObjectStoreError):
    """`replace` lost: the object changed (or vanished) since the version the caller read."""


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    key: str
    size: int
    version: str
    last_modified_ns: int


@dataclass(frozen=True, slots=True)
class StoredObject:
    """An object's bytes and the metadata of exactly those bytes (one read, never two)."""

    data: bytes
    meta: ObjectMeta

    @property
    def version(self) -> str:
        return self.meta.version


def check_key(key: str) -> str:
    """Refuses keys that would escape the warehouse or mean different things on S3 and on disk."""
    segments = key.split("/")
    if not key or any(not _SEGMENT.fullmatch(s) or s in (".", "..") or s.startswith(TEMP_PREFIX) for s in segments):
        raise ValueError(f"invalid object key {key!r}: '/'-separated non-empty names, no '.', '..' or {TEMP_PREFIX!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix names a folder (or the whole store when empty); a trailing `/` is allowed."""
    prefix = prefix.rstrip("/")
    return check_key(prefix) if prefix else ""


class ObjectStore(ABC):
    """One warehouse's objects. Every method is safe to call from several threads at once.

    Semantics every backend gives (the contract suite in tests/engine/test_objectstore.py runs on each):
    - `put` replaces a whole object atomically: a reader sees the old bytes or the new, never a mix.
    - `create` succeeds for exactly one of any number of concurrent callers on one key.
    - `replace` succeeds only if the object's version is still the one given; of concurrent callers
      holding the same version, exactly one succeeds.
    - A call that returned has made its write durable (local: fsync of the file and its folder).
    - Versions are opaque; equal bytes written twice may or may not get equal versions (S3's ETag is
      the content's MD5), so a record that must change its version on each write carries a counter.
    """

    uri: str

    @abstractmethod
    def get(self, key: str) -> StoredObject:
        """The object's bytes and metadata. Raises ObjectNotFoundError."""

    @abstractmethod
    def head(self, key: str) -> ObjectMeta:
        """The object's metadata. Raises ObjectNotFoundError."""

    @abstractmethod
    def put(self, key: str, data: bytes | Iterable[bytes]) -> ObjectMeta:
        """Writes the whole object, replacing any; chunks are streamed (large objects)."""

    @abstractmethod
    def create(self, key: str, data: bytes) -> ObjectMeta:
        """Writes the object only if the key is free. Raises ObjectExistsError."""

    @abstractmethod
    def replace(self, key: str, data: bytes, version: str) -> ObjectMeta:
        """Writes the object only if its version is `version`. Raises PreconditionFailedError."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Removes the object; a missing one is no error (S3's DELETE is idempotent too)."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        """Every object under the folder `prefix` (recursively), in key order."""

    @abstractmethod
    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes `[start, end)` of the object (fewer at its end). Raises ObjectNotFoundError."""

    @abstractmethod
    def get_stream(self, key: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        """The object's bytes in chunks, for objects too large to hold. Raises ObjectNotFoundError
        before the first chunk when the object is missing."""

    def delete_prefix(self, prefix: str) -> int:
        """Removes every object under the folder `prefix` (a table, a stream's configs); returns how many."""
        prefix = check_prefix(prefix)
        if not prefix:
            raise ValueError("refusing to delete the whole warehouse")
        keys = [meta.key for meta in self.list(prefix)]
        for key in keys:
            self.delete(key)
        return len(keys)

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Releases what the backend holds (connections); the store is unusable afterwards."""
