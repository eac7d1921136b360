"""ConsumerConfig: JetStream's JSON, field for field, with nats-server's defaults and checks.

`check_consumer_config` mirrors nats-server's `setConsumerConfigDefaults` and `checkConsumerCfg`, plus the
naming and work-queue rules of `addConsumerWithAssignment`: it fills the defaults the server fills and
refuses what the server refuses, with its err_codes. A consumer with a `deliver_subject` is a push
consumer: the engine keeps its state like any other, and the front door that owns the delivery
subject (the NATS door) pushes what `fetch` returns. `check_consumer_update` holds
JetStream's rules on what an update may change (`checkNewConsumerConfig`). Counterpart: server/consumer.go.
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import IntEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine import errors
from engine.config import (
    MAX_DESCRIPTION_LEN,
    MAX_METADATA_LEN,
    MAX_NAME_LEN,
    NS_PER_MS,
    NS_PER_S,
    StreamConfig,
    parse_model,
)
from engine.subjects import is_literal, is_subset_match, is_valid_subject, subjects_collide

DEFAULT_ACK_WAIT = 30 * NS_PER_S
DEFAULT_MAX_WAITING = 512
DEFAULT_MAX_ACK_PENDING = 1000
EPHEMERAL_INACTIVE_THRESHOLD = 5 * NS_PER_S
DEFAULT_PINNED_TTL = 120 * NS_PER_S
_NAME_FORBIDDEN = re.compile(r"[\s.*>\x00-\x1f\x7f]")
_GROUP_NAME = re.compile(r"[a-zA-Z0-9/_=-]{1,16}")
_RFC3339 = re.compile(r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})")
# Fields nats-server always writes; every other field is `omitempty`.
_ALWAYS_SHOWN = frozenset({"deliver_policy", "ack_policy", "replay_policy", "num_replicas"})

DeliverPolicy = Literal["all", "last", "new", "by_start_sequence", "by_start_time", "last_per_subject"]
AckPolicy = Literal["none", "all", "explicit", "flow_control"]
PriorityPolicy = Literal["none", "overflow", "pinned_client", "prioritized"]


class ConsumerErrorCode(IntEnum):
    """nats-server's consumer `error_code`s with their errors.json descriptions; to move into errors.py."""

    description: str

    def __new__(cls, value: int, description: str) -> ConsumerErrorCode:
        member = int.__new__(cls, value)
        member._value_ = value
        member.description = description
        return member

    def error(self, **args: object) -> errors.JetStreamError:
        """The 400 a client sees, the description's {placeholders} filled from `args`."""
        return errors.JetStreamError(400, self, self.description.format(**args))

    CONSUMER_CREATE = 10012, "{err}"
    DURABLE_NAME_NOT_MATCH_SUBJECT = 10017, "consumer name in subject does not match durable name in request"
    PULL_REQUIRES_ACK = 10084, "consumer in pull mode requires explicit ack policy on workqueue stream"
    PULL_WITH_RATE_LIMIT = 10086, "consumer in pull mode can not have rate limit set"
    HEARTBEAT_REQUIRES_PUSH = 10088, "consumer idle heartbeat requires a push based consumer"
    FLOW_CONTROL_REQUIRES_PUSH = 10089, "consumer flow control requires a push based consumer"
    DIRECT_REQUIRES_PUSH = 10090, "consumer direct requires a push based consumer"
    FILTER_NOT_SUBSET = 10093, "consumer filter subject is not a valid subset of the interest subjects"
    INVALID_POLICY = 10094, "{err}"
    INVALID_SAMPLING = 10095, "failed to parse consumer sampling configuration: {err}"
    WQ_REQUIRES_EXPLICIT_ACK = 10098, "workqueue stream requires explicit ack"
    WQ_MULTIPLE_UNFILTERED = 10099, "multiple non-filtered consumers not allowed on workqueue stream"
    WQ_CONSUMER_NOT_UNIQUE = 10100, "filtered consumer not unique on workqueue stream"
    WQ_CONSUMER_NOT_DELIVER_ALL = 10101, "consumer must be deliver all on workqueue stream"
    NAME_TOO_LONG = 10102, "consumer name is too long, maximum allowed is {max}"
    BAD_DURABLE_NAME = 10103, "durable name can not contain '.', '*', '>'"
    DESCRIPTION_TOO_LONG = 10107, "consumer description is too long, maximum allowed is {max}"
    MAX_REQUEST_EXPIRES_TOO_SMALL = 10115, "consumer max request expires needs to be >= 1ms"
    MAX_DELIVER_BACKOFF = 10116, "max deliver is required to be > length of backoff values"
    MAX_PENDING_ACK_EXCESS = 10121, "consumer max ack pending exceeds system limit of {limit}"
    NAME_CONTAINS_PATH_SEPARATORS = 10127, "Consumer name can not contain path separators"
    DURABLE_AND_NAME_MISMATCH = 10132, "Consumer Durable and Name have to be equal if both are provided"
    METADATA_LENGTH = 10135, "consumer metadata exceeds maximum size of {limit}"
    DUPLICATE_FILTER_SUBJECTS = 10136, "consumer cannot have both FilterSubject and FilterSubjects specified"
    OVERLAPPING_SUBJECT_FILTERS = 10138, "consumer subject filters cannot overlap"
    EMPTY_FILTER = 10139, "consumer filter in FilterSubjects cannot be empty"
    INACTIVE_THRESHOLD_EXCESS = 10153, "consumer inactive threshold exceeds system limit of {limit}"
    PRIORITY_POLICY_WITHOUT_GROUP = 10159, "Setting PriorityPolicy requires at least one PriorityGroup to be set"
    INVALID_PRIORITY_GROUP = 10160, "Provided priority group does not exist for this consumer"
    EMPTY_GROUP_NAME = 10161, "Group name cannot be an empty string"
    INVALID_GROUP_NAME = (
        10162,
        "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters",
    )
    ACK_WAIT_NEGATIVE = 10183, "consumer ack wait needs to be positive"
    BACKOFF_NEGATIVE = 10184, "consumer backoff needs to be positive"
    PRIORITY_GROUP_WITH_POLICY_NONE = 10196, "consumer can not have priority groups when policy is none"
    PINNED_TTL_WITHOUT_PRIORITY_POLICY = 10197, "PinnedTTL cannot be set when PriorityPolicy is none"
    ACK_FLOW_CONTROL_REQUIRES_PUSH = 10218, "flow control ack policy requires a push based consumer"
    DELIVER_TO_WILDCARDS = 10079, "consumer deliver subject has wildcards"
    PUSH_MAX_WAITING = 10080, "consumer in push mode can not set max waiting"
    DELIVER_CYCLE = 10081, "consumer deliver subject forms a cycle"
    MAX_PENDING_ACK_POLICY_REQUIRED = 10082, "consumer requires ack policy for max ack pending"
    SMALL_HEARTBEAT = 10083, "consumer idle heartbeat needs to be >= 100ms"
    FLOW_CONTROL_NEEDS_HEARTBEATS = 10108, "consumer with flow control also needs heartbeats"
    INVALID_DELIVER_SUBJECT = 10112, "invalid push consumer deliver subject"


