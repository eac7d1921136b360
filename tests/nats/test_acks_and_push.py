"""Acks and push delivery against the real nats-server: the same script gives the same transcript.

+NXT, double acks (`+ACK` with a reply), `-NAK {"delay": ns}`, `+TERM`, a pull's idle heartbeats and
`408 Request Timeout`, a push consumer's idle heartbeats and its flow-control requests, and a
deliver group — each step recorded as what a client sees (subject, data, status, the ack subject's
sequence tokens) and compared between JetLake and nats-server.
"""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import orjson
import pytest

from tests.gateway import Gateway
from tests.nats.conftest import NatsServer

MS = 1_000_000


def _seen(msg: Any) -> tuple[Any, ...]:
    """What a client reads of a message: subject, data, status, and the ack subject's counters."""
    status = (msg.headers or {}).get("Status"), (msg.headers or {}).get("Description")
    reply = msg.reply.split(".") if msg.reply and msg.reply.startswith("$JS.ACK.") else []
    counters = (reply[4], reply[5], reply[6], reply[8]) if len(reply) == 9 else ()  # delivered, sseq, cseq, pending
    extra = {k: v for k, v in (msg.headers or {}).items() if k.startswith("Nats-") and k not in ("Nats-Time-Stamp",)}
    return msg.subject if not msg.subject.startswith("_INBOX") else "inbox", msg.data, status, counters, extra


async def _script(url: str) -> list[Any]:
    nc = await nats.connect(url)
    out: list[Any] = []
    try:
        async def api(subject: str, body: dict[str, Any]) -> dict[str, Any]:
            return orjson.loads((await nc.request(subject, orjson.dumps(body), timeout=10)).data)

        await api("$JS.API.STREAM.CREATE.S", {"name": "S", "subjects": ["s.>"]})
        for i in range(4):
            await nc.request("s.a", b"m%d" % i, timeout=5)
        await api("$JS.API.CONSUMER.CREATE.S.C", {"stream_name": "S", "config": {"durable_name": "C", "ack_policy": "explicit"}})
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)

        async def pull(body: dict[str, Any]) -> None:
            await nc.publish("$JS.API.CONSUMER.MSG.NEXT.S.C", orjson.dumps(body), reply=inbox)

        async def receive() -> Any:
            msg = await sub.next_msg(timeout=5)
            out.append(_seen(msg))
            return msg

        await pull({"batch": 1})
        first = await receive()
        await nc.publish(first.reply, b"+NXT", reply=inbox)  # ack, and the next message to this inbox
        second = await receive()
        out.append(("double ack", (await nc.request(second.reply, b"+ACK", timeout=5)).data))
        await pull({"batch": 1})
        third = await receive()
        await nc.publish(third.reply, b'-NAK {"delay": %d}' % (300 * MS))
        await pull({"batch": 1})
        fourth = await receive()
        await nc.publish(fourth.reply, b"+TERM too old")
        await pull({"batch": 1, "expires": 2000 * MS})
        await receive()  # the nak'd message again, once its delay ran out
        await pull({"batch": 2, "expires": 500 * MS, "idle_heartbeat": 200 * MS})
        await receive()  # a heartbeat
        for _ in range(5):  # then the 408; how many more heartbeats fit before it is the scheduler's doing
            msg = await sub.next_msg(timeout=5)
            status = (msg.headers or {}).get("Status")
            if status == "100":
                continue
            out.append(_seen(msg))
            if status == "408":
                break
        info = await api("$JS.API.CONSUMER.INFO.S.C", {})
        out.append(("info", info["num_ack_pending"], info["num_redelivered"], info["delivered"]["consumer_seq"],
                    info["delivered"]["stream_seq"], info["ack_floor"]["stream_seq"]))

        deliver = nc.new_inbox()
        push = await nc.subscribe(deliver, queue="grp")
        await api("$JS.API.CONSUMER.CREATE.S.P", {"stream_name": "S", "config": {
            "durable_name": "P", "deliver_subject": deliver, "deliver_group": "grp", "ack_policy": "none",
            "idle_heartbeat": 200 * MS, "flow_control": True,
        }})
        for _ in range(4):
            msg = await push.next_msg(timeout=5)
            out.append(("push",) + _seen(msg)[1:])
        hb = await push.next_msg(timeout=5)
        out.append(("push heartbeat",) + _seen(hb)[1:])
    finally:
        await nc.close()
    return out


@pytest.mark.nats
def test_same_transcript_as_nats_server(gateway: Gateway, nats_server: NatsServer) -> None:
    ours = asyncio.run(_script(gateway.nats_url))
    theirs = asyncio.run(_script(nats_server.url))
    assert ours == theirs
