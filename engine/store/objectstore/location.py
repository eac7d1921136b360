"""Where a warehouse lives, and how each client addresses it: the one place that maps URIs.

A warehouse is a local folder (the embedded default) or `s3://bucket/prefix`. Three clients reach
the same bytes, each with its own spelling, and this module is the only one that knows them:
- the shared-state objects, through `ObjectStore` (obstore's S3 client, or the local folder);
- the Delta tables, through delta-rs: `s3://bucket/prefix/...` plus `storage_options`, with
  `aws_conditional_put=etag` so commits are conditional PUTs (no lock service);
- the Delta tables again, through Spark's S3A: `s3a://bucket/prefix/...` plus `spark.hadoop.fs.s3a.*`.
Endpoint and credentials come from the usual AWS variables (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`, `AWS_ALLOW_HTTP`), read once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from engine.store.objectstore.base import ObjectStore, check_prefix
from engine.store.objectstore.s3_settings import S3Settings

S3_SCHEME = "s3"
SPARK_S3_SCHEME = "s3a"

# S3's bucket naming rules (3-63 characters, lowercase letters, digits, dots and hyphens).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


@dataclass(frozen=True)
class WarehouseLocation:
    """A parsed `--warehouse`: a local folder, or a bucket and a prefix on S3."""

    root: Path | None = None
    bucket: str | None = None
    prefix: str = ""
    s3: S3Settings | None = None

    @classmethod
    def parse(cls, warehouse: str | Path, env: Mapping[str, str] | None = None) -> WarehouseLocation:
        """Raises ValueError for an unsupported scheme or an invalid bucket name."""
        text = str(warehouse)
        scheme = urlsplit(text).scheme.lower() if "://" in text else ""
        if not scheme or scheme == "file":
            path = urlsplit(text).path if scheme else text
            return cls(root=Path(path).resolve())
        if scheme not in (S3_SCHEME, SPARK_S3_SCHEME):
            raise ValueError(f"unsupported warehouse {text!r}: a local path or s3://bucket/prefix")
        parts = urlsplit(text)
        bucket = parts.netloc
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ValueError(f"invalid bucket name {bucket!r} in {text!r}: S3 wants 3-63 lowercase letters, "
                             "digits, dots or hyphens")
        return cls(bucket=bucket, prefix=check_prefix(parts.path.strip("/")), s3=S3Settings.from_env(env))

    @property
    def is_s3(self) -> bool:
        return self.bucket is not None

    def uri(self, key: str = "") -> str:
        """The delta-rs (and pyarrow) URI of a key under the warehouse: a local path or `s3://…`."""
        if self.root is not None:
            return str(self.root / key) if key else str(self.root)
        return f"{S3_SCHEME}://{self.bucket}/{_join(self.prefix, key)}".rstrip("/")

    def spark_uri(self, key: str = "") -> str:
        """Spark's path for the same key: `s3a://…` for S3, the local path otherwise."""
        return to_spark_uri(self.uri(key))

    def storage_options(self) -> dict[str, str] | None:
        """delta-rs's `storage_options` for tables in this warehouse (None on local disk)."""
        return self.s3.storage_options() if self.s3 is not None else None

    def open(self, create_bucket: bool = True) -> ObjectStore:
        """The warehouse's object store; on S3 the bucket is created if it is missing."""
        if self.root is not None:
            from engine.store.objectstore.local import LocalObjectStore

            return LocalObjectStore(self.root)
        from engine.store.objectstore.s3 import S3ObjectStore

        assert self.bucket is not None and self.s3 is not None
        return S3ObjectStore(self.bucket, self.prefix, self.s3, create_bucket=create_bucket)


def to_spark_uri(uri: str) -> str:
    """`s3://b/k` -> `s3a://b/k` (Hadoop's S3A); anything else unchanged."""
    return SPARK_S3_SCHEME + uri[len(S3_SCHEME):] if uri.startswith(S3_SCHEME + "://") else uri


def to_delta_uri(uri: str) -> str:
    """`s3a://b/k` -> `s3://b/k` (delta-rs and obstore); anything else unchanged."""
    return S3_SCHEME + uri[len(SPARK_S3_SCHEME):] if uri.startswith(SPARK_S3_SCHEME + "://") else uri


def _join(prefix: str, key: str) -> str:
    return f"{prefix}/{key}" if prefix and key else prefix or key