def rfc3339_ns(value: str) -> int:
    """Nanoseconds since the epoch of an RFC 3339 time, as Go's time.RFC3339Nano reads it."""
    match = _RFC3339.fullmatch(value)
    if match is None:
        raise ValueError(f"{value!r} is not an RFC 3339 time")
    date, clock, fraction, zone = match.groups()
    zone = "+00:00" if zone in ("Z", "z") else zone
    seconds = int(datetime.fromisoformat(f"{date}T{clock}{zone}").timestamp())
    return seconds * NS_PER_S + int((fraction or "0")[:9].ljust(9, "0"))


class ConsumerConfig(BaseModel):
    """A consumer's configuration, as `$JS.API.CONSUMER.CREATE` takes it; durations in nanoseconds."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    durable_name: str | None = None
    name: str | None = None
    description: str | None = None
    deliver_policy: DeliverPolicy = "all"
    opt_start_seq: int = Field(0, ge=0)
    opt_start_time: str | None = None
    ack_policy: AckPolicy = "none"
    ack_wait: int = 0
    max_deliver: int = 0
    backoff: list[int] | None = None
    filter_subject: str | None = None
    filter_subjects: list[str] | None = None
    replay_policy: Literal["instant", "original"] = "instant"
    rate_limit_bps: int = Field(0, ge=0)
    sample_freq: str | None = None
    max_waiting: int = 0
    max_ack_pending: int = 0
    flow_control: bool = False
    headers_only: bool = False
    max_batch: int = 0
    max_expires: int = 0
    max_bytes: int = 0
    deliver_subject: str | None = None
    deliver_group: str | None = None
    idle_heartbeat: int = 0
    inactive_threshold: int = 0
    num_replicas: int = 0
    mem_storage: bool = False
    direct: bool = False
    sourcing: bool = False
    metadata: dict[str, str] | None = None
    pause_until: str | None = None
    priority_groups: list[str] | None = None
    priority_policy: PriorityPolicy = "none"
    priority_timeout: int = 0

    @field_validator("opt_start_time", "pause_until")
    @classmethod
    def _rfc3339(cls, value: str | None) -> str | None:
        if value is not None:
            rfc3339_ns(value)
        return value

    def to_json(self) -> dict[str, Any]:
        """The config as nats-server writes it: zero-valued `omitempty` fields left out."""
        return {k: v for k, v in self.model_dump().items() if k in _ALWAYS_SHOWN or not _is_zero(k, v)}


def _is_zero(field: str, value: Any) -> bool:
    return value in (None, 0, "", [], {}) or (field == "priority_policy" and value == "none")


def filters(config: ConsumerConfig) -> list[str]:
    """The consumer's subject filters; empty when it takes every subject of its stream."""
    if config.filter_subjects:
        return list(config.filter_subjects)
    return [config.filter_subject] if config.filter_subject else []


