"""An S3-compatible store's endpoint and credentials, and how each client of the warehouse spells them.

Below both the S3 backend (engine/store/objectstore/s3.py, which connects with them) and the
warehouse's location (location.py, which parses `s3://` and picks the backend): the backend needs
the settings, not the factory that chose it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_REGION = "us-east-1"
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class S3Settings:
    """Endpoint and credentials of an S3-compatible store, as the AWS variables give them."""

    endpoint: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    region: str = DEFAULT_REGION
    allow_http: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Settings:
        env = os.environ if env is None else env
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        return cls(
            endpoint=endpoint.rstrip("/") if endpoint else None,
            access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
            session_token=env.get("AWS_SESSION_TOKEN") or None,
            region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
            allow_http=(env.get("AWS_ALLOW_HTTP") or "").lower() in _TRUE,
        )

    def storage_options(self) -> dict[str, str]:
        """delta-rs's `storage_options`: commits by conditional PUT (`If-None-Match`), path-style."""
        options = {"AWS_REGION": self.region, "aws_conditional_put": "etag"}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
        if self.access_key_id:
            options["AWS_ACCESS_KEY_ID"] = self.access_key_id
        if self.secret_access_key:
            options["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.session_token:
            options["AWS_SESSION_TOKEN"] = self.session_token
        if self.allow_http:
            options["AWS_ALLOW_HTTP"] = "true"
        return options

    def arrow_filesystem(self) -> Any:
        """pyarrow's `S3FileSystem` on this store (reads of Parquet footers and row groups)."""
        from pyarrow import fs

        options: dict[str, Any] = {"region": self.region, "allow_bucket_creation": True}
        if self.endpoint:
            scheme, _, host = self.endpoint.partition("://")
            options.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
        if self.access_key_id and self.secret_access_key:
            options.update(access_key=self.access_key_id, secret_key=self.secret_access_key,
                           session_token=self.session_token)
        return fs.S3FileSystem(**options)

    def spark_conf(self) -> dict[str, str]:
        """Spark session settings that route `s3a://` to this store through Hadoop's S3A."""
        prefix = "spark.hadoop.fs.s3a."
        conf = {
            f"{prefix}impl": "org.apache.hadoop.fs.s3a.S3AFileSystem",
            f"{prefix}endpoint.region": self.region,
            f"{prefix}path.style.access": "true",
        }
        if self.endpoint:
            conf[f"{prefix}endpoint"] = self.endpoint
            conf[f"{prefix}connection.ssl.enabled"] = "false" if self.endpoint.startswith("http://") else "true"
        if self.access_key_id and self.secret_access_key:
            conf[f"{prefix}access.key"] = self.access_key_id
            conf[f"{prefix}secret.key"] = self.secret_access_key
            if self.session_token:
                conf[f"{prefix}session.token"] = self.session_token
                conf[f"{prefix}aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        return conf
