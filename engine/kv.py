"""Key/value buckets: JetStream's KV (ADR-8) as a view over an ordinary stream `KV_<bucket>`.

A bucket is a stream capturing `$KV.<bucket>.>`, one subject per key, `max_msgs_per_subject` =
history, discard new, rollups allowed, deletes denied; a revision is the stream sequence. Puts,
deletes (`KV-Operation: DEL`) and purges (`KV-Operation: PURGE` with `Nats-Rollup: sub`) are plain
publishes, so conditions (`Nats-Expected-Last-Subject-Sequence`) are checked by the stream under its
lock and SQL sees the bucket like any stream. The table is partitioned by the first two subject
tokens (the bucket), not by key. A get is an index lookup of the key's last sequence and a load of
that one message. Counterpart: nats.go kv.go.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pybase64
from pydantic import Field

from engine import errors
from engine import headers as hdr
from engine.buckets import Buckets, check_bucket
from engine.config import PARTITION_TOKENS_KEY, NS_PER_S, Storage, _Model, parse_model
from engine.errors import ErrorCode, JetStreamError
from engine.info import rfc3339
from engine.store.base import StoredMessage
from engine.messages import InboundMessage, PublishResult
from engine.stream import Stream
from engine.subjects import is_valid_publish_subject, is_valid_subject
from engine.watch import Initial, SubjectWatch

STREAM_PREFIX = "KV_"
SUBJECT_PREFIX = "$KV."
OPERATION = "KV-Operation"
MARKER_REASON = "Nats-Marker-Reason"
PUT, DEL, PURGE = "PUT", "DEL", "PURGE"
MAX_HISTORY = 64
MAX_DUPLICATE_WINDOW = 120 * NS_PER_S
PARTITION_TOKENS = 2  # `$KV.<bucket>`: one partition per bucket, not one folder per key

_KEY = re.compile(r"[-/_=.a-zA-Z0-9]+")
_KEY_FILTER = re.compile(r"[-/_=.a-zA-Z0-9*]*>?")

Publisher = Callable[[InboundMessage], PublishResult]


class KeyValueConfig(_Model):
    """A bucket's configuration, under nats.go's JSON names (`KeyValueConfig`)."""

    bucket: str
    description: str | None = None
    max_value_size: int = Field(-1, ge=-(2**31), le=2**31 - 1)
    history: int = 1
    ttl: int = Field(0, description="nanoseconds; 0 keeps values forever")
    max_bytes: int = -1
    storage: Storage = "file"
    replicas: int = 1
    compression: bool = False
    metadata: dict[str, str] | None = None


@dataclass(slots=True)
class KvEntry:
    bucket: str
    key: str
    value: bytes
    revision: int
    created: int
    operation: str
    delta: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "bucket": self.bucket,
            "key": self.key,
            "value": pybase64.b64encode(self.value).decode(),
            "revision": self.revision,
            "created": rfc3339(self.created),
            "operation": self.operation,
        }
        if self.delta is not None:
            out["delta"] = self.delta
        return out


def stream_name(bucket: str) -> str:
    return STREAM_PREFIX + bucket


def check_key(key: str) -> None:
    """nats.go's key rules: `[-/_=.a-zA-Z0-9]+`, not starting or ending with `.`, no empty token."""
    if not _KEY.fullmatch(key) or key[0] == "." or key[-1] == "." or ".." in key:
        raise errors.bad_request(f"invalid key {key[:64]!r}")


def check_key_filter(filter_: str) -> None:
    if not filter_ or not _KEY_FILTER.fullmatch(filter_) or not is_valid_subject("$KV.b." + filter_):
        raise errors.bad_request(f"invalid key filter {filter_[:64]!r}")


def key_not_found() -> JetStreamError:
    return JetStreamError(404, ErrorCode.NO_MESSAGE_FOUND, "key not found")


def operation_of(msg: StoredMessage) -> str:
    """PUT, DEL or PURGE: the `KV-Operation` header, or a limit marker's reason as nats.go reads it."""
    op = hdr.first(msg.headers, OPERATION)
    if op in (DEL, PURGE):
        return op
    reason = hdr.first(msg.headers, MARKER_REASON)
    if reason in ("MaxAge", "Purge"):
        return PURGE
    if reason == "Remove":
        return DEL
    return PUT