def consumer_name(config: ConsumerConfig) -> str:
    return config.durable_name or config.name or ""


def parse_consumer_config(body: Any) -> ConsumerConfig:
    """Parses the `config` object of a consumer create or update request."""
    return parse_model(ConsumerConfig, body, "consumer configuration")


def check_consumer_config(
    config: ConsumerConfig,
    stream_config: StreamConfig,
    *,
    ephemeral: bool,
    existing_consumers: list[ConsumerConfig],
    pedantic: bool = False,
) -> ConsumerConfig:
    """Returns the config with nats-server's defaults filled in, or raises what nats-server raises.

    Args:
        ephemeral: the consumer has no durable name; ephemerals expire after 5s idle unless told otherwise.
        existing_consumers: the stream's consumers; one of the same name (an update) is skipped.
        pedantic: refuse values nats-server would otherwise correct.
    """
    c = config.model_copy(deep=True)
    c.metadata = {k: v for k, v in (c.metadata or {}).items() if not k.startswith("_nats.")} or None
    _check_names(c)
    _set_defaults(c, stream_config, pedantic)
    _check_replicas(c)
    _check_acks(c)
    if c.description is not None and _size(c.description) > MAX_DESCRIPTION_LEN:
        raise ConsumerErrorCode.DESCRIPTION_TOO_LONG.error(max=MAX_DESCRIPTION_LEN)
    if c.deliver_subject:
        _check_push(c, stream_config)
    else:
        _check_pull(c, stream_config)
    _check_stream_limits(c, stream_config)
    if c.direct:
        raise ConsumerErrorCode.DIRECT_REQUIRES_PUSH.error()
    if c.sourcing:
        raise errors.invalid_config("sourcing is not supported by JetLake; leave it at its default")
    _check_filters(c, stream_config)
    _check_deliver_policy(c)
    _check_sampling(c)
    if c.durable_name and c.name and c.durable_name != c.name:
        raise ConsumerErrorCode.DURABLE_AND_NAME_MISMATCH.error()
    if sum(_size(k) + _size(v) for k, v in (c.metadata or {}).items()) > MAX_METADATA_LEN:
        raise ConsumerErrorCode.METADATA_LENGTH.error(limit=f"{MAX_METADATA_LEN // 1024}KB")
    _check_priority(c)
    _check_work_queue(c, stream_config, existing_consumers)
    if c.durable_name:
        c.name = c.durable_name
    if ephemeral and c.inactive_threshold <= 0:
        c.inactive_threshold = EPHEMERAL_INACTIVE_THRESHOLD
    return c


def _size(text: str) -> int:
    return len(text.encode())


