"""What KV buckets and object stores share: each is a named view over one stream `<prefix><bucket>`.

Creating a bucket creates its stream (idempotent for an identical config, as streams are); listing,
status and destroying go through the stream registry, so a bucket is exactly its stream and SQL
sees it like any other. Buckets reach the engine through `StreamHost`, the few calls they make of
it, so they sit below engine/jetstream.py without knowing it. Counterpart: the bucket handling of
nats.go kv.go and object.go.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from engine import errors
from engine.errors import ErrorCode, JetStreamError
from engine.messages import InboundMessage, PublishResult
from engine.stream import Stream

_BUCKET = re.compile(r"[a-zA-Z0-9_-]+")  # fullmatch: `$` would let a trailing newline through
MAX_BUCKET_LEN = 200


def check_bucket(bucket: str) -> None:
    """nats.go's bucket names: letters, digits, `-` and `_`."""
    if not _BUCKET.fullmatch(bucket) or len(bucket) > MAX_BUCKET_LEN:
        raise errors.bad_request(f"invalid bucket name {bucket[:64]!r}: letters, digits, '-' and '_' only")


def bucket_not_found() -> JetStreamError:
    return JetStreamError(404, ErrorCode.STREAM_NOT_FOUND, "bucket not found")


class HostOptions(Protocol):
    max_payload: int


class StreamHost(Protocol):
    """The engine calls buckets make (engine/jetstream.py's `JetStream` provides them)."""

    options: HostOptions

    def add_stream(self, body: dict[str, Any]) -> tuple[dict[str, Any], bool]: ...
    def update_stream(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def delete_stream(self, name: str) -> None: ...
    def stream(self, name: str) -> Stream: ...
    def streams(self) -> list[Stream]: ...
    def publish(self, messages: list[InboundMessage]) -> list[PublishResult]: ...
    def throttle(self, stream: Stream, timeout: float = 120.0) -> None: ...
    def flush_stream(self, stream: Stream) -> int: ...


class Buckets:
    """The buckets of one kind (streams named `prefix` + bucket) of an engine."""

    prefix = ""

    def __init__(self, js: StreamHost) -> None:
        self.js = js

    def stream_name(self, bucket: str) -> str:
        return self.prefix + bucket

    def stream(self, bucket: str) -> Stream:
        check_bucket(bucket)
        try:
            return self.js.stream(self.stream_name(bucket))
        except errors.StreamNotFoundError:
            raise bucket_not_found() from None

    def _create(self, bucket: str, stream_config: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Creates the bucket's stream; its status and whether it was created (False: identical exists)."""
        try:
            _, created = self.js.add_stream(stream_config)
        except JetStreamError as exc:
            if exc.err_code == ErrorCode.STREAM_NAME_EXIST:
                raise JetStreamError(400, ErrorCode.STREAM_NAME_EXIST, f"bucket {bucket} exists with a different configuration") from None
            raise
        return self.status(bucket), created

    def status(self, bucket: str) -> dict[str, Any]:
        raise NotImplementedError

    def names(self) -> list[str]:
        names = self.js.stream_names(limit=2**31)["streams"]
        return [name[len(self.prefix) :] for name in names if name.startswith(self.prefix)]

    def list(self) -> dict[str, Any]:
        buckets = []
        for name in self.names():
            try:
                buckets.append(self.status(name))
            except JetStreamError:
                continue  # destroyed meanwhile
        return {"total": len(buckets), "buckets": buckets}

    def destroy(self, bucket: str) -> None:
        self.stream(bucket)
        self.js.delete_stream(self.stream_name(bucket))