def stream_config(config: KeyValueConfig) -> dict[str, Any]:
    """The backing stream's config, as nats.go's CreateKeyValue builds it."""
    window = MAX_DUPLICATE_WINDOW if not config.ttl or config.ttl > MAX_DUPLICATE_WINDOW else config.ttl
    body: dict[str, Any] = {
        "name": stream_name(config.bucket),
        "subjects": [f"{SUBJECT_PREFIX}{config.bucket}.>"],
        "max_msgs_per_subject": config.history,
        "max_bytes": config.max_bytes,
        "max_age": config.ttl,
        "max_msg_size": config.max_value_size,
        "storage": config.storage,
        "num_replicas": config.replicas,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "duplicate_window": window,
        "max_msgs": -1,
        "max_consumers": -1,
        "allow_direct": True,
        "discard": "new",
        "compression": "s2" if config.compression else "none",
        "metadata": {**(config.metadata or {}), PARTITION_TOKENS_KEY: str(PARTITION_TOKENS)},
    }
    if config.description is not None:
        body["description"] = config.description
    return body


def parse_config(body: Any) -> KeyValueConfig:
    config = parse_model(KeyValueConfig, body, "key/value configuration")
    check_bucket(config.bucket)
    if config.history == 0:
        config.history = 1
    if not 1 <= config.history <= MAX_HISTORY:
        raise errors.invalid_config(f"history must be from 1 to {MAX_HISTORY}")
    if config.ttl < 0:
        raise errors.invalid_config("ttl can not be negative")
    if config.max_value_size == 0:
        config.max_value_size = -1
    if config.max_bytes == 0:
        config.max_bytes = -1
    if config.replicas == 0:
        config.replicas = 1
    return config


class Watch:
    """A KV watch (nats.go `Watch`): the latest entry of each matching key, or all of them with
    `include_history`, or none with `updates_only`; then every change. `ignore_deletes` hides markers."""

    def __init__(self, stream: Stream, bucket: str, key: str, include_history: bool, ignore_deletes: bool, updates_only: bool) -> None:
        check_key_filter(key)
        mode: Initial = "all" if include_history else "new" if updates_only else "last_per_subject"
        self.bucket = bucket
        self.ignore_deletes = ignore_deletes
        self._watch = SubjectWatch(stream, f"{SUBJECT_PREFIX}{bucket}.{key}", mode)

    @property
    def closed(self) -> bool:
        return self._watch.closed

    @property
    def stream_name(self) -> str:
        return self._watch.stream.name

    @property
    def behind(self) -> bool:
        return self._watch.behind

    def initial(self) -> list[KvEntry]:
        entries = entries_of(self.bucket, self._watch.initial())
        for i, entry in enumerate(entries):
            entry.delta = len(entries) - 1 - i
        return self._visible(entries)

    def updates(self, limit: int = 1000) -> list[KvEntry]:
        entries = entries_of(self.bucket, self._watch.updates(limit))
        for entry in entries:
            entry.delta = 0
        return self._visible(entries)

    def _visible(self, entries: list[KvEntry]) -> list[KvEntry]:
        return [e for e in entries if e.operation == PUT] if self.ignore_deletes else entries


def entries_of(bucket: str, messages: list[StoredMessage]) -> list[KvEntry]:
    prefix = len(SUBJECT_PREFIX) + len(bucket) + 1
    return [KvEntry(bucket, m.subject[prefix:], m.data, m.seq, m.ts, operation_of(m)) for m in messages]


