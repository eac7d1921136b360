"""`max_deliver` after naks, delayed naks and ack-wait expiry: JetLake against the real nats-server.

Both servers run the same script on a stream of their own: publish, pull, nak (or let the ack wait
run out), pull again, ... until a pull gets nothing, then a marker message is published, pulled and
acked. After every pull and every ack the consumer's figures are read (delivered, ack floor,
num_ack_pending, num_redelivered, num_pending), and the two servers' sequences of observations must
be equal: the same deliveries with the same delivery counts, the same figures at each step. States
are read only after a pull or an ack has been answered, never while a timer is running, so neither
side's timing can decide the outcome. Counterpart: server/consumer.go (processNak, getNextMsg,
checkPending, hasMaxDeliveries) and the consumer store's UpdateDelivered/UpdateAcks.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig

from tests.gateway import Gateway
from tests.nats_server import NatsServer

pytestmark = pytest.mark.nats

NS = 1_000_000_000
LONG_ACK_WAIT = 30 * NS  # nak scenarios: the ack wait never runs out during the script
SHORT_ACK_WAIT = NS // 2  # ack-wait scenarios
NAK_DELAY = 3 * NS // 10
_names = itertools.count(1)

Observation = tuple[str, list[tuple[int, int]], dict[str, Any]]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, NatsServer]]:
    root: Path = tmp_path_factory.mktemp("max-deliver")
    (root / "warehouse").mkdir()
    gateway = Gateway(root / "warehouse", "--flush-interval", "0.2").start()
    server = NatsServer(root / "nats").start()
    try:
        yield gateway, server
    finally:
        gateway.stop()
        server.stop()


class JetLakeSide:
    """The script's operations through the gateway's HTTP API."""

    def __init__(self, url: str) -> None:
        self.http = httpx.AsyncClient(base_url=url, timeout=30.0)
        self.stream = self.prefix = ""

    async def setup(self, stream: str, prefix: str, max_deliver: int, ack_wait: int) -> None:
        self.stream, self.prefix = stream, prefix
        created = await self.http.post("/v1/streams", json={"name": stream, "subjects": [f"{prefix}.>"]})
        assert created.status_code == 201, created.text
        config = {"durable_name": "C", "ack_policy": "explicit", "max_deliver": max_deliver, "ack_wait": ack_wait}
        made = await self.http.post(f"/v1/streams/{stream}/consumers", json=config)
        assert made.status_code == 201, made.text

    async def publish(self) -> int:
        answer = await self.http.post(f"/v1/publish/{self.prefix}.a", content=b"x")
        assert answer.status_code == 200, answer.text
        return int(answer.json()["seq"])

    async def pull(self, batch: int, expires: int) -> list[Any]:
        body = {"batch": batch, "expires": expires}
        answer = await self.http.post(f"/v1/streams/{self.stream}/consumers/C/next", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()["messages"]  # type: ignore[no-any-return]

    @staticmethod
    def seen(msg: Any) -> tuple[int, int]:
        return msg["seq"], msg["num_delivered"]

    async def answer(self, msg: Any, kind: str, delay: int = 0) -> None:
        item = {"token": msg["ack"], "type": kind} | ({"delay": delay} if delay else {})
        answer = await self.http.post(f"/v1/streams/{self.stream}/consumers/C/ack", json={"acks": [item]})
        assert answer.status_code == 200 and answer.json()["results"] == [{"ok": True}], answer.text

    async def figures(self) -> dict[str, Any]:
        info = await self.http.get(f"/v1/streams/{self.stream}/consumers/C")
        assert info.status_code == 200, info.text
        return _figures(info.json())

    async def close(self) -> None:
        await self.http.aclose()


class NatsSide:
    """The same operations with nats-py; acks are sent as requests, so each is applied when answered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stream = self.prefix = ""

    async def setup(self, stream: str, prefix: str, max_deliver: int, ack_wait: int) -> None:
        self.stream, self.prefix = stream, prefix
        self.nc = await nats.connect(self.url)
        self.js = self.nc.jetstream()
        await self.js.add_stream(name=stream, subjects=[f"{prefix}.>"])
        config = ConsumerConfig(
            durable_name="C", ack_policy=AckPolicy.EXPLICIT, max_deliver=max_deliver, ack_wait=ack_wait / NS
        )
        await self.js.add_consumer(stream, config)
        self.sub = await self.js.pull_subscribe_bind("C", stream)

    async def publish(self) -> int:
        return (await self.js.publish(f"{self.prefix}.a", b"x")).seq

    async def pull(self, batch: int, expires: int) -> list[Any]:
        try:
            return await self.sub.fetch(batch, timeout=expires / NS)
        except nats.errors.TimeoutError:
            return []

    @staticmethod
    def seen(msg: Msg) -> tuple[int, int]:
        return msg.metadata.sequence.stream, msg.metadata.num_delivered

    async def answer(self, msg: Msg, kind: str, delay: int = 0) -> None:
        payload = {"ack": b"+ACK", "nak": b"-NAK"}[kind] + (b' {"delay": %d}' % delay if delay else b"")
        await self.nc.request(msg.reply, payload, timeout=5)

    async def figures(self) -> dict[str, Any]:
        info = await self.js.consumer_info(self.stream, "C")
        return _figures({
            "delivered": {"consumer_seq": info.delivered.consumer_seq, "stream_seq": info.delivered.stream_seq},
            "ack_floor": {"consumer_seq": info.ack_floor.consumer_seq, "stream_seq": info.ack_floor.stream_seq},
            "num_ack_pending": info.num_ack_pending,
            "num_redelivered": info.num_redelivered,
            "num_pending": info.num_pending,
        })

    async def close(self) -> None:
        await self.nc.close()


