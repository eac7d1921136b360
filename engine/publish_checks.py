"""JetStream's per-message publish checks, in its order: sealed, expected stream, expected last
sequence / subject sequence, duplicate window, expected last msg id, TTL, rollup, size, the account's
quota, limits with discard new; then the message is stored and its rollup and limits applied. A
refused publish takes no sequence. Counterpart: server/stream.go's processJetStreamMsg.

A layer of engine/stream.py's `Stream`, above its limits (engine/stream_limits.py) and below the
publish path that hands it the messages that cannot skip the checks (engine/publisher.py)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine import errors, headers as hdr
from engine.accepted import Accepted
from engine.accounts.limits import account_resources_exceeded
from engine.dedup_window import DuplicateWindow
from engine.errors import JetStreamError
from engine.messages import InboundMessage, PubAck, PublishResult, message_size
from engine.store.base import StreamStore
from engine.stream_limits import StreamLimits
from engine.subjects import is_valid_subject


class Quota(Protocol):
    """The account's storage limit, as a publish sees it (the engine sums the account's streams)."""

    def exceeds(self, storage: str, size: int) -> bool: ...


class PublishChecks(StreamLimits):
    """The path of a message with headers, or of any message when the stream's settings leave the
    plain path closed (interest retention, discard new at its limits, an account quota)."""

    store: StreamStore
    max_payload: int
    quota: Quota | None
    last_msg_id: str | None
    _window: DuplicateWindow

    def _publish_one(self, msg: InboundMessage, now: int, acc: Accepted) -> PublishResult:
        try:
            return self._check_and_store(msg, now, acc)
        except JetStreamError as exc:
            return exc

    def _check_and_store(self, msg: InboundMessage, now: int, acc: Accepted) -> PubAck:
        c = self.config
        h = msg.headers
        if c.sealed:
            raise errors.sealed()
        if h:
            expected_stream = hdr.first(h, hdr.EXPECTED_STREAM)
            if expected_stream is not None and expected_stream != c.name:
                raise errors.stream_not_match()
        if h:
            self._check_expected_sequences(msg.subject, h)
        msg_id = hdr.first(h, hdr.MSG_ID) if h else None
        if msg_id:
            self._window.expire(now, c.duplicate_window)
            seen = self._window.ids.get(msg_id)
            if seen is not None:
                return PubAck(c.name, seen[0], duplicate=True)
        if h:
            expected_msg_id = hdr.first(h, hdr.EXPECTED_LAST_MSG_ID)
            if expected_msg_id is not None and expected_msg_id != (self.last_msg_id or ""):
                raise errors.wrong_last_msg_id(self.last_msg_id or "")
        if h and hdr.TTL in h:
            if not hdr.valid_ttl(hdr.first(h, hdr.TTL) or ""):
                raise errors.ttl_invalid()
            # `allow_msg_ttl` is accepted (nats.py sets it on every KV bucket) but no TTL is honoured yet.
            raise errors.ttl_not_supported() if c.allow_msg_ttl else errors.ttl_disabled()
        rollup = self._rollup(h) if h else None
        headers_size = hdr.wire_size(h)
        if headers_size > hdr.MAX_HEADERS_SIZE:
            raise errors.header_too_large()
        payload_size = headers_size + len(msg.data)
        if payload_size > self.max_payload or (c.max_msg_size >= 0 and payload_size > c.max_msg_size):
            raise errors.message_too_large()
        size = message_size(msg.subject, headers_size, len(msg.data))
        if self.quota is not None and self.quota.exceeds(c.storage, size):
            raise account_resources_exceeded()
        self._check_discard_new(msg.subject, size, rollup)

        seq = self.index.last_seq + 1
        ts = max(now, self.index.last_ts)
        self.index.append(seq, msg.subject, size, ts)
        acc.seqs.append(seq)
        acc.subjects.append(msg.subject)
        acc.ts.append(ts)
        acc.msg_ids.append(msg_id)
        acc.headers.append(h)
        acc.data.append(msg.data)
        acc.sizes.append(size)
        acc.partitions.append(self.store.partitioner(msg.subject))
        self.last_msg_id = msg_id
        if msg_id:
            self._window.remember(msg_id, seq, ts)
        if rollup == hdr.ROLLUP_SUBJECT:
            acc.remove("rollup", self._remove(self.index.live_seqs(msg.subject, stop=seq)))
        elif rollup == hdr.ROLLUP_ALL:
            acc.remove("rollup", self._remove_through(seq - 1)[1])
        self._enforce_limits(msg.subject, acc)
        if c.retention == "interest" and not any(x.matches(msg.subject) for x in self.consumers.values()):
            acc.remove("interest", self._remove(np.array([seq], np.int64)))
        return PubAck(c.name, seq)

    def _check_expected_sequences(self, subject: str, h: dict[str, list[str]]) -> None:
        expected_last = hdr.first(h, hdr.EXPECTED_LAST_SEQ)
        if expected_last is not None:
            if _parse_seq(expected_last) != self.index.last_seq:
                raise errors.WrongLastSequenceError(self.index.last_seq)
        expected_subject_seq = hdr.first(h, hdr.EXPECTED_LAST_SUBJECT_SEQ)
        check_subject = hdr.first(h, hdr.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT)
        if expected_subject_seq is not None:
            target = check_subject or subject
            if not is_valid_subject(target):
                raise errors.bad_request(f"invalid {hdr.EXPECTED_LAST_SUBJECT_SEQ_SUBJECT}")
            last = self.index.last_seq_for(target)
            if _parse_seq(expected_subject_seq) != last:
                raise errors.WrongLastSequenceError(last)
        elif check_subject is not None:
            raise errors.expected_subject_alone()

    def _rollup(self, h: dict[str, list[str]]) -> str | None:
        value = hdr.first(h, hdr.ROLLUP)
        if value is None:
            return None
        if not self.config.allow_rollup_hdrs or self.config.deny_purge:
            raise errors.rollup_failed("rollup not permitted")
        if value not in (hdr.ROLLUP_SUBJECT, hdr.ROLLUP_ALL):
            raise errors.rollup_failed(f'rollup value invalid: "{value}"')
        return value

    def _check_discard_new(self, subject: str, size: int, rollup: str | None) -> None:
        c, ix = self.config, self.index
        if c.discard != "new":
            return
        if c.max_msgs > 0 and ix.msgs + 1 > c.max_msgs:
            raise errors.store_failed("maximum messages exceeded")
        if c.max_bytes > 0 and ix.bytes + size > c.max_bytes:
            raise errors.store_failed("maximum bytes exceeded")
        if c.discard_new_per_subject and c.max_msgs_per_subject > 0 and rollup is None:
            if ix.subject_state(subject)[0] + 1 > c.max_msgs_per_subject:
                raise errors.store_failed("maximum messages per subject exceeded")


def _parse_seq(value: str) -> int:
    """An expected sequence from a header; -1, which no sequence equals, when it is not a decimal number:
    nats-server's parseInt64 gives -1 too, so such a publish is refused as a wrong last sequence (10071)."""
    value = value.strip()
    return int(value) if value.isascii() and value.isdigit() else -1