def _check_names(c: ConsumerConfig) -> None:
    for name, durable in ((c.name, False), (c.durable_name, True)):
        if not name:
            continue
        if "/" in name or "\\" in name:
            raise ConsumerErrorCode.NAME_CONTAINS_PATH_SEPARATORS.error()
        if _NAME_FORBIDDEN.search(name):
            if durable:
                raise ConsumerErrorCode.BAD_DURABLE_NAME.error()
            raise errors.invalid_config("consumer name can not contain '.', '*', '>', '\\', '/'")
        if _size(name) > MAX_NAME_LEN:
            raise ConsumerErrorCode.NAME_TOO_LONG.error(max=MAX_NAME_LEN)


# Fields nats-server raises to a floor (or refuses in pedantic mode) when below it.
_CLAMPED = {"max_waiting": 0, "max_ack_pending": -1, "max_batch": 0, "max_expires": 0, "max_bytes": 0}
_CLAMPED |= {"idle_heartbeat": 0, "inactive_threshold": 0, "priority_timeout": 0}


def _set_defaults(c: ConsumerConfig, stream: StreamConfig, pedantic: bool) -> None:
    """nats-server's setConsumerConfigDefaults, for a pull consumer."""
    if c.max_deliver == 0 or c.max_deliver < -1:
        if pedantic and c.max_deliver < -1:
            raise errors.pedantic("max_deliver must be set to -1")
        c.max_deliver = -1
    for field, floor in _CLAMPED.items():
        if getattr(c, field) < floor:
            if pedantic:
                raise errors.pedantic(f"{field} must " + ("be set to -1" if floor < 0 else "not be negative"))
            setattr(c, field, floor)
    if c.max_waiting == 0 and not c.deliver_subject:
        c.max_waiting = DEFAULT_MAX_WAITING
    if c.ack_wait == 0 and c.ack_policy in ("explicit", "all"):
        c.ack_wait = DEFAULT_ACK_WAIT
    if c.backoff:
        if pedantic and c.ack_wait != c.backoff[0]:
            raise errors.pedantic("first backoff value has to equal batch AckWait")
        c.ack_wait = c.backoff[0]
    limits = stream.consumer_limits
    if c.max_ack_pending == 0:
        if pedantic and limits.max_ack_pending > 0:
            raise errors.pedantic("max_ack_pending must be set if it's configured in stream limits")
        c.max_ack_pending = limits.max_ack_pending
    if c.inactive_threshold == 0:
        if pedantic and limits.inactive_threshold > 0:
            raise errors.pedantic("inactive_threshold must be set if it's configured in stream limits")
        c.inactive_threshold = limits.inactive_threshold
    if c.max_ack_pending == 0 and c.ack_policy != "none":
        c.max_ack_pending = DEFAULT_MAX_ACK_PENDING
    if c.priority_policy == "pinned_client" and c.priority_timeout == 0:
        c.priority_timeout = DEFAULT_PINNED_TTL


def _check_replicas(c: ConsumerConfig) -> None:
    if c.num_replicas < 0:
        raise errors.replicas_negative()
    if c.num_replicas > 1:
        raise errors.replicas_not_supported()


def _check_acks(c: ConsumerConfig) -> None:
    if any(b < 0 for b in c.backoff or ()):
        raise ConsumerErrorCode.BACKOFF_NEGATIVE.error()
    if c.ack_wait < 0:
        raise ConsumerErrorCode.ACK_WAIT_NEGATIVE.error()
    if c.ack_policy == "flow_control":
        raise ConsumerErrorCode.ACK_FLOW_CONTROL_REQUIRES_PUSH.error()
    _check_backoff_fits(c)


def _check_backoff_fits(c: ConsumerConfig) -> None:
    if c.backoff and c.max_deliver != -1 and len(c.backoff) > c.max_deliver:
        raise ConsumerErrorCode.MAX_DELIVER_BACKOFF.error()


def _check_pull(c: ConsumerConfig, stream: StreamConfig) -> None:
    if c.ack_policy == "none" and stream.retention == "workqueue":
        raise ConsumerErrorCode.PULL_REQUIRES_ACK.error()
    if c.rate_limit_bps > 0:
        raise ConsumerErrorCode.PULL_WITH_RATE_LIMIT.error()
    if c.idle_heartbeat > 0:
        raise ConsumerErrorCode.HEARTBEAT_REQUIRES_PUSH.error()
    if c.flow_control:
        raise ConsumerErrorCode.FLOW_CONTROL_REQUIRES_PUSH.error()
    if 0 < c.max_expires < NS_PER_MS:
        raise ConsumerErrorCode.MAX_REQUEST_EXPIRES_TOO_SMALL.error()


