"""The object-store interface on S3 or any S3-compatible server (versitygw in the tests).

The client is obstore: Python bindings to the Rust `object_store` crate, the one delta-rs commits
with, so the warehouse's shared state and its Delta tables use one HTTP stack, one reading of the
AWS variables and one meaning of a conditional PUT: `create` sends `If-None-Match: *`, `replace`
sends `If-Match: <etag>`, and the server refuses the loser with 412 (or 409 while another
conditional write of the key is in flight). A `replace` whose object is gone is refused too.
The bucket is created when missing, through pyarrow's S3 file system (object_store has no bucket
API; pyarrow is already a dependency).
Counterpart: delta-rs's `S3ObjectStoreFactory` with `aws_conditional_put=etag`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
from obstore.store import S3Store

from engine.store.objectstore.base import (
    DEFAULT_CHUNK_SIZE,
    ObjectExistsError,
    ObjectMeta,
    ObjectNotFoundError,
    ObjectStore,
    ObjectStoreError,
    PreconditionFailedError,
    StoredObject,
    check_key,
    check_prefix,
)
from engine.store.objectstore.s3_settings import S3Settings

CLIENT_OPTIONS = {"connect_timeout": "5s", "timeout": "30s"}


class S3ObjectStore(ObjectStore):
    def __init__(self, bucket: str, prefix: str, settings: S3Settings, create_bucket: bool = True) -> None:
        self.bucket = bucket
        self.prefix = check_prefix(prefix)
        self.settings = settings
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        if create_bucket:
            ensure_bucket(bucket, settings)
        config: dict[str, Any] = {"region": settings.region, "conditional_put": "etag"}
        for name in ("endpoint", "access_key_id", "secret_access_key", "session_token"):
            if value := getattr(settings, name):
                config[name] = value
        client_options: dict[str, Any] = {**CLIENT_OPTIONS, "allow_http": settings.allow_http}
        self._store = S3Store(bucket, prefix=self.prefix or None, config=config, client_options=client_options)

    def get(self, key: str) -> StoredObject:
        with _translated(key):
            result = obstore.get(self._store, check_key(key))
            return StoredObject(bytes(result.bytes()), _meta(result.meta))

    def head(self, key: str) -> ObjectMeta:
        with _translated(key):
            return _meta(obstore.head(self._store, check_key(key)))

    def put(self, key: str, data: bytes | Iterable[bytes]) -> ObjectMeta:
        key = check_key(key)
        with _translated(key):
            if isinstance(data, bytes | bytearray | memoryview):
                result = obstore.put(self._store, key, data, use_multipart=False)
                return self._written(key, len(data), result["e_tag"])
            obstore.put(self._store, key, iter(data), use_multipart=True)
        return self.head(key)

    def create(self, key: str, data: bytes) -> ObjectMeta:
        key = check_key(key)
        with _translated(key, lost=ObjectExistsError):
            result = obstore.put(self._store, key, data, mode="create")
        return self._written(key, len(data), result["e_tag"])

    def replace(self, key: str, data: bytes, version: str) -> ObjectMeta:
        key = check_key(key)
        with _translated(key, lost=PreconditionFailedError, missing=PreconditionFailedError):
            result = obstore.put(self._store, key, data, mode={"e_tag": version})
        return self._written(key, len(data), result["e_tag"])

    def delete(self, key: str) -> None:
        try:
            with _translated(key):
                obstore.delete(self._store, check_key(key))
        except ObjectNotFoundError:
            pass

    def list(self, prefix: str = "") -> Iterator[ObjectMeta]:
        prefix = check_prefix(prefix)
        with _translated(prefix):
            for batch in obstore.list(self._store, prefix=prefix or None):
                for meta in batch:
                    yield _meta(meta)

    def get_range(self, key: str, start: int, end: int) -> bytes:
        if start < 0 or end < start:
            raise ValueError(f"invalid range [{start}, {end})")
        size = self.head(key).size
        if start >= min(end, size):
            return b""
        with _translated(key):
            return bytes(obstore.get_range(self._store, check_key(key), start=start, end=min(end, size)))

    def get_stream(self, key: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Iterator[bytes]:
        with _translated(key):
            result = obstore.get(self._store, check_key(key))
        return _chunks(key, result.stream(min_chunk_size=chunk_size))

    def _written(self, key: str, size: int, etag: str | None) -> ObjectMeta:
        """Metadata of a write just made; a server that returns no ETag costs a HEAD."""
        if etag is None:
            return self.head(key)
        return ObjectMeta(key=key, size=size, version=etag, last_modified_ns=0)


def _chunks(key: str, stream: Iterable[Any]) -> Iterator[bytes]:
    with _translated(key):
        for chunk in stream:
            yield bytes(chunk)


@contextmanager
def _translated(
    key: str,
    lost: type[ObjectStoreError] = ObjectStoreError,
    missing: type[ObjectStoreError] = ObjectNotFoundError,
) -> Iterator[None]:
    """obstore's errors as the interface's: a lost condition, a missing object, any other failure."""
    try:
        yield
    except (AlreadyExistsError, PreconditionError) as exc:
        raise lost(f"{key}: {type(exc).__name__}") from None
    except FileNotFoundError:
        raise missing(key) from None
    except (BaseError, OSError) as exc:
        raise ObjectStoreError(f"{key}: {exc}") from exc


def ensure_bucket(bucket: str, settings: S3Settings) -> None:
    """Creates the bucket if it is missing; a concurrent creator is no error."""
    from pyarrow import fs

    s3 = settings.arrow_filesystem()
    if s3.get_file_info(bucket).type == fs.FileType.NotFound:
        try:
            s3.create_dir(bucket)
        except OSError:
            if s3.get_file_info(bucket).type == fs.FileType.NotFound:
                raise


def _meta(meta: Any) -> ObjectMeta:
    modified = meta.get("last_modified")
    return ObjectMeta(
        key=meta["path"],
        size=int(meta["size"]),
        version=meta.get("e_tag") or meta.get("version") or "",
        last_modified_ns=int(modified.timestamp() * 1e9) if modified else 0,
    )
