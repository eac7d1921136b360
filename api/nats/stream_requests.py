"""The JetStream API's stream requests: create, update, delete, info, names, list, purge, message get and delete.

Each maps a `$JS.API.STREAM.…` request onto one engine call and returns the answer's body (the
dispatch in api/nats/jsapi.py adds the response type, turns errors into nats-server's envelope and
runs the writing ones in a worker thread, so their advisories are sent on the loop afterwards).
Counterpart: server/jetstream_api.go (jsStream*Request).
"""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from api.nats import protocol as p
from api.nats.messages import is_count, lookup
from api.nats.request_parts import LIST_LIMIT, NAMES_LIMIT, expect_empty, page_offset, request_json, token
from engine import errors
from engine.info import rfc3339

if TYPE_CHECKING:
    from api.nats.advisories import Advisories
    from engine import JetStream


class StreamRequests:
    def __init__(self, engine: JetStream, advisories: Advisories) -> None:
        self.engine = engine
        self.advisories = advisories

    def create(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = token(tokens, 2)
        config = request_json(payload)
        if config.get("name") != name:
            raise errors.stream_mismatch()
        if "/" in name or "\\" in name:
            raise errors.name_has_path_separators()
        info, created = self.engine.add_stream(config)
        if created:
            self.advisories.later(lambda: self.advisories.stream_action(name, "create"))
        return {**info, "did_create": True} if created else info

    def update(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = token(tokens, 2)
        info = self.engine.update_stream(name, request_json(payload))
        self.advisories.later(lambda: self.advisories.stream_action(name, "modify"))
        return info

    def delete(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = token(tokens, 2)
        expect_empty(payload)
        self.engine.delete_stream(name)
        self.advisories.later(lambda: self.advisories.stream_action(name, "delete"))
        return {"success": True}

    def info(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = token(tokens, 2)
        req = request_json(payload, {"deleted_details", "subjects_filter", "offset"}) if payload.strip() else {}
        subjects_filter = req.get("subjects_filter") or None
        info = self.engine.stream_info(name, subjects_filter, page_offset(req) if subjects_filter else 0)
        return {"total": 0, "offset": 0, "limit": 0, **info}  # the engine pages the subjects as nats-server

    def names(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = request_json(payload, {"offset", "subject"}) if payload.strip() else {}
        page = self.engine.stream_names(req.get("subject") or None, page_offset(req), NAMES_LIMIT)
        return {"total": page["total"], "offset": page["offset"], "limit": NAMES_LIMIT, "streams": page["streams"] or None}

    def list_page(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = request_json(payload, {"offset", "subject"}) if payload.strip() else {}
        page = self.engine.list_streams(req.get("subject") or None, page_offset(req), LIST_LIMIT)
        return {"total": page["total"], "offset": page["offset"], "limit": LIST_LIMIT, "streams": page["streams"]}

    def purge(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = token(tokens, 2)
        req = request_json(payload, {"filter", "seq", "keep"}) if payload.strip() else {}
        filter_, seq, keep = req.get("filter") or None, req.get("seq", 0), req.get("keep", 0)
        if filter_ is not None and not isinstance(filter_, str):
            raise errors.invalid_json("purge filter must be a string")
        if not is_count(seq) or not is_count(keep):
            raise errors.invalid_json("purge seq and keep must be non-negative integers")
        return {"success": True, "purged": self.engine.purge(name, filter_, seq, keep)}

    def msg_get(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        stream = self.engine.stream(token(tokens, 3))
        if not payload.strip():
            raise errors.bad_request()
        req = request_json(payload, {"seq", "last_by_subj", "next_by_subj", "start_time", "no_hdr", "batch", "max_bytes", "multi_last", "up_to_seq", "up_to_time"})
        msg = lookup(stream, req)
        message: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
        if msg.headers and not req.get("no_hdr"):
            message["hdrs"] = base64.b64encode(p.encode_headers(msg.headers)).decode()
        if msg.data:
            message["data"] = base64.b64encode(msg.data).decode()
        message["time"] = rfc3339(msg.ts)
        return {"message": message}

    def msg_delete(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        name = token(tokens, 3)
        if not payload.strip():
            raise errors.bad_request()
        req = request_json(payload, {"seq", "no_erase"})
        seq = req.get("seq", 0)
        if not is_count(seq) or seq == 0:
            raise errors.bad_request("a message sequence must be a positive integer")
        self.engine.delete_message(name, seq, erase=not req.get("no_erase", False))
        return {"success": True}