def _check_push(c: ConsumerConfig, stream: StreamConfig) -> None:
    """nats-server's checks of a push consumer (its deliver subject is where a front door pushes)."""
    subject = c.deliver_subject or ""
    if not is_literal(subject):
        raise ConsumerErrorCode.DELIVER_TO_WILDCARDS.error()
    if not is_valid_subject(subject):
        raise ConsumerErrorCode.INVALID_DELIVER_SUBJECT.error()
    if any(is_subset_match(subject, s) for s in stream.subjects or [stream.name]):
        raise ConsumerErrorCode.DELIVER_CYCLE.error()
    if c.max_waiting != 0:
        raise ConsumerErrorCode.PUSH_MAX_WAITING.error()
    if c.max_ack_pending > 0 and c.ack_policy == "none":
        raise ConsumerErrorCode.MAX_PENDING_ACK_POLICY_REQUIRED.error()
    if 0 < c.idle_heartbeat < 100 * NS_PER_MS:
        raise ConsumerErrorCode.SMALL_HEARTBEAT.error()
    if c.flow_control and c.idle_heartbeat <= 0:
        raise ConsumerErrorCode.FLOW_CONTROL_NEEDS_HEARTBEATS.error()


def _check_stream_limits(c: ConsumerConfig, stream: StreamConfig) -> None:
    limits = stream.consumer_limits
    if 0 < limits.max_ack_pending < c.max_ack_pending:
        raise ConsumerErrorCode.MAX_PENDING_ACK_EXCESS.error(limit=limits.max_ack_pending)
    if 0 < limits.inactive_threshold < c.inactive_threshold:
        raise ConsumerErrorCode.INACTIVE_THRESHOLD_EXCESS.error(limit=go_duration(limits.inactive_threshold))


def go_duration(ns: int) -> str:
    """A positive duration as Go's time.Duration.String() prints it: 3s, 1m30s, 1.5s, 250ms."""
    if ns < NS_PER_S:
        for unit, size in (("ms", NS_PER_MS), ("µs", 1_000)):
            if ns >= size:
                return _decimal(ns, size) + unit
        return f"{ns}ns"
    hours, rest = divmod(ns, 3600 * NS_PER_S)
    minutes, rest = divmod(rest, 60 * NS_PER_S)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if hours or minutes else "") + _decimal(rest, NS_PER_S) + "s"


def _decimal(value: int, unit: int) -> str:
    whole, part = divmod(value, unit)
    digits = f"{part:0{len(str(unit)) - 1}d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def _check_filters(c: ConsumerConfig, stream: StreamConfig) -> None:
    if c.filter_subject and c.filter_subjects:
        raise ConsumerErrorCode.DUPLICATE_FILTER_SUBJECTS.error()
    if c.filter_subject and not is_valid_subject(c.filter_subject):
        raise errors.invalid_config("invalid subject")
    if "" in (c.filter_subjects or ()):
        raise ConsumerErrorCode.EMPTY_FILTER.error()
    subjects = filters(c)
    for i, subject in enumerate(subjects):
        if not is_valid_subject(subject):
            raise errors.invalid_config("invalid subject")
        if any(j != i and is_subset_match(subject, other) for j, other in enumerate(subjects)):
            raise ConsumerErrorCode.OVERLAPPING_SUBJECT_FILTERS.error()
    stream_subjects = stream.subjects or [stream.name]
    for subject in subjects:
        if not any(subjects_collide(subject, s) for s in stream_subjects):
            raise ConsumerErrorCode.FILTER_NOT_SUBSET.error()


def _policy_error(policy: str, problem: str) -> errors.JetStreamError:
    return ConsumerErrorCode.INVALID_POLICY.error(err=f"consumer delivery policy is deliver {policy}, but {problem}")


def _check_deliver_policy(c: ConsumerConfig) -> None:
    has_seq, has_time = c.opt_start_seq > 0, c.opt_start_time is not None
    policy = c.deliver_policy.replace("_", " ")
    if c.deliver_policy == "by_start_sequence":
        if not has_seq:
            raise _policy_error(policy, "optional start sequence is not set")
        if has_time:
            raise _policy_error(policy, "optional start time is also set")
    elif c.deliver_policy == "by_start_time":
        if not has_time:
            raise _policy_error(policy, "optional start time is not set")
        if has_seq:
            raise _policy_error(policy, "optional start start sequence is also set")
    else:
        if has_seq:
            raise _policy_error(policy, "optional start sequence is also set")
        if has_time:
            raise _policy_error(policy, "optional start time is also set")
        if c.deliver_policy == "last_per_subject" and not filters(c):
            raise _policy_error(policy, "optional filter subject is not set")


