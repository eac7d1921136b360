"""ConsumerConfig: nats-server 2.15's defaults field for field, its refusals with their err_codes, and its update rules.

The expected configs are what a real nats-server 2.15.1 answered to the same requests (its `_nats.*`
metadata left out).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.config import StreamConfig, check_stream_config
from engine.consumer_config import (
    ConsumerConfig,
    ConsumerErrorCode,
    check_consumer_config,
    check_consumer_update,
    filters,
    go_duration,
    parse_consumer_config,
    rfc3339_ns,
)
from engine.errors import JetStreamError

S = 1_000_000_000
D = {"durable_name": "D"}
NONE_D = {"ack_policy": "none", "durable_name": "D", "name": "D"}
BASE = {"deliver_policy": "all", "replay_policy": "instant", "num_replicas": 0, "max_deliver": -1, "max_waiting": 512}


def _stream(**fields: Any) -> StreamConfig:
    return check_stream_config(StreamConfig.model_validate({"name": "S", "subjects": ["s.>"], **fields}))


def _check(
    body: dict[str, Any],
    stream: StreamConfig | None = None,
    *,
    existing: tuple[dict[str, Any], ...] = (),
    pedantic: bool = False,
) -> ConsumerConfig:
    config = parse_consumer_config(body)
    stream = stream or _stream()
    others = [_existing(o, stream) for o in existing]
    return check_consumer_config(
        config, stream, ephemeral=not config.durable_name, existing_consumers=others, pedantic=pedantic
    )


def _existing(body: dict[str, Any], stream: StreamConfig) -> ConsumerConfig:
    return check_consumer_config(ConsumerConfig(**body), stream, ephemeral=False, existing_consumers=[])


def _refused(body: dict[str, Any], err_code: int, stream: StreamConfig | None = None, **kwargs: Any) -> JetStreamError:
    with pytest.raises(JetStreamError) as caught:
        _check(body, stream, **kwargs)
    assert caught.value.err_code == err_code, caught.value.description
    assert caught.value.code == 400
    return caught.value


# Defaults, field for field.


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, {"ack_policy": "none", "inactive_threshold": 5 * S}),
        (D, NONE_D),
        (
            D | {"ack_policy": "explicit"},
            {"ack_policy": "explicit", "durable_name": "D", "name": "D", "ack_wait": 30 * S, "max_ack_pending": 1000},
        ),
        (
            {"name": "N", "ack_policy": "explicit"},
            {"ack_policy": "explicit", "name": "N", "ack_wait": 30 * S, "max_ack_pending": 1000}
            | {"inactive_threshold": 5 * S},
        ),
        (
            D | {"ack_policy": "all"},
            {"ack_policy": "all", "durable_name": "D", "name": "D", "ack_wait": 30 * S, "max_ack_pending": 1000},
        ),
        (
            D | {"ack_policy": "explicit", "backoff": [S, 2 * S], "max_deliver": 3},
            {"ack_policy": "explicit", "durable_name": "D", "name": "D", "ack_wait": S, "backoff": [S, 2 * S]}
            | {"max_ack_pending": 1000, "max_deliver": 3},
        ),
        (
            D | {"ack_policy": "explicit", "backoff": [S, 2 * S], "max_deliver": 2},
            {"ack_policy": "explicit", "durable_name": "D", "name": "D", "ack_wait": S, "backoff": [S, 2 * S]}
            | {"max_ack_pending": 1000, "max_deliver": 2},
        ),
        (
            D | {"backoff": [S]},
            NONE_D | {"ack_wait": S, "backoff": [S]},
        ),
        (D | {"ack_wait": 5 * S}, NONE_D | {"ack_wait": 5 * S}),
        (
            D | {"max_ack_pending": 5},
            NONE_D | {"max_ack_pending": 5},
        ),
        (
            D | {"ack_policy": "explicit", "max_ack_pending": -1},
            {"ack_policy": "explicit", "durable_name": "D", "name": "D", "ack_wait": 30 * S, "max_ack_pending": -1},
        ),
        (
            D | {"ack_policy": "explicit", "max_ack_pending": -5},
            {"ack_policy": "explicit", "durable_name": "D", "name": "D", "ack_wait": 30 * S, "max_ack_pending": -1},
        ),
        ({"inactive_threshold": 10 * S}, {"ack_policy": "none", "inactive_threshold": 10 * S}),
        ({"name": "E"}, {"ack_policy": "none", "name": "E", "inactive_threshold": 5 * S}),
        (D | {"num_replicas": 1}, NONE_D | {"num_replicas": 1}),
        (D | {"mem_storage": True}, NONE_D | {"mem_storage": True}),
        (
            D | {"sample_freq": "50%"},
            NONE_D | {"sample_freq": "50%"},
        ),
        (
            D | {"deliver_policy": "by_start_time", "opt_start_time": "2024-01-01T00:00:00.123456789+02:00"},
            NONE_D | {"deliver_policy": "by_start_time"}
            | {"opt_start_time": "2024-01-01T00:00:00.123456789+02:00"},
        ),
        (
            D | {"headers_only": True, "max_batch": 5, "max_bytes": 100, "max_expires": 5 * S},
            NONE_D | {"headers_only": True, "max_batch": 5}
            | {"max_bytes": 100, "max_expires": 5 * S},
        ),
        (
            D | {"priority_policy": "pinned_client", "priority_groups": ["a"]},
            NONE_D | {"priority_groups": ["a"]}
            | {"priority_policy": "pinned_client", "priority_timeout": 120 * S},
        ),
        (
            D | {"priority_policy": "prioritized", "priority_groups": ["a"]},
            NONE_D | {"priority_groups": ["a"], "priority_policy": "prioritized"},
        ),
        (
            D | {"deliver_group": "g", "filter_subjects": ["s.*.a", "s.a.*"]},
            NONE_D | {"deliver_group": "g"}
            | {"filter_subjects": ["s.*.a", "s.a.*"]},
        ),
    ],
)
def test_defaults_match_nats_server(body: dict[str, Any], expected: dict[str, Any]) -> None:
    assert _check(body).to_json() == BASE | expected


@pytest.mark.parametrize(
    "field",
    ["max_deliver", "max_waiting", "max_batch", "max_expires", "max_bytes", "idle_heartbeat", "inactive_threshold"],
)
def test_negative_values_are_corrected_as_nats_server_does(field: str) -> None:
    value = -5 if field == "max_deliver" else -1
    assert _check(D | {field: value}).to_json() == BASE | {
        "ack_policy": "none",
        "durable_name": "D",
        "name": "D",
    }


def test_stream_consumer_limits_fill_max_ack_pending_and_inactive_threshold() -> None:
    stream = _stream(consumer_limits={"max_ack_pending": 50, "inactive_threshold": 3 * S})
    limited = {"inactive_threshold": 3 * S, "max_ack_pending": 50}
    assert _check(D, stream).to_json() == BASE | limited | {
        "ack_policy": "none",
        "durable_name": "D",
        "name": "D",
    }
    explicit = {"ack_policy": "explicit", "ack_wait": 30 * S}
    assert _check({"ack_policy": "explicit"}, stream).to_json() == BASE | limited | explicit
    unlimited = _check(D | {"ack_policy": "explicit", "max_ack_pending": -1}, stream)
    assert unlimited.max_ack_pending == -1


def test_the_caller_decides_ephemeral() -> None:
    stream = _stream()
    durable = check_consumer_config(ConsumerConfig(name="N"), stream, ephemeral=False, existing_consumers=[])
    assert durable.inactive_threshold == 0
    ephemeral = check_consumer_config(ConsumerConfig(name="N"), stream, ephemeral=True, existing_consumers=[])
    assert ephemeral.inactive_threshold == 5 * S


def test_server_metadata_is_dropped_and_the_input_is_not_changed() -> None:
    config = parse_consumer_config(D | {"metadata": {"_nats.ver": "2.15.1", "team": "a"}})
    checked = check_consumer_config(config, _stream(), ephemeral=False, existing_consumers=[])
    assert checked.metadata == {"team": "a"}
    assert config.metadata == {"_nats.ver": "2.15.1", "team": "a"}
    assert config.max_deliver == 0


def test_a_stream_without_subjects_takes_filters_on_its_name() -> None:
    stream = check_stream_config(StreamConfig(name="ORDERS"))
    assert filters(_check(D | {"filter_subject": "ORDERS"}, stream)) == ["ORDERS"]


# Refusals, each with its err_code.

LONG = "n" * 256


@pytest.mark.parametrize(
    ("body", "err_code", "description"),
    [
        ({"durable_name": "A", "name": "B"}, 10132, "Consumer Durable and Name have to be equal if both are provided"),
        ({"durable_name": "a.b"}, 10103, "durable name can not contain '.', '*', '>'"),
        ({"durable_name": "a*"}, 10103, None),
        ({"durable_name": "a b"}, 10103, None),
        ({"name": "a.b"}, 10052, "consumer name can not contain '.', '*', '>', '\\', '/'"),
        ({"name": "a/b"}, 10127, "Consumer name can not contain path separators"),
        ({"durable_name": "a\\b"}, 10127, None),
        ({"name": LONG}, 10102, "consumer name is too long, maximum allowed is 255"),
        ({"durable_name": LONG}, 10102, None),
        (D | {"description": "d" * 4097}, 10107, "consumer description is too long, maximum allowed is 4096"),
        (D | {"metadata": {"k": "m" * 128 * 1024}}, 10135, "consumer metadata exceeds maximum size of 128KB"),
        (
            D | {"deliver_policy": "by_start_sequence"},
            10094,
            "consumer delivery policy is deliver by start sequence, but optional start sequence is not set",
        ),
        (
            D | {"deliver_policy": "by_start_time"},
            10094,
            "consumer delivery policy is deliver by start time, but optional start time is not set",
        ),
        (
            D | {"opt_start_seq": 5},
            10094,
            "consumer delivery policy is deliver all, but optional start sequence is also set",
        ),
        (
            D | {"opt_start_time": "2024-01-01T00:00:00Z"},
            10094,
            "consumer delivery policy is deliver all, but optional start time is also set",
        ),
        (
            D | {"deliver_policy": "last", "opt_start_seq": 5},
            10094,
            "consumer delivery policy is deliver last, but optional start sequence is also set",
        ),
        (
            D | {"deliver_policy": "new", "opt_start_time": "2024-01-01T00:00:00Z"},
            10094,
            "consumer delivery policy is deliver new, but optional start time is also set",
        ),
        (
            D | {"deliver_policy": "last_per_subject"},
            10094,
            "consumer delivery policy is deliver last per subject, but optional filter subject is not set",
        ),
        (
            D | {"deliver_policy": "last_per_subject", "opt_start_seq": 3, "filter_subject": "s.a"},
            10094,
            "consumer delivery policy is deliver last per subject, but optional start sequence is also set",
        ),
        (
            D | {"deliver_policy": "by_start_sequence", "opt_start_seq": 3}
            | {"opt_start_time": "2024-01-01T00:00:00Z"},
            10094,
            "consumer delivery policy is deliver by start sequence, but optional start time is also set",
        ),
        (
            D | {"deliver_policy": "by_start_time", "opt_start_seq": 3}
            | {"opt_start_time": "2024-01-01T00:00:00Z"},
            10094,
            "consumer delivery policy is deliver by start time, but optional start start sequence is also set",
        ),
        (
            D | {"filter_subject": "s.a", "filter_subjects": ["s.b"]},
            10136,
            "consumer cannot have both FilterSubject and FilterSubjects specified",
        ),
        (D | {"filter_subjects": ["s.a", ""]}, 10139, "consumer filter in FilterSubjects cannot be empty"),
        (D | {"filter_subject": "s..a"}, 10052, "invalid subject"),
        (D | {"filter_subjects": ["s.>.a"]}, 10052, "invalid subject"),
        (D | {"filter_subjects": ["s.a", "s.*"]}, 10138, "consumer subject filters cannot overlap"),
        (D | {"filter_subjects": ["s.a", "s.a"]}, 10138, None),
        (
            D | {"filter_subject": "other.x"},
            10093,
            "consumer filter subject is not a valid subset of the interest subjects",
        ),
        (D | {"filter_subjects": ["s.a", "t.>"]}, 10093, None),
        (
            D | {"ack_policy": "explicit", "backoff": [S, 2 * S], "max_deliver": 1},
            10116,
            "max deliver is required to be > length of backoff values",
        ),
        (D | {"ack_policy": "explicit", "ack_wait": -1}, 10183, "consumer ack wait needs to be positive"),
        (D | {"ack_policy": "explicit", "backoff": [-1]}, 10184, "consumer backoff needs to be positive"),
        (D | {"backoff": [S, -1]}, 10184, None),
        (D | {"max_expires": 1000}, 10115, "consumer max request expires needs to be >= 1ms"),
        (D | {"idle_heartbeat": S}, 10088, "consumer idle heartbeat requires a push based consumer"),
        (D | {"flow_control": True}, 10089, "consumer flow control requires a push based consumer"),
        (D | {"flow_control": True, "idle_heartbeat": S}, 10088, None),
        (D | {"rate_limit_bps": 100}, 10086, "consumer in pull mode can not have rate limit set"),
        (D | {"ack_policy": "flow_control"}, 10218, "flow control ack policy requires a push based consumer"),
        ({"direct": True}, 10090, "consumer direct requires a push based consumer"),
        (
            D | {"sample_freq": "abc"},
            10095,
            'failed to parse consumer sampling configuration: strconv.Atoi: parsing "abc": invalid syntax',
        ),
        (D | {"sample_freq": "-1"}, 10095, None),
        (D | {"num_replicas": -1}, 10133, "replicas count cannot be negative"),
        (D | {"num_replicas": 2}, 10074, "replicas > 1 not supported in non-clustered mode"),
        (
            D | {"priority_policy": "overflow"},
            10159,
            "Setting PriorityPolicy requires at least one PriorityGroup to be set",
        ),
        (
            D | {"priority_policy": "overflow", "priority_groups": [""]},
            10161,
            "Group name cannot be an empty string",
        ),
        (D | {"priority_policy": "overflow", "priority_groups": ["abcdefghijklmnopq"]}, 10162, None),
        (D | {"priority_policy": "overflow", "priority_groups": ["a.b"]}, 10162, None),
        (
            D | {"priority_groups": ["a"]},
            10196,
            "consumer can not have priority groups when policy is none",
        ),
        (D | {"priority_timeout": S}, 10197, "PinnedTTL cannot be set when PriorityPolicy is none"),
        (D | {"deliver_subject": "x.*"}, 10079, "consumer deliver subject has wildcards"),
        (D | {"deliver_subject": "s.x"}, 10081, "consumer deliver subject forms a cycle"),
        (D | {"deliver_subject": "x..y"}, 10112, "invalid push consumer deliver subject"),
        (D | {"deliver_subject": "x.y", "max_waiting": 5}, 10080, "consumer in push mode can not set max waiting"),
        (D | {"deliver_subject": "x.y", "max_ack_pending": 5}, 10082, "consumer requires ack policy for max ack pending"),
        (D | {"deliver_subject": "x.y", "idle_heartbeat": 1000}, 10083, "consumer idle heartbeat needs to be >= 100ms"),
        (D | {"deliver_subject": "x.y", "flow_control": True}, 10108, "consumer with flow control also needs heartbeats"),
        (D | {"sourcing": True}, 10052, None),
    ],
)
def test_refusals_carry_nats_server_err_codes(body: dict[str, Any], err_code: int, description: str | None) -> None:
    error = _refused(body, err_code)
    if description is not None:
        assert error.description == description


def test_a_push_consumer_has_no_max_waiting_and_keeps_its_heartbeat_and_flow_control() -> None:
    config = _check(D | {"deliver_subject": "x.y", "idle_heartbeat": 5 * S, "flow_control": True})
    assert (config.max_waiting, config.idle_heartbeat, config.flow_control) == (0, 5 * S, True)


def test_ack_none_with_max_ack_pending_is_accepted_on_a_pull_consumer() -> None:
    assert _check(D | {"max_ack_pending": 5}).max_ack_pending == 5


def test_stream_consumer_limits_cap_max_ack_pending_and_inactive_threshold() -> None:
    stream = _stream(consumer_limits={"max_ack_pending": 50, "inactive_threshold": 3 * S})
    error = _refused(D | {"ack_policy": "explicit", "max_ack_pending": 51}, 10121, stream)
    assert error.description == "consumer max ack pending exceeds system limit of 50"
    error = _refused(D | {"inactive_threshold": 4 * S}, 10153, stream)
    assert error.description == "consumer inactive threshold exceeds system limit of 3s"
    _check(D | {"ack_policy": "explicit", "max_ack_pending": 50, "inactive_threshold": 3 * S}, stream)


# Work-queue streams.


def _work_queue() -> StreamConfig:
    return _stream(retention="workqueue")


def test_work_queue_consumers_need_explicit_ack_and_deliver_all() -> None:
    wq = _work_queue()
    error = _refused(D, 10084, wq)
    assert error.description == "consumer in pull mode requires explicit ack policy on workqueue stream"
    assert _refused(D | {"ack_policy": "all"}, 10098, wq).description == (
        "workqueue stream requires explicit ack"
    )
    assert _refused(D | {"ack_policy": "explicit", "deliver_policy": "last"}, 10101, wq).description == (
        "consumer must be deliver all on workqueue stream"
    )
    assert _check(D | {"ack_policy": "explicit"}, wq).ack_policy == "explicit"


def test_work_queue_consumers_must_partition_the_subjects() -> None:
    wq = _work_queue()
    unfiltered = {"durable_name": "P", "ack_policy": "explicit"}
    error = _refused(D | {"ack_policy": "explicit"}, 10099, wq, existing=(unfiltered,))
    assert error.description == "multiple non-filtered consumers not allowed on workqueue stream"
    error = _refused(D | {"ack_policy": "explicit", "filter_subject": "s.a"}, 10100, wq, existing=(unfiltered,))
    assert error.description == "filtered consumer not unique on workqueue stream"
    wide = {"durable_name": "P", "ack_policy": "explicit", "filter_subject": "s.*"}
    _refused(D | {"ack_policy": "explicit", "filter_subjects": ["s.a"]}, 10100, wq, existing=(wide,))
    crossing = {"durable_name": "P", "ack_policy": "explicit", "filter_subject": "s.*.a"}
    _refused(D | {"ack_policy": "explicit", "filter_subject": "s.a.*"}, 10100, wq, existing=(crossing,))
    disjoint = _check(D | {"ack_policy": "explicit", "filter_subjects": ["s.b"]}, wq, existing=(crossing,))
    assert filters(disjoint) == ["s.b"]


def test_a_work_queue_update_is_not_checked_against_itself() -> None:
    wq = _work_queue()
    before = {"durable_name": "P", "ack_policy": "explicit", "filter_subject": "s.a"}
    after = _check({"durable_name": "P", "ack_policy": "explicit", "filter_subject": "s.>"}, wq, existing=(before,))
    assert after.filter_subject == "s.>"


def test_other_retentions_allow_any_consumers() -> None:
    unfiltered = {"durable_name": "P"}
    for retention in ("limits", "interest"):
        assert _check(D, _stream(retention=retention), existing=(unfiltered,)).name == "D"


# Pedantic mode.


@pytest.mark.parametrize(
    ("body", "stream_fields", "description"),
    [
        (D | {"max_deliver": -2}, {}, "pedantic mode: max_deliver must be set to -1"),
        (D | {"max_waiting": -1}, {}, "pedantic mode: max_waiting must not be negative"),
        (D | {"max_ack_pending": -2}, {}, "pedantic mode: max_ack_pending must be set to -1"),
        (D | {"inactive_threshold": -1}, {}, "pedantic mode: inactive_threshold must not be negative"),
        (
            D | {"ack_policy": "explicit", "backoff": [S]},
            {},
            "pedantic mode: first backoff value has to equal batch AckWait",
        ),
        (
            D | {"ack_policy": "explicit"},
            {"consumer_limits": {"max_ack_pending": 50}},
            "pedantic mode: max_ack_pending must be set if it's configured in stream limits",
        ),
        (
            D | {"max_ack_pending": 5},
            {"consumer_limits": {"inactive_threshold": S}},
            "pedantic mode: inactive_threshold must be set if it's configured in stream limits",
        ),
    ],
)
def test_pedantic_mode_refuses_what_would_be_corrected(
    body: dict[str, Any], stream_fields: dict[str, Any], description: str
) -> None:
    error = _refused(body, 10157, _stream(**stream_fields), pedantic=True)
    assert error.description == description


def test_pedantic_mode_accepts_a_backoff_that_starts_at_ack_wait() -> None:
    body = D | {"ack_policy": "explicit", "ack_wait": S, "backoff": [S]}
    assert _check(body, pedantic=True).ack_wait == S


# Parsing.


@pytest.mark.parametrize(
    ("body", "err_code", "fragment"),
    [
        ([], 10025, "must be a JSON object"),
        (D | {"bogus": 1}, 10025, "unknown field 'bogus'"),
        ({"deliver_policy": "bogus"}, 10025, "'deliver_policy'"),
        ({"ack_policy": "bogus"}, 10025, "'ack_policy'"),
        ({"deliver_policy": "by_start_time", "opt_start_time": "yesterday"}, 10025, "'opt_start_time'"),
        ({"opt_start_time": "2024-01-01"}, 10025, "'opt_start_time'"),
        ({"pause_until": "2024-01-01 00:00:00"}, 10025, "'pause_until'"),
        ({"opt_start_seq": -1}, 10025, "'opt_start_seq'"),
        ({"ack_wait": 1.5}, 10025, "'ack_wait'"),
        ({"backoff": ["1s"]}, 10025, "'backoff.0'"),
    ],
)
def test_parse_refuses_what_is_not_a_consumer_config(body: Any, err_code: int, fragment: str) -> None:
    with pytest.raises(JetStreamError) as caught:
        parse_consumer_config(body)
    assert caught.value.err_code == err_code
    assert fragment in caught.value.description


def test_to_json_leaves_out_zero_values_as_nats_server_does() -> None:
    shown = {"deliver_policy": "all", "ack_policy": "none", "replay_policy": "instant", "num_replicas": 0}
    assert ConsumerConfig().to_json() == shown
    config = ConsumerConfig(durable_name="D", flow_control=False, metadata={}, filter_subjects=[])
    assert "metadata" not in config.to_json() and "flow_control" not in config.to_json()
    assert parse_consumer_config(config.to_json()) == ConsumerConfig(durable_name="D")


def test_filters() -> None:
    assert filters(ConsumerConfig()) == []
    assert filters(ConsumerConfig(filter_subject="a.b")) == ["a.b"]
    assert filters(ConsumerConfig(filter_subjects=["a.b", "c.>"])) == ["a.b", "c.>"]
    assert filters(ConsumerConfig(filter_subject="", filter_subjects=[])) == []


def test_helpers() -> None:
    assert rfc3339_ns("1970-01-01T00:00:01Z") == S
    assert rfc3339_ns("2024-01-01T02:00:00.123456789+02:00") == rfc3339_ns("2024-01-01T00:00:00.123456789Z")
    assert rfc3339_ns("1970-01-01T00:00:00.5z") == S // 2
    assert [go_duration(n) for n in (3 * S, 90 * S, 3600 * S, 1500 * 10**6, 250 * 10**6, 1500, 7)] == [
        "3s",
        "1m30s",
        "1h0m0s",
        "1.5s",
        "250ms",
        "1.5µs",
        "7ns",
    ]


def test_error_codes_keep_nats_numbers() -> None:
    assert int(ConsumerErrorCode.WQ_CONSUMER_NOT_UNIQUE) == 10100
    assert ConsumerErrorCode.NAME_TOO_LONG.error(max=255).to_dict() == {
        "code": 400,
        "err_code": 10102,
        "description": "consumer name is too long, maximum allowed is 255",
    }


# Updates.

OLD = {"durable_name": "P", "ack_policy": "explicit", "filter_subject": "s.a"}


def _update(changes: dict[str, Any], old: dict[str, Any] = OLD) -> None:
    new = {k: v for k, v in (old | changes).items() if v is not None}
    check_consumer_update(_check(old), _check(new))


@pytest.mark.parametrize(
    ("changes", "description"),
    [
        ({"deliver_policy": "new"}, "deliver policy can not be updated"),
        ({"deliver_policy": "by_start_sequence", "opt_start_seq": 5}, "deliver policy can not be updated"),
        ({"mem_storage": True}, "storage type can not be updated"),
        ({"ack_policy": "all"}, "ack policy can not be updated"),
        ({"replay_policy": "original"}, "replay policy can not be updated"),
        ({"max_waiting": 10}, "max waiting can not be updated"),
    ],
)
def test_update_refuses_what_may_not_change(changes: dict[str, Any], description: str) -> None:
    with pytest.raises(JetStreamError) as caught:
        _update(changes)
    assert (caught.value.err_code, caught.value.description) == (10012, description)


def test_update_refuses_a_new_start_sequence_or_time() -> None:
    by_seq = {"durable_name": "T", "deliver_policy": "by_start_sequence", "opt_start_seq": 5}
    with pytest.raises(JetStreamError, match="start sequence can not be updated"):
        _update({"opt_start_seq": 6}, by_seq)
    by_time = {"durable_name": "T", "deliver_policy": "by_start_time", "opt_start_time": "2024-01-01T00:00:00Z"}
    _update({"opt_start_time": "2024-01-01T02:00:00+02:00"}, by_time)
    with pytest.raises(JetStreamError, match="start time can not be updated") as caught:
        _update({"opt_start_time": "2024-01-02T00:00:00Z"}, by_time)
    assert caught.value.err_code == 10012


def test_update_refuses_push_and_heartbeat_changes() -> None:
    pull = ConsumerConfig(durable_name="U", max_waiting=512)
    push = ConsumerConfig(durable_name="U", deliver_subject="x.y")
    for old, new, text in (
        (pull, push, "can not update pull consumer to push based"),
        (push, pull, "can not update push consumer to pull based"),
        (push, push.model_copy(update={"idle_heartbeat": 5 * S}), "heart beats can not be updated"),
        (push, push.model_copy(update={"flow_control": True}), "flow control can not be updated"),
        (pull, pull.model_copy(update={"direct": True}), "direct can not be updated"),
        (pull, pull.model_copy(update={"sourcing": True}), "sourcing can not be updated"),
    ):
        with pytest.raises(JetStreamError) as caught:
            check_consumer_update(old, new)
        assert (caught.value.err_code, caught.value.description) == (10012, text)


def test_update_checks_backoff_against_max_deliver() -> None:
    old = _check(OLD)
    with pytest.raises(JetStreamError) as caught:
        check_consumer_update(old, old.model_copy(update={"backoff": [S, S], "max_deliver": 1}))
    assert caught.value.err_code == 10116


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"max_waiting": 512},
        {"ack_wait": 5 * S},
        {"max_ack_pending": 5},
        {"filter_subject": "s.b"},
        {"filter_subject": None, "filter_subjects": ["s.b", "s.c"]},
        {"description": "x"},
        {"headers_only": True},
        {"inactive_threshold": 60 * S},
        {"num_replicas": 1},
        {"max_batch": 5, "max_expires": 5 * S, "max_bytes": 5},
        {"sample_freq": "10"},
        {"priority_policy": "overflow", "priority_groups": ["a"]},
        {"pause_until": "2099-01-01T00:00:00Z"},
        {"metadata": {"a": "b"}},
        {"max_deliver": 3, "backoff": [S, 2 * S]},
    ],
)
def test_update_allows_the_rest(changes: dict[str, Any]) -> None:
    _update(changes)
