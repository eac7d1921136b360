"""The JetStream API's answers against the real nats-server: the same requests after the same set-up
get the same `type`, the same error (code, err_code, description) or the same status message.

Successful answers carry times and server details, so those are compared by the fields a client
reads; errors and statuses are compared whole."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import nats
import orjson
import pytest

from tests.gateway import Gateway
from tests.nats.conftest import NatsServer

S = {"name": "S", "subjects": ["s.>"], "storage": "file"}
PULL = {"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}}

SETUP: list[tuple[str, dict[str, Any] | bytes]] = [
    ("$JS.API.STREAM.CREATE.S", S),
    ("$JS.API.STREAM.CREATE.NODIRECT", {"name": "NODIRECT", "subjects": ["nd.>"]}),
    ("$JS.API.CONSUMER.CREATE.S.C", PULL),
    ("$JS.API.CONSUMER.CREATE.S.EMPTY.s.none", {"stream_name": "S", "config": {"name": "EMPTY", "filter_subject": "s.none", "ack_policy": "explicit"}}),
]

# (subject, body, what to compare: "error" = type and error; "code" = type, code and err_code (the
# engine words a JSON type error its own way); "status" = status message; a tuple of keys).
REQUESTS: list[tuple[str, dict[str, Any] | bytes, Any]] = [
    ("$JS.API.STREAM.INFO.NOPE", b"", "error"),
    ("$JS.API.STREAM.CREATE.X", {"name": "Y", "subjects": ["y"]}, "error"),
    ("$JS.API.STREAM.CREATE.S", S | {"max_msgs": 5}, "error"),
    ("$JS.API.STREAM.CREATE.Z", {"name": "Z", "subjects": ["s.x"]}, "error"),
    ("$JS.API.STREAM.CREATE.X", b"{", "error"),
    ("$JS.API.STREAM.CREATE.X", {"name": "X", "bogus": 1}, "code"),
    ("$JS.API.STREAM.CREATE.X", {"name": "X", "max_msgs": "ten"}, "code"),
    ("$JS.API.STREAM.CREATE.X", {"name": "X", "subjects": ["a..b"]}, "error"),
    ("$JS.API.STREAM.CREATE.X", {"name": "X", "retention": "workqueue", "subjects": ["x"], "max_age": 5}, "error"),
    ("$JS.API.STREAM.DELETE.S", {"x": 1}, "error"),
    ("$JS.API.NOPE", b"", "error"),
    ("$JS.API.STREAM.DELETE.NOPE", b"", "error"),
    ("$JS.API.STREAM.PURGE.NOPE", b"", "error"),
    ("$JS.API.STREAM.MSG.GET.S", {"seq": 99}, "error"),
    ("$JS.API.STREAM.MSG.GET.S", {"last_by_subj": "s.nothing"}, "error"),
    ("$JS.API.STREAM.MSG.DELETE.NOPE", {"seq": 1}, "error"),
    ("$JS.API.STREAM.NAMES", b"", ("type", "total", "offset", "limit", "streams")),
    ("$JS.API.STREAM.NAMES", {"subject": "s.a"}, ("type", "total", "streams")),
    ("$JS.API.STREAM.NAMES", {"subject": "other"}, ("type", "total", "streams")),
    ("$JS.API.STREAM.INFO.S", b"", ("type", "total", "offset", "limit")),
    ("$JS.API.CONSUMER.INFO.S.NOPE", b"", "error"),
    ("$JS.API.CONSUMER.INFO.NOPE.C", b"", "error"),
    ("$JS.API.CONSUMER.DELETE.S.NOPE", b"", "error"),
    ("$JS.API.CONSUMER.CREATE.S.F.s.a", {"stream_name": "S", "config": {"filter_subject": "s.b"}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.F.s.a", {"stream_name": "S", "config": {"filter_subjects": ["s.a"]}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.F", {"stream_name": "S", "config": {"durable_name": "G"}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.F", {"stream_name": "T", "config": {}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S", {"stream_name": "S", "config": {"durable_name": "D"}}, "error"),
    ("$JS.API.CONSUMER.DURABLE.CREATE.S.D", {"stream_name": "S", "config": {}}, "error"),
    ("$JS.API.CONSUMER.DURABLE.CREATE.S.D", {"stream_name": "S", "config": {"durable_name": "E"}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "none"}, "action": "create"}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.NEW", {"stream_name": "S", "config": {"name": "NEW"}, "action": "update"}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.P", {"stream_name": "S", "config": {"deliver_subject": "s.loop"}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.P", {"stream_name": "S", "config": {"deliver_subject": "out", "flow_control": True}}, "error"),
    ("$JS.API.CONSUMER.CREATE.S.Q", {"stream_name": "S", "config": {"bogus": 1}}, "code"),
    ("$JS.API.CONSUMER.CREATE.S.Q", {"stream_name": "S", "config": {"ack_policy": "sometimes"}}, "code"),
    ("$JS.API.CONSUMER.CREATE.S.Q", {"stream_name": "S"}, ("type", "stream_name", "name")),
    ("$JS.API.CONSUMER.NAMES.S", b"", ("type", "total", "offset", "limit", "consumers")),
    ("$JS.API.CONSUMER.MSG.NEXT.S.EMPTY", {"batch": 1, "no_wait": True}, "status"),
    ("$JS.API.CONSUMER.MSG.NEXT.S.EMPTY", {"batch": 3, "expires": 200_000_000}, "status"),
    ("$JS.API.CONSUMER.MSG.NEXT.S.EMPTY", {"batch": 1, "expires": 100, "idle_heartbeat": 1000}, "status"),
    ("$JS.API.CONSUMER.MSG.NEXT.S.EMPTY", b'{"batch":', "status"),
    ("$JS.API.CONSUMER.MSG.NEXT.S.NOPE", b"", "status"),
    ("$JS.API.DIRECT.GET.NODIRECT", {"seq": 1}, "status"),
    ("$JS.API.DIRECT.GET.S.s.missing", b"", "status"),
    ("$JS.API.DIRECT.GET.S", b"", "status"),
    ("$JS.API.DIRECT.GET.S", b"{", "status"),
    ("$JS.API.DIRECT.GET.S", {"seq": 99}, "status"),
]


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Any], list[Any]]]:
    root = tmp_path_factory.mktemp("jsapi")
    (root / "warehouse").mkdir()
    gateway = Gateway(root / "warehouse").start()
    server = NatsServer(root / "nats-store")
    try:
        yield asyncio.run(_ask(gateway.nats_url)), asyncio.run(_ask(server.url))
    finally:
        gateway.stop()
        server.stop()


async def _ask(url: str) -> list[Any]:
    nc = await nats.connect(url)
    try:
        for subject, body in SETUP:
            await nc.request(subject, _bytes(body), timeout=10)
        out = []
        for subject, body, _ in REQUESTS:
            try:
                msg = await nc.request(subject, _bytes(body), timeout=10)
                out.append((msg.data, dict(msg.headers or {})))
            except nats.errors.NoRespondersError:
                out.append("no responders")
            except nats.errors.TimeoutError:
                out.append("no answer")
        return out
    finally:
        await nc.close()


def _bytes(body: dict[str, Any] | bytes) -> bytes:
    return body if isinstance(body, bytes) else orjson.dumps(body)


@pytest.mark.parametrize("i", range(len(REQUESTS)), ids=[f"{s} {b!r:.40}" for s, b, _ in REQUESTS])
def test_same_answer_as_nats_server(answers: tuple[list[Any], list[Any]], i: int) -> None:
    ours, theirs = answers[0][i], answers[1][i]
    how = REQUESTS[i][2]
    if isinstance(theirs, str) or isinstance(ours, str):
        assert ours == theirs
        return
    if how == "status":
        assert (ours[0], ours[1]) == (theirs[0], theirs[1])
        return
    ours_json, theirs_json = orjson.loads(ours[0]), orjson.loads(theirs[0])
    if how in ("error", "code"):
        assert "error" in theirs_json, theirs_json
        if how == "code":
            for answer in (ours_json, theirs_json):
                del answer["error"]["description"]
        assert (ours_json["type"], ours_json["error"]) == (theirs_json["type"], theirs_json["error"])
    else:
        assert {k: ours_json.get(k) for k in how} == {k: theirs_json.get(k) for k in how}