def _check_sampling(c: ConsumerConfig) -> None:
    if not c.sample_freq:
        return
    text = c.sample_freq.removesuffix("%")
    if not re.fullmatch(r"[+-]?\d+", text):
        raise ConsumerErrorCode.INVALID_SAMPLING.error(err=f'strconv.Atoi: parsing "{text}": invalid syntax')
    if int(text) < 0:
        raise ConsumerErrorCode.INVALID_SAMPLING.error(err="sample frequency can not be negative")


def _check_priority(c: ConsumerConfig) -> None:
    if c.priority_policy == "none":
        if c.priority_groups:
            raise ConsumerErrorCode.PRIORITY_GROUP_WITH_POLICY_NONE.error()
        if c.priority_timeout > 0:
            raise ConsumerErrorCode.PINNED_TTL_WITHOUT_PRIORITY_POLICY.error()
        return
    if not c.priority_groups:
        raise ConsumerErrorCode.PRIORITY_POLICY_WITHOUT_GROUP.error()
    for group in c.priority_groups:
        if not group:
            raise ConsumerErrorCode.EMPTY_GROUP_NAME.error()
        if not valid_group_name(group):
            raise ConsumerErrorCode.INVALID_GROUP_NAME.error()


def valid_group_name(name: str) -> bool:
    """consumer.go validGroupName: a priority group's name, in a config or an unpin request."""
    return bool(_GROUP_NAME.fullmatch(name))


def _check_work_queue(c: ConsumerConfig, stream: StreamConfig, existing: list[ConsumerConfig]) -> None:
    """A work queue hands each message to one consumer: explicit acks, deliver all, disjoint filters."""
    if stream.retention != "workqueue":
        return
    if c.ack_policy != "explicit":
        raise ConsumerErrorCode.WQ_REQUIRES_EXPLICIT_ACK.error()
    if c.deliver_policy != "all":
        raise ConsumerErrorCode.WQ_CONSUMER_NOT_DELIVER_ALL.error()
    name = consumer_name(c)
    others = [o for o in existing if not (name and consumer_name(o) == name) and not (o.direct or o.sourcing)]
    if not others:
        return
    mine = filters(c)
    if not mine:
        raise ConsumerErrorCode.WQ_MULTIPLE_UNFILTERED.error()
    for other in others:
        theirs = filters(other)
        if not theirs or any(subjects_collide(f, t) for f in mine for t in theirs):
            raise ConsumerErrorCode.WQ_CONSUMER_NOT_UNIQUE.error()


# What an update may not change, in nats-server's order, with the words of its error.
_IMMUTABLE = {"deliver_policy": "deliver policy", "mem_storage": "storage type", "direct": "direct"}
_IMMUTABLE |= {"sourcing": "sourcing", "opt_start_seq": "start sequence", "opt_start_time": "start time"}
_IMMUTABLE |= {"ack_policy": "ack policy", "replay_policy": "replay policy", "idle_heartbeat": "heart beats"}
_IMMUTABLE |= {"flow_control": "flow control"}


def check_consumer_update(old: ConsumerConfig, new: ConsumerConfig) -> None:
    """JetStream's rules on what an update may change; both configs as check_consumer_config returns them."""
    if old.to_json() == new.to_json():
        return
    refuse = ConsumerErrorCode.CONSUMER_CREATE.error
    for field, what in _IMMUTABLE.items():
        before, after = getattr(old, field), getattr(new, field)
        if field == "opt_start_time":
            before, after = (rfc3339_ns(t) if t else None for t in (before, after))
        if before != after:
            raise refuse(err=f"{what} can not be updated")
    if (old.deliver_subject or "") != (new.deliver_subject or ""):
        if not old.deliver_subject:
            raise refuse(err="can not update pull consumer to push based")
        if not new.deliver_subject:
            raise refuse(err="can not update push consumer to pull based")
    if old.max_waiting != new.max_waiting:
        raise refuse(err="max waiting can not be updated")
    _check_backoff_fits(new)