class KeyValueStores(Buckets):
    """Every KV bucket of an engine: bucket management and key operations over its streams."""

    prefix = STREAM_PREFIX

    # -- buckets ------------------------------------------------------------------------------

    def create(self, body: Any) -> tuple[dict[str, Any], bool]:
        """Creates a bucket; returns its status and whether it was created (False: identical exists)."""
        config = parse_config(body)
        return self._create(config.bucket, stream_config(config))

    def status(self, bucket: str) -> dict[str, Any]:
        stream = self.stream(bucket)
        c = stream.config
        state = stream.state()
        out: dict[str, Any] = {
            "bucket": bucket,
            "values": state["messages"],
            "history": c.max_msgs_per_subject,
            "ttl": c.max_age,
            "bytes": state["bytes"],
            "backing_store": "JetStream",
            "is_compressed": c.compression == "s2",
            "max_value_size": c.max_msg_size,
            "max_bytes": c.max_bytes,
            "storage": c.storage,
            "replicas": c.num_replicas,
            "stream": c.name,
        }
        if c.description is not None:
            out["description"] = c.description
        return out

    # -- writes -------------------------------------------------------------------------------

    def put(
        self,
        bucket: str,
        key: str,
        value: bytes,
        *,
        create: bool = False,
        last_revision: int | None = None,
        publish: Publisher | None = None,
    ) -> int:
        """Stores a value; `create` only if the key is absent or deleted, `last_revision` only if it is the latest."""
        subject = self._subject(bucket, key)
        send = publish or self._send
        if not create:
            return self._revision(send(InboundMessage(subject, value, _expect(last_revision))))
        result = send(InboundMessage(subject, value, _expect(0)))
        if isinstance(result, errors.WrongLastSequenceError):
            latest = self._latest(bucket, key)
            if latest is not None and operation_of(latest) != PUT:
                result = send(InboundMessage(subject, value, _expect(latest.seq)))
        return self._revision(result)

    def delete(self, bucket: str, key: str, *, purge: bool = False, last_revision: int | None = None) -> int:
        """A delete marker (history kept), or with `purge` a purge marker that drops the key's history."""
        subject = self._subject(bucket, key)
        headers = _expect(last_revision) or {}
        headers[OPERATION] = [PURGE if purge else DEL]
        if purge:
            headers[hdr.ROLLUP] = [hdr.ROLLUP_SUBJECT]
        return self._revision(self._send(InboundMessage(subject, b"", headers)))

    def _subject(self, bucket: str, key: str) -> str:
        check_bucket(bucket)
        check_key(key)
        subject = f"{SUBJECT_PREFIX}{bucket}.{key}"
        if not is_valid_publish_subject(subject):
            raise errors.bad_request(f"invalid key {key[:64]!r}")
        self.stream(bucket)
        return subject

    def _send(self, msg: InboundMessage) -> PublishResult:
        return self.js.publish([msg])[0]

    @staticmethod
    def _revision(result: PublishResult) -> int:
        if isinstance(result, JetStreamError):
            raise result
        return result.seq

    # -- reads --------------------------------------------------------------------------------

    def get(self, bucket: str, key: str, revision: int | None = None) -> KvEntry:
        """The latest value, or the one at `revision`; a delete or purge marker is "not found"."""
        subject = self._subject(bucket, key)
        stream = self.stream(bucket)
        if revision is not None:
            if revision <= 0:
                raise errors.bad_request("revision must be a positive integer")
            try:
                msg = stream.get(revision)
            except errors.NoMessageFoundError:
                raise key_not_found() from None
            if msg.subject != subject:
                raise key_not_found()
        else:
            latest = self._latest(bucket, key)
            if latest is None:
                raise key_not_found()
            msg = latest
        entry = entries_of(bucket, [msg])[0]
        if entry.operation != PUT:
            raise key_not_found()
        return entry

    def _latest(self, bucket: str, key: str) -> StoredMessage | None:
        try:
            return self.stream(bucket).last_by_subject(f"{SUBJECT_PREFIX}{bucket}.{key}")
        except errors.NoMessageFoundError:
            return None

    def history(self, bucket: str, key: str) -> list[KvEntry]:
        stream = self.stream(bucket)
        subject = self._subject(bucket, key)
        entries = entries_of(bucket, stream.load_many(stream.live_seqs(subject)))
        if not entries:
            raise key_not_found()
        for i, entry in enumerate(entries):
            entry.delta = len(entries) - 1 - i
        return entries

    def keys(self, bucket: str, filter_: str = ">") -> list[str]:
        """Keys whose latest entry is a value (not a delete or purge marker), in revision order."""
        check_key_filter(filter_)
        stream = self.stream(bucket)
        latest = stream.load_many(stream.last_seqs(f"{SUBJECT_PREFIX}{bucket}.{filter_}"))
        prefix = len(SUBJECT_PREFIX) + len(bucket) + 1
        return [m.subject[prefix:] for m in latest if operation_of(m) == PUT]

    def watch(self, bucket: str, key: str = ">", include_history: bool = False, ignore_deletes: bool = False, updates_only: bool = False) -> Watch:
        if include_history and updates_only:
            raise errors.bad_request("include_history and updates_only are mutually exclusive")
        return Watch(self.stream(bucket), bucket, key, include_history, ignore_deletes, updates_only)


def _expect(revision: int | None) -> dict[str, list[str]] | None:
    if revision is None:
        return None
    if revision < 0:
        raise errors.bad_request("a revision must not be negative")
    return {hdr.EXPECTED_LAST_SUBJECT_SEQ: [str(revision)]}
