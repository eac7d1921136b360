"""JetStream's API errors: one hierarchy carrying nats-server's `err_code`.

Every failure the engine reports to a client is a `JetStreamError` with the HTTP-like `code`, the
JetStream `err_code` and a description, numbered as in nats-server's `errors.json`. The API renders
them in one place. Where nats-server answers 500 for what is really a client's mistake (an invalid
config, a refused rollup, a delete past the end), JetLake answers 400: a client's mistake is never a
5xx here. Counterpart: server/jetstream_errors_generated.go.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """nats-server's `error_code` numbers for the conditions JetLake reports."""

    NONE = 0  # what nats-server reports without a JetStream err_code: 401, 403 (it answers -ERR on the connection)
    ACCOUNT_RESOURCES_EXCEEDED = 10002
    BAD_REQUEST = 10003
    CLUSTER_NOT_AVAILABLE = 10008
    INSUFFICIENT_RESOURCES = 10023
    INVALID_JSON = 10025
    GENERAL = 10051
    MAXIMUM_CONSUMERS_LIMIT = 10026
    MAXIMUM_STREAMS_LIMIT = 10027
    MEMORY_RESOURCES_EXCEEDED = 10028
    NOT_ENABLED_FOR_ACCOUNT = 10039
    STORAGE_RESOURCES_EXCEEDED = 10047
    NO_MESSAGE_FOUND = 10037
    SEQUENCE_NOT_FOUND = 10043
    STREAM_INVALID_CONFIG = 10052
    STREAM_MESSAGE_EXCEEDS_MAXIMUM = 10054
    STREAM_MIRROR_NOT_UPDATABLE = 10055
    STREAM_MISMATCH = 10056
    STREAM_MSG_DELETE_FAILED = 10057
    STREAM_NAME_EXIST = 10058
    STREAM_NOT_FOUND = 10059
    STREAM_NOT_MATCH = 10060
    STREAM_SUBJECT_OVERLAP = 10065
    STREAM_WRONG_LAST_MSG_ID = 10070
    STREAM_WRONG_LAST_SEQUENCE = 10071
    STREAM_REPLICAS_NOT_SUPPORTED = 10074
    STREAM_STORE_FAILED = 10077
    STREAM_HEADER_EXCEEDS_MAXIMUM = 10097
    STREAM_SEALED = 10109
    STREAM_MAX_BYTES_REQUIRED = 10113
    CONSUMER_MAX_PENDING_ACK_EXCESS = 10121
    STREAM_MAX_STREAM_BYTES_EXCEEDED = 10122
    STREAM_PURGE_FAILED = 10110
    STREAM_ROLLUP_FAILED = 10111
    STREAM_NAME_CONTAINS_PATH_SEPARATORS = 10128
    REPLICAS_COUNT_CANNOT_BE_NEGATIVE = 10133
    PEDANTIC = 10157
    MESSAGE_TTL_INVALID = 10165
    MESSAGE_TTL_DISABLED = 10166
    STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_INVALID = 10193


