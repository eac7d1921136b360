"""StreamConfig: JetStream's JSON, field for field, with nats-server's defaults and checks.

`check_stream_config` mirrors nats-server's `checkStreamCfg`: it fills the defaults the server fills
(limits 0 → -1, a two-minute duplicate window clamped by `max_age`, subjects defaulting to the name)
and refuses what the server refuses. Every field of nats-server 2.15's config is known; a known field
JetLake does not implement is accepted at its default value and refused with a clear error otherwise.
`check_stream_update` holds JetStream's rules on what an update may change. Counterpart:
server/stream.go (StreamConfig, checkStreamCfg, checkStreamUpdate).
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine import errors
from engine.subjects import FWC, is_valid_subject, subjects_collide

NS_PER_MS = 1_000_000
NS_PER_S = 1_000_000_000
DEFAULT_DUPLICATE_WINDOW = 120 * NS_PER_S
MAX_NAME_LEN = 255
MAX_DESCRIPTION_LEN = 4 * 1024
MAX_METADATA_LEN = 128 * 1024
MAX_REPLICAS = 5
MAX_INT64 = 2**63 - 1
# The metadata key by which a stream declares a coarser subject partitioning: its first N tokens.
PARTITION_TOKENS_KEY = "jetlake.partition_tokens"
DEFAULT_PARTITION_TOKENS = 1  # a new stream's table is partitioned by the subject's first token
_NAME_FORBIDDEN = re.compile(r"[\s.*>/\\\x00-\x1f\x7f]")

Retention = Literal["limits", "interest", "workqueue"]
Discard = Literal["old", "new"]
Storage = Literal["file", "memory"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class StreamConsumerLimits(_Model):
    inactive_threshold: int = 0
    max_ack_pending: int = 0


class SubjectTransformConfig(_Model):
    src: str = ""
    dest: str = ""


class RePublish(_Model):
    src: str = ""
    dest: str = ""
    headers_only: bool = False


class Placement(_Model):
    cluster: str | None = None
    tags: list[str] | None = None
    preferred: str | None = None


class ExternalStream(_Model):
    api: str = ""
    deliver: str = ""


class StreamConsumerSource(_Model):
    name: str = ""
    deliver_subject: str = ""


class StreamSource(_Model):
    name: str
    opt_start_seq: int | None = None
    opt_start_time: str | None = None
    filter_subject: str | None = None
    subject_transforms: list[SubjectTransformConfig] | None = None
    external: ExternalStream | None = None
    consumer: StreamConsumerSource | None = None


class StreamConfig(_Model):
    """A stream's configuration, as `$JS.API.STREAM.CREATE` takes it."""

    name: str = ""
    description: str | None = None
    subjects: list[str] | None = None
    retention: Retention = "limits"
    max_consumers: int = 0
    max_msgs: int = 0
    max_bytes: int = 0
    max_age: int = Field(0, description="nanoseconds; 0 keeps messages forever")
    max_msgs_per_subject: int = 0
    max_msg_size: int = Field(0, ge=-(2**31), le=2**31 - 1, description="int32, as nats-server's")
    discard: Discard = "old"
    storage: Storage = "file"
    num_replicas: int = 0
    no_ack: bool = False
    duplicate_window: int = Field(0, description="nanoseconds")
    placement: Placement | None = None
    mirror: StreamSource | None = None
    sources: list[StreamSource] | None = None
    compression: Literal["none", "s2"] = "none"
    first_seq: int | None = None
    subject_transform: SubjectTransformConfig | None = None
    republish: RePublish | None = None
    allow_direct: bool = False
    mirror_direct: bool = False
    discard_new_per_subject: bool = False
    sealed: bool = False
    deny_delete: bool = False
    deny_purge: bool = False
    allow_rollup_hdrs: bool = False
    consumer_limits: StreamConsumerLimits = Field(default_factory=StreamConsumerLimits)
    allow_msg_ttl: bool = False
    subject_delete_marker_ttl: int | None = None
    allow_msg_counter: bool = False
    allow_atomic: bool = False
    allow_msg_schedules: bool = False
    persist_mode: Literal["default", "async", ""] | None = None
    allow_batched: bool = False
    metadata: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)

    @property
    def partition_tokens(self) -> int:
        """How many leading subject tokens name the table partition of a new stream (0: the whole
        subject, on request only; layout.py's Partitioner bounds the partitions of the others)."""
        if self.metadata and PARTITION_TOKENS_KEY in self.metadata:
            return int(self.metadata[PARTITION_TOKENS_KEY])
        return bucket_partition_tokens(self.name, self.subjects) or DEFAULT_PARTITION_TOKENS

    @property
    def legacy_partition_tokens(self) -> int:
        """The layout of a stream made before its record named its partitioning: the whole subject,
        unless its metadata said otherwise."""
        if self.metadata and PARTITION_TOKENS_KEY in self.metadata:
            return int(self.metadata[PARTITION_TOKENS_KEY])
        return 0


