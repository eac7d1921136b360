"""An account's JetStream limits and their checks, as nats-server enforces them (untiered limits).

The limits come from the account's `jetstream {…}` block (engine/accounts/config.py); -1 is
unlimited. What is checked, and when:

| when | check | err_code |
|---|---|---|
| stream create | streams other than this one ≥ `max_streams` (> 0) | 10027 |
| stream create/update | the stream's `max_consumers` above the account's (both > 0) | 10026 |
| stream create/update | `max_bytes_required` and no `max_bytes` | 10113 |
| stream create/update | `max_bytes` above `memory_max_stream_bytes` / `storage_max_stream_bytes` (> 0) | 10122 |
| stream create/update | the other streams' reserved `max_bytes` plus this one's (unset: 1 byte) over `max_memory` / `max_storage` (≥ 0; 0 forbids that storage) | 10028 / 10047 |
| publish | the account's stored bytes of that storage plus the message over `max_memory` / `max_storage` | 10002 |
| consumer create | that stream's consumers ≥ its `max_consumers`, or else the account's `max_consumers` (per stream) | 10026 |
| consumer create/update | `max_ack_pending` above the account's (> 0); unset becomes min(1000, the stream's, the account's) | 10121 |

nats-server answers 10028 and 10047 with status 500; JetLake answers 400, as it does for every
client mistake (docs/api.md). Counterpart: server/jetstream.go (`checkLimits`, `checkBytesLimits`,
`wouldExceedLimits`), server/jetstream_api.go (`jsNonClusteredStreamLimitsCheck`,
`tieredReservation`), server/stream.go (`checkStreamCfg`, the update's reservation) and
server/consumer.go (`setConsumerConfigDefaults`, `checkConsumerCfg`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from engine.errors import ErrorCode, JetStreamError

UNLIMITED = -1
DEFAULT_MAX_ACK_PENDING = 1000  # nats-server's JsDefaultMaxAckPending


@dataclass(frozen=True)
class AccountLimits:
    """JetStream's `JetStreamAccountLimits`, under its JSON names."""

    max_memory: int = UNLIMITED
    max_storage: int = UNLIMITED
    max_streams: int = UNLIMITED
    max_consumers: int = UNLIMITED
    max_ack_pending: int = UNLIMITED
    memory_max_stream_bytes: int = UNLIMITED
    storage_max_stream_bytes: int = UNLIMITED
    max_bytes_required: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def limits_bytes(self) -> bool:
        """Whether a publish must be checked against the account's storage."""
        return self.max_memory >= 0 or self.max_storage >= 0


UNLIMITED_LIMITS = AccountLimits()


class StreamShape(Protocol):
    """What the checks read of a stream's config (engine.config.StreamConfig has it)."""

    name: str
    storage: str
    max_bytes: int
    max_consumers: int


def _error(code: int, err_code: int, description: str) -> JetStreamError:
    return JetStreamError(code, err_code, description)


def max_streams_reached() -> JetStreamError:
    return _error(400, ErrorCode.MAXIMUM_STREAMS_LIMIT, "maximum number of streams reached")


def max_consumers_reached() -> JetStreamError:
    return _error(400, ErrorCode.MAXIMUM_CONSUMERS_LIMIT, "maximum consumers limit reached")


def resources_exceeded(storage: str) -> JetStreamError:
    if storage == "memory":
        return _error(400, ErrorCode.MEMORY_RESOURCES_EXCEEDED, "insufficient memory resources available")
    return _error(400, ErrorCode.STORAGE_RESOURCES_EXCEEDED, "insufficient storage resources available")


def account_resources_exceeded() -> JetStreamError:
    return _error(400, ErrorCode.ACCOUNT_RESOURCES_EXCEEDED, "resource limits exceeded for account")


def max_bytes_required() -> JetStreamError:
    return _error(400, ErrorCode.STREAM_MAX_BYTES_REQUIRED, "account requires a stream config to have max bytes set")