class JetStreamError(Exception):
    """An error a client sees, in JetStream's ApiError shape.

    Args:
        code: the HTTP status.
        err_code: JetStream's `err_code`.
        description: the human text, as nats-server words it where it has one.
    """

    def __init__(self, code: int, err_code: int, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.err_code = int(err_code)
        self.description = description

    def to_dict(self) -> dict[str, object]:
        return {"code": self.code, "err_code": self.err_code, "description": self.description}


class StreamNotFoundError(JetStreamError):
    def __init__(self, description: str = "stream not found") -> None:
        super().__init__(404, ErrorCode.STREAM_NOT_FOUND, description)


class NoMessageFoundError(JetStreamError):
    def __init__(self) -> None:
        super().__init__(404, ErrorCode.NO_MESSAGE_FOUND, "no message found")


class WrongLastSequenceError(JetStreamError):
    def __init__(self, seq: int) -> None:
        super().__init__(400, ErrorCode.STREAM_WRONG_LAST_SEQUENCE, f"wrong last sequence: {seq}")


class UnavailableError(JetStreamError):
    """The gateway cannot serve the request now (shutting down, storage failed)."""

    def __init__(self, description: str) -> None:
        super().__init__(503, ErrorCode.INSUFFICIENT_RESOURCES, description)


def cluster_unavailable(detail: str) -> JetStreamError:
    """No gateway owning the stream answered in time (nats-server's JSClusterNotAvailErr)."""
    return JetStreamError(503, ErrorCode.CLUSTER_NOT_AVAILABLE, f"JetStream system temporarily unavailable: {detail}")


def bad_request(description: str = "bad request") -> JetStreamError:
    return JetStreamError(400, ErrorCode.BAD_REQUEST, description)


def invalid_json(detail: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.INVALID_JSON, f"invalid JSON: {detail}")


def invalid_config(detail: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_INVALID_CONFIG, detail)


def invalid_stream_name() -> JetStreamError:
    return invalid_config("stream name is required and can not contain '.', '*', '>', '\\', '/'")


def pedantic(detail: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.PEDANTIC, f"pedantic mode: {detail}")


def stream_name_exists() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_NAME_EXIST, "stream name already in use with a different configuration")


def subjects_overlap() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_SUBJECT_OVERLAP, "subjects overlap with an existing stream")


def name_has_path_separators() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_NAME_CONTAINS_PATH_SEPARATORS, "Stream name can not contain path separators")


def stream_mismatch() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_MISMATCH, "stream name in subject does not match request")


def no_stream_matches_subject() -> JetStreamError:
    return StreamNotFoundError("no stream matches subject")


def message_too_large() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_MESSAGE_EXCEEDS_MAXIMUM, "message size exceeds maximum allowed")


def header_too_large() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_HEADER_EXCEEDS_MAXIMUM, "header size exceeds maximum allowed of 64k")


def stream_not_match() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_NOT_MATCH, "expected stream does not match")


def wrong_last_msg_id(msg_id: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_WRONG_LAST_MSG_ID, f"wrong last msg ID: {msg_id}")


def expected_subject_alone() -> JetStreamError:
    return JetStreamError(
        400, ErrorCode.STREAM_EXPECTED_LAST_SEQ_PER_SUBJECT_INVALID, "missing sequence for expected last sequence per subject"
    )


def rollup_failed(detail: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_ROLLUP_FAILED, detail)


def store_failed(detail: str) -> JetStreamError:
    """Discard-new limits: JetStream keeps 503 for these."""
    return JetStreamError(503, ErrorCode.STREAM_STORE_FAILED, detail)


def sealed() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_SEALED, "invalid operation on sealed stream")


def purge_failed(detail: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_PURGE_FAILED, detail)


def msg_delete_failed(detail: str) -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_MSG_DELETE_FAILED, detail)


def sequence_not_found(seq: int) -> JetStreamError:
    return JetStreamError(400, ErrorCode.SEQUENCE_NOT_FOUND, f"sequence {seq} not found")


def replicas_not_supported() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_REPLICAS_NOT_SUPPORTED, "replicas > 1 not supported in non-clustered mode")


def replicas_negative() -> JetStreamError:
    return JetStreamError(400, ErrorCode.REPLICAS_COUNT_CANNOT_BE_NEGATIVE, "replicas count cannot be negative")


def mirror_not_updatable() -> JetStreamError:
    return JetStreamError(400, ErrorCode.STREAM_MIRROR_NOT_UPDATABLE, "stream mirror configuration can not be updated")


def ttl_invalid() -> JetStreamError:
    return JetStreamError(400, ErrorCode.MESSAGE_TTL_INVALID, "invalid per-message TTL")


def ttl_disabled() -> JetStreamError:
    return JetStreamError(400, ErrorCode.MESSAGE_TTL_DISABLED, "per-message TTL is disabled")


def ttl_not_supported() -> JetStreamError:
    return JetStreamError(400, ErrorCode.MESSAGE_TTL_DISABLED, "per-message TTL is not supported by JetLake")