def bucket_partition_tokens(name: str, subjects: list[str] | None) -> int:
    """A KV bucket or object store that a NATS client made itself (`KV_<b>` on `$KV.<b>.>`, `OBJ_<b>` on
    `$O.<b>.C.>` and `$O.<b>.M.>`) is partitioned per bucket like the engine's own buckets; 0 for any
    other stream."""
    if name.startswith("KV_") and subjects == [f"$KV.{name[3:]}.>"]:
        return 2
    bucket = name[4:]
    if name.startswith("OBJ_") and sorted(subjects or []) == [f"$O.{bucket}.C.>", f"$O.{bucket}.M.>"]:
        return 3
    return 0


M = TypeVar("M", bound=BaseModel)


def parse_model(model: type[M], body: Any, what: str) -> M:
    """A JSON object into a config model, strictly: a wrong type, an unknown field or a number that does
    not fit in 64 bits is 400 10025 "invalid JSON", as nats-server's JSON decoder answers."""
    if not isinstance(body, dict):
        raise errors.invalid_json(f"a {what} must be a JSON object")
    _check_int64(body, what)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or what
        if first["type"] == "extra_forbidden":
            raise errors.invalid_json(f"unknown field {where!r} in {what}") from None
        raise errors.invalid_json(f"{what} field {where!r}: {first['msg']}") from None


def _check_int64(value: Any, what: str) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int) and not -(2**63) <= value <= MAX_INT64:
        raise errors.invalid_json(f"{what}: number {value} overflows a 64-bit integer")
    if isinstance(value, dict):
        for item in value.values():
            _check_int64(item, what)
    elif isinstance(value, list):
        for item in value:
            _check_int64(item, what)


def parse_stream_config(body: dict[str, Any]) -> tuple[StreamConfig, bool]:
    """Parses a create or update body; returns the config and whether pedantic mode was asked."""
    if not isinstance(body, dict):
        raise errors.invalid_json("a stream configuration must be a JSON object")
    body = dict(body)
    pedantic = body.pop("pedantic", False)
    if not isinstance(pedantic, bool):
        raise errors.invalid_json("pedantic must be a boolean")
    return parse_model(StreamConfig, body, "stream configuration"), pedantic


def validate_name(name: str) -> None:
    """JetStream's asset-name rules (isValidAssetName), with its error codes."""
    if name and ("/" in name or "\\" in name):
        raise errors.name_has_path_separators()
    if not name or _NAME_FORBIDDEN.search(name):
        raise errors.invalid_stream_name()
    if len(name.encode()) > MAX_NAME_LEN:
        raise errors.invalid_config(f"stream name is too long, maximum allowed is {MAX_NAME_LEN}")


def _unlimited(value: int, field: str, pedantic: bool) -> int:
    if value == 0 or value < -1:
        if pedantic and value < -1:
            raise errors.pedantic(f"{field} must be set to -1")
        return -1
    if value > MAX_INT64:
        raise errors.invalid_config(f"{field} is too large")
    return value


