"""The JetStream API's consumer requests: create (the three subject forms), info, delete, unpin, names, list.

Each maps a `$JS.API.CONSUMER.…` request onto one engine call and returns the answer's body (the
dispatch in api/nats/jsapi.py adds the response type and the error envelope); a push consumer
created or updated here starts delivering on the loop. The subject's forms are checked against the
body as nats-server checks them, with its error codes. Counterpart: server/jetstream_api.go
(jsConsumer*Request).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from api.nats.errors import go_json_error
from api.nats.request_parts import LIST_LIMIT, NAMES_LIMIT, expect_empty, page_offset, request_json, token
from engine import errors

if TYPE_CHECKING:
    from api.nats.advisories import Advisories
    from api.nats.push import PushConsumers
    from api.nats.subscriptions import Router
    from engine import JetStream


class ConsumerRequests:
    def __init__(self, server: Router, engine: JetStream, advisories: Advisories, push: PushConsumers) -> None:
        self.server = server
        self.engine = engine
        self.advisories = advisories
        self.push = push

    def create(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = request_json(payload, {"stream_name", "config", "action", "pedantic"})
        config = req.get("config") or {}
        if not isinstance(config, dict):
            raise errors.invalid_json("json: cannot unmarshal into Go struct field CreateConsumerRequest.config")
        config = dict(config)
        durable = config.get("durable_name") or ""
        if tokens[1] == "DURABLE":  # CONSUMER.DURABLE.CREATE.<stream>.<durable>
            if len(tokens) != 5:
                raise errors.JetStreamError(400, 10016, "consumer expected to be durable but no durable name set in subject")
            stream, name = tokens[3], tokens[4]
            if not durable:
                raise errors.JetStreamError(400, 10018, "consumer expected to be durable but a durable name was not set")
            if durable != name:
                raise errors.JetStreamError(400, 10017, "consumer name in subject does not match durable name in request")
            filtered = ""
        elif len(tokens) == 3:  # legacy ephemeral: CONSUMER.CREATE.<stream>
            stream, name, filtered = tokens[2], config.get("name") or "", ""
            if durable:
                raise errors.JetStreamError(400, 10020, "consumer expected to be ephemeral but a durable name was set in request")
        else:  # CONSUMER.CREATE.<stream>.<consumer>[.<filter>]
            stream, name, filtered = tokens[2], tokens[3], ".".join(tokens[4:])
            if durable and durable != name:
                raise errors.JetStreamError(400, 10017, "consumer name in subject does not match durable name in request")
        if req.get("stream_name") != stream:
            raise errors.stream_mismatch()
        if "/" in name or "\\" in name:
            raise errors.JetStreamError(400, 10127, "Consumer name can not contain path separators")
        if name:
            config["name"] = name
        if filtered and config.get("filter_subjects"):
            raise errors.JetStreamError(400, 10137, "consumer with multiple subject filters cannot use subject based API")
        if filtered and config.get("filter_subject") != filtered:
            raise errors.JetStreamError(400, 10131, "Consumer create request did not match filtered subject from create subject")
        return self._create_or_update(stream, name, config, req.get("action") or "")

    def _create_or_update(self, stream: str, name: str, config: dict[str, Any], action: str) -> dict[str, Any]:
        if action not in ("", "create", "update"):
            raise errors.invalid_json(f"unknown consumer action {action!r}")
        target = self.engine.stream(stream)
        exists = bool(name) and name in target.consumers
        if action == "update" and not exists:
            raise errors.JetStreamError(400, 10149, "consumer does not exist")
        if exists and action != "create":
            info = self.engine.update_consumer(stream, name, config)
            created = False
        else:
            info, created = self.engine.add_consumer(stream, config)
        consumer = target.consumers.get(info["name"])
        if consumer is not None and consumer.config.deliver_subject:
            loop = self.server.loop
            if loop is not None:
                loop.call_soon_threadsafe(self.push.ensure, stream, consumer)
        if created:
            self.advisories.later(lambda: self.advisories.consumer_action(stream, info["name"], "create"))
        return info

    def info(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        expect_empty(payload)
        return self.engine.consumer_info(token(tokens, 2), token(tokens, 3))

    def delete(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        stream, name = token(tokens, 2), token(tokens, 3)
        expect_empty(payload)
        self.engine.delete_consumer(stream, name)
        self.advisories.later(lambda: self.advisories.consumer_action(stream, name, "delete"))
        return {"success": True}

    def unpin(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        """CONSUMER.UNPIN.<stream>.<consumer> `{"group": G}`: the request is checked before the
        consumer is looked up, as jsConsumerUnpinRequest checks it; the answer is the bare type."""
        stream, name = token(tokens, 2), token(tokens, 3)
        # on_unpin (JetStreamApi._unpinned) announces it and wakes the pulls it held back
        self.engine.consumers.unpin(self.engine.stream, stream, name, _unpin_group(payload))
        return {}

    def names(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = request_json(payload, {"offset"}) if payload.strip() else {}
        offset = page_offset(req)
        target = self.engine.stream(token(tokens, 2))
        names = sorted(target.consumers)
        return {"total": len(names), "offset": offset, "limit": NAMES_LIMIT, "consumers": names[offset : offset + NAMES_LIMIT]}

    def list_page(self, tokens: list[str], payload: bytes) -> dict[str, Any]:
        req = request_json(payload, {"offset"}) if payload.strip() else {}
        page = self.engine.list_consumers(token(tokens, 2), page_offset(req), LIST_LIMIT)
        return {"total": page["total"], "offset": page["offset"], "limit": LIST_LIMIT, "consumers": page["consumers"]}


def _unpin_group(payload: bytes) -> str:
    """JSApiConsumerUnpinRequest as Go's json.Unmarshal reads it (unknown fields ignored)."""
    try:
        req = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        raise errors.invalid_json(go_json_error(exc)) from None
    if not isinstance(req, dict):
        raise errors.invalid_json(f"json: cannot unmarshal {_go_type(req)} into Go value of type server.JSApiConsumerUnpinRequest")
    group = req.get("group")
    if group is not None and not isinstance(group, str):
        raise errors.invalid_json(f"json: cannot unmarshal {_go_type(group)} into Go struct field JSApiConsumerUnpinRequest.group of type string")
    return group or ""  # the engine checks the name


def _go_type(value: Any) -> str:
    """The JSON type's name in Go's unmarshal errors."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return {list: "array", dict: "object"}.get(type(value), "string")