def max_stream_bytes_exceeded() -> JetStreamError:
    return _error(400, ErrorCode.STREAM_MAX_STREAM_BYTES_EXCEEDED, "stream max bytes exceeds account limit max stream bytes")


def max_ack_pending_exceeded(limit: int) -> JetStreamError:
    return _error(400, ErrorCode.CONSUMER_MAX_PENDING_ACK_EXCESS, f"consumer max ack pending exceeds system limit of {limit}")


def not_enabled() -> JetStreamError:
    return _error(503, ErrorCode.NOT_ENABLED_FOR_ACCOUNT, "JetStream not enabled for account")


def _storage_limit(limits: AccountLimits, storage: str) -> int:
    return limits.max_memory if storage == "memory" else limits.max_storage


def reserved_bytes(streams: Iterable[StreamShape], storage: str, exclude: str | None = None) -> int:
    """The bytes the account's streams of one storage type reserve: their positive `max_bytes`."""
    return sum(s.max_bytes for s in streams if s.storage == storage and s.max_bytes > 0 and s.name != exclude)


def check_stream(limits: AccountLimits, config: StreamShape, others: list[StreamShape], *, update: StreamShape | None = None) -> None:
    """A stream create (or, with `update` = the old config, an update) against the account's limits.

    `others` are the account's other streams (this name excluded).
    """
    if update is None and limits.max_streams > 0 and len(others) >= limits.max_streams:
        raise max_streams_reached()
    if config.max_consumers > 0 and 0 < limits.max_consumers < config.max_consumers:
        raise max_consumers_reached()
    cap = limits.memory_max_stream_bytes if config.storage == "memory" else limits.storage_max_stream_bytes
    if limits.max_bytes_required and config.max_bytes <= 0:
        raise max_bytes_required()
    if cap > 0 and config.max_bytes > cap:
        raise max_stream_bytes_exceeded()
    limit = _storage_limit(limits, config.storage)
    if limit < 0:
        return
    reserved = reserved_bytes(others, config.storage)
    if update is None:
        adding = config.max_bytes if config.max_bytes > 0 else 1
    else:  # only growth is reserved anew; the stream's own new size joins what is reserved
        adding = max(max(config.max_bytes, 0) - max(update.max_bytes, 0), 0)
        reserved += max(config.max_bytes, 0) - adding
    if reserved > limit or adding > limit - reserved:
        raise resources_exceeded(config.storage)


def would_exceed(limits: AccountLimits, storage: str, used: int, size: int) -> bool:
    """Whether storing `size` more bytes of `storage` goes over the account's limit (`used` bytes now)."""
    limit = _storage_limit(limits, storage)
    return limit >= 0 and used + size > limit


def consumer_cap(limits: AccountLimits, stream_max_consumers: int) -> int:
    """How many consumers a stream may have: its own cap, unless the account's is lower or the only one."""
    cap = stream_max_consumers
    if cap <= 0 or (limits.max_consumers > 0 and limits.max_consumers < cap):
        cap = limits.max_consumers
    return cap


def check_consumer_count(limits: AccountLimits, stream_max_consumers: int, existing: int) -> None:
    cap = consumer_cap(limits, stream_max_consumers)
    if cap > 0 and existing >= cap:
        raise max_consumers_reached()


def max_ack_pending(limits: AccountLimits, given: int, stream_limit: int, resolved: int) -> int:
    """A consumer's `max_ack_pending` under the account's cap. `given` is the request's value (0:
    unset), `stream_limit` the stream's `consumer_limits.max_ack_pending`, `resolved` what the stream's
    defaults made of them: the default of 1000 is lowered to the account's cap; a value above it is 10121."""
    cap = limits.max_ack_pending
    if cap <= 0:
        return resolved
    if given == 0 and stream_limit <= 0 and resolved > cap:
        return cap
    if resolved > cap:
        raise max_ack_pending_exceeded(cap)
    return resolved