def check_stream_config(config: StreamConfig, pedantic: bool = False) -> StreamConfig:
    """Returns the config with JetStream's defaults filled in, or raises what nats-server raises."""
    validate_name(config.name)
    if config.description is not None and len(config.description) > MAX_DESCRIPTION_LEN:
        raise errors.invalid_config(f"stream description is too long, maximum allowed is {MAX_DESCRIPTION_LEN}")
    metadata = {k: v for k, v in (config.metadata or {}).items() if not k.startswith("_nats.")}
    if sum(len(k) + len(v) for k, v in metadata.items()) > MAX_METADATA_LEN:
        raise errors.invalid_config(f"stream metadata exceeds maximum size of {MAX_METADATA_LEN} bytes")
    _check_partition_tokens(metadata)
    c = config.model_copy(deep=True)
    c.metadata = metadata or None
    if c.num_replicas < 0:
        raise errors.replicas_negative()
    if c.num_replicas == 0:
        c.num_replicas = 1
    if c.num_replicas > MAX_REPLICAS:
        raise errors.invalid_config(f"maximum replicas is {MAX_REPLICAS}")
    if c.num_replicas > 1:
        raise errors.replicas_not_supported()
    c.max_msgs = _unlimited(c.max_msgs, "max_msgs", pedantic)
    c.max_msgs_per_subject = _unlimited(c.max_msgs_per_subject, "max_msgs_per_subject", pedantic)
    c.max_bytes = _unlimited(c.max_bytes, "max_bytes", pedantic)
    c.max_msg_size = _unlimited(c.max_msg_size, "max_msg_size", pedantic)
    c.max_consumers = _unlimited(c.max_consumers, "max_consumers", pedantic)
    if c.max_msg_size > 2**31 - 1:
        raise errors.invalid_config("max_msg_size is too large")
    _check_durations(c, pedantic)
    if c.deny_purge and c.allow_rollup_hdrs:
        raise errors.invalid_config("roll-ups require the purge permission")
    if c.discard_new_per_subject:
        if c.discard != "new":
            raise errors.invalid_config("discard new per subject requires discard new policy to be set")
        if c.max_msgs_per_subject <= 0:
            raise errors.invalid_config("discard new per subject requires max msgs per subject > 0")
    if c.sealed:
        c.deny_delete = c.deny_purge = True
        if c.allow_rollup_hdrs:
            raise errors.invalid_config("roll-ups require the purge permission")
    if c.first_seq is not None and c.first_seq < 0:
        raise errors.invalid_config("first sequence can not be negative")
    if c.first_seq == 0:
        c.first_seq = None
    _check_not_implemented(c)
    _check_subjects(c)
    return c


def _check_partition_tokens(metadata: dict[str, str]) -> None:
    value = metadata.get(PARTITION_TOKENS_KEY)
    if value is None:
        return
    if not value.isdigit() or not 0 <= int(value) <= 16:
        raise errors.invalid_config(f"metadata {PARTITION_TOKENS_KEY} must be a whole number from 0 to 16")


def _check_durations(c: StreamConfig, pedantic: bool) -> None:
    if c.max_age < 0:
        raise errors.invalid_config("max age can not be negative")
    if c.max_age > MAX_INT64:
        raise errors.invalid_config("max age is too large")
    if 0 < c.max_age < 100 * NS_PER_MS:
        raise errors.invalid_config("max age needs to be >= 100ms")
    if c.duplicate_window == 0 and c.mirror is None and not c.sources:
        if c.max_age != 0 and c.max_age < DEFAULT_DUPLICATE_WINDOW:
            if pedantic:
                raise errors.pedantic("duplicate window cannot be bigger than max age")
            c.duplicate_window = c.max_age
        else:
            c.duplicate_window = DEFAULT_DUPLICATE_WINDOW
    if c.duplicate_window < 0:
        raise errors.invalid_config("duplicates window can not be negative")
    if c.max_age != 0 and c.duplicate_window > c.max_age:
        raise errors.invalid_config("duplicates window can not be larger then max age")
    if 0 < c.duplicate_window < 100 * NS_PER_MS:
        raise errors.invalid_config("duplicates window needs to be >= 100ms")
    if c.duplicate_window > MAX_INT64:
        raise errors.invalid_config("duplicates window is too large")
    limits = c.consumer_limits
    if limits.inactive_threshold < 0 or limits.max_ack_pending < -1:
        raise errors.invalid_config("consumer limits can not be negative")