def _figures(info: dict[str, Any]) -> dict[str, Any]:
    return {
        "delivered": (info["delivered"]["consumer_seq"], info["delivered"]["stream_seq"]),
        "ack_floor": (info["ack_floor"]["consumer_seq"], info["ack_floor"]["stream_seq"]),
        "num_ack_pending": info["num_ack_pending"],
        "num_redelivered": info["num_redelivered"],
        "num_pending": info["num_pending"],
    }


Side = JetLakeSide | NatsSide


async def _script(side: Side, mode: str, max_deliver: int) -> list[Observation]:
    """Redeliveries of message 1 until max_deliver ends them (message 2 rides along in `nak_two`)."""
    n = next(_names)
    ack_wait = SHORT_ACK_WAIT if mode == "ack_wait" else LONG_ACK_WAIT
    # Long enough for a redelivery that is due to arrive; nothing else arrives in the script.
    expires = {"nak": NS // 2, "nak_two": NS // 2, "nak_delay": NAK_DELAY + NS, "ack_wait": SHORT_ACK_WAIT + NS}[mode]
    await side.setup(f"MD{n}", f"md{n}", max_deliver, ack_wait)
    out: list[Observation] = []

    async def observe(label: str, msgs: list[Any]) -> None:
        out.append((label, [side.seen(m) for m in msgs], await side.figures()))

    await side.publish()
    if mode == "nak_two":
        await side.publish()
    msgs = await side.pull(2 if mode == "nak_two" else 1, expires)
    await observe("first pull", msgs)
    for attempt in range(max_deliver + 1):
        first = [m for m in msgs if side.seen(m)[0] == 1]
        if not first:
            break
        if mode in ("nak", "nak_two"):
            await side.answer(first[0], "nak")
            await observe(f"nak {attempt + 1}", [])
        elif mode == "nak_delay":
            await side.answer(first[0], "nak", NAK_DELAY)
            await observe(f"nak with delay {attempt + 1}", [])
        msgs = await side.pull(1, expires)
        await observe(f"pull {attempt + 2}", msgs)
    if mode == "nak_two":
        second = await side.pull(1, NS // 5)  # already delivered and pending: nothing to pull
        await observe("pull while 2 is pending", second)
    marker = await side.publish()
    msgs = await side.pull(1, expires)
    await observe("pull the marker", msgs)
    assert [side.seen(m)[0] for m in msgs] == [marker]
    await side.answer(msgs[0], "ack")
    await observe("ack the marker", [])
    return out


@pytest.mark.parametrize(
    ("mode", "max_deliver"),
    [("nak", 1), ("nak", 2), ("nak", 3), ("nak_delay", 2), ("nak_delay", 3),
     ("ack_wait", 1), ("ack_wait", 2), ("ack_wait", 3), ("nak_two", 2)],
)
def test_max_deliver_steps_match_nats_server(servers: tuple[Gateway, NatsServer], mode: str, max_deliver: int) -> None:
    gateway, server = servers

    async def both() -> tuple[list[Observation], list[Observation]]:
        ours, theirs = JetLakeSide(gateway.url), NatsSide(server.url)
        try:
            return await asyncio.gather(_script(ours, mode, max_deliver), _script(theirs, mode, max_deliver))
        finally:
            await ours.close()
            await theirs.close()

    jetlake, nats_server = asyncio.run(both())
    deliveries = [seen for _, got, _ in nats_server for seen in got if seen[0] == 1]
    assert len(deliveries) == max_deliver, f"nats-server delivered message 1 {len(deliveries)} times: {nats_server}"
    for step, (ours, theirs) in enumerate(zip(jetlake, nats_server, strict=False)):
        assert ours == theirs, f"step {step} differs from nats-server:\n  jetlake {ours}\n  nats    {theirs}"
    assert len(jetlake) == len(nats_server), (jetlake, nats_server)