def _refuse(field: str) -> errors.JetStreamError:
    return errors.invalid_config(f"{field} is not supported by JetLake; leave it at its default")


def _check_not_implemented(c: StreamConfig) -> None:
    """Known JetStream fields that JetLake does not implement: default only."""
    if c.mirror is not None:
        raise _refuse("mirror")
    if c.sources:
        raise _refuse("sources")
    if c.subject_transform is not None and (c.subject_transform.src or c.subject_transform.dest):
        raise _refuse("subject_transform")
    if c.republish is not None and c.republish.dest:
        raise _refuse("republish")
    if c.placement is not None and (c.placement.cluster or c.placement.tags):
        raise _refuse("placement")
    if c.no_ack:
        raise _refuse("no_ack (every HTTP publish is answered)")
    if c.mirror_direct:
        raise _refuse("mirror_direct")
    if c.subject_delete_marker_ttl:
        raise _refuse("subject_delete_marker_ttl (limit markers)")
    for field in ("allow_msg_counter", "allow_atomic", "allow_msg_schedules", "allow_batched"):
        if getattr(c, field):
            raise _refuse(field)
    if c.persist_mode == "async":
        raise _refuse("persist_mode async (use the gateway's --sync setting)")


def _check_subjects(c: StreamConfig) -> None:
    if not c.subjects:
        c.subjects = [c.name]
        return
    seen: set[str] = set()
    for subject in c.subjects:
        if not is_valid_subject(subject):
            raise errors.invalid_config("invalid subject")
        if subject in seen:
            raise errors.invalid_config("duplicate subjects detected")
        seen.add(subject)
        if subject == FWC:
            raise errors.invalid_config("capturing all subjects requires no-ack to be true")
        for reserved in ("$JS.>", "$JSC.>", "$NRG.>", "$SYS.>"):
            if subjects_collide(subject, reserved) and not subject.startswith(("$JS.EVENT.", "$SYS.ACCOUNT.")):
                raise errors.invalid_config("subjects that overlap with jetstream api require no-ack to be true")
    for i, a in enumerate(c.subjects):
        for b in c.subjects[i + 1 :]:
            if subjects_collide(a, b):
                raise errors.invalid_config("subjects overlap")


def same_config(a: StreamConfig, b: StreamConfig) -> bool:
    return a.to_json() == b.to_json()


def check_stream_update(old: StreamConfig, new: StreamConfig) -> None:
    """JetStream's rules on what an update may change (nats-server checkStreamUpdate)."""
    if new.name != old.name:
        raise errors.stream_mismatch()
    if new.storage != old.storage:
        raise errors.invalid_config("stream configuration update can not change storage type")
    if new.retention != old.retention and "workqueue" in (new.retention, old.retention):
        raise errors.invalid_config("stream configuration update can not change retention policy to/from workqueue")
    if old.sealed and not new.sealed:
        raise errors.invalid_config("stream configuration update can not unseal a sealed stream")
    if old.deny_delete and not new.deny_delete:
        raise errors.invalid_config("stream configuration update can not cancel deny message deletes")
    if old.deny_purge and not new.deny_purge:
        raise errors.invalid_config("stream configuration update can not cancel deny purge")
    if (new.first_seq or 0) != (old.first_seq or 0):
        raise errors.invalid_config("stream configuration update can not change first sequence")
    if new.partition_tokens != old.partition_tokens:
        raise errors.invalid_config(f"stream configuration update can not change metadata {PARTITION_TOKENS_KEY}")
