"""nats.py's JetStream, KV and object-store APIs against a real gateway, unchanged.

Streams, PubAcks (and their errors), pull consumers with every kind of ack, push and ordered
consumers, advisories, KV (put, get, create, update, history, keys, watch, delete, purge) and the
object store (put, get, list, delete, a multi-chunk object through flow control); and a pull consumer
that survives a kill -9 of the gateway: no acknowledged message is delivered again, no unacknowledged
one is lost.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, StreamConfig
from nats.js.errors import APIError, BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from tests.gateway import Gateway


def run(gateway: Gateway, scenario: Callable[[Any, Any], Awaitable[None]], timeout: float = 60) -> None:
    async def main() -> None:
        nc = await nats.connect(gateway.nats_url, max_reconnect_attempts=0)
        try:
            await asyncio.wait_for(scenario(nc, nc.jetstream()), timeout)
        finally:
            await nc.close()

    asyncio.run(main())


def test_streams_publish_and_puback_errors(gateway: Gateway) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        info = await js.add_stream(name="ORDERS", subjects=["orders.*"])
        assert info.config.name == "ORDERS" and info.state.messages == 0
        acks = [await js.publish("orders.us", b"US #%d" % i) for i in range(1, 11)]
        assert [(a.stream, a.seq) for a in acks] == [("ORDERS", i) for i in range(1, 11)]
        first = await js.publish("orders.eu", b"x", headers={"Nats-Msg-Id": "m-1"})
        again = await js.publish("orders.eu", b"y", headers={"Nats-Msg-Id": "m-1"})
        assert again.seq == first.seq == 11 and again.duplicate and not first.duplicate
        with pytest.raises(APIError) as wrong:
            await js.publish("orders.eu", b"z", headers={"Nats-Expected-Last-Sequence": "3"})
        assert (wrong.value.code, wrong.value.err_code, wrong.value.description) == (400, 10071, "wrong last sequence: 11")
        with pytest.raises(APIError) as mismatch:
            await js.publish("orders.eu", b"z", headers={"Nats-Expected-Stream": "OTHER"})
        assert mismatch.value.err_code == 10060
        info = await js.stream_info("ORDERS")
        assert (info.state.messages, info.state.last_seq) == (11, 11)
        assert await js.find_stream_name_by_subject("orders.us") == "ORDERS"
        with pytest.raises(NotFoundError):
            await js.stream_info("NOPE")
        names = await js.streams_info()
        assert [s.config.name for s in names] == ["ORDERS"]
        msg = await js.get_msg("ORDERS", seq=11)
        assert (msg.subject, msg.data, msg.headers) == ("orders.eu", b"x", {"Nats-Msg-Id": "m-1"})
        last = await js.get_last_msg("ORDERS", "orders.us")
        assert (last.seq, last.data) == (10, b"US #10")
        assert await js.delete_msg("ORDERS", 1)
        assert (await js.stream_info("ORDERS")).state.messages == 10
        assert await js.purge_stream("ORDERS", subject="orders.eu")
        assert (await js.stream_info("ORDERS")).state.messages == 9
        assert await js.delete_stream("ORDERS")
        with pytest.raises(NotFoundError):
            await js.stream_info("ORDERS")

    run(gateway, scenario)


def test_pull_consumer_acks_naks_terms_and_redeliveries(gateway: Gateway) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        await js.add_stream(name="WORK", subjects=["work.>"])
        for i in range(20):
            await js.publish("work.job", b"j%d" % i)
        sub = await js.pull_subscribe("work.>", durable="workers", config=ConsumerConfig(ack_wait=2, max_deliver=3))
        batch = await sub.fetch(5, timeout=5)
        assert [m.data for m in batch] == [b"j%d" % i for i in range(5)]
        assert batch[0].metadata.num_pending == 19 and batch[4].metadata.sequence.consumer == 5
        for m in batch:
            await m.ack_sync()
        rest = await sub.fetch(100, timeout=2)
        assert len(rest) == 15
        await rest[0].nak()
        await rest[1].term()
        await rest[2].in_progress()
        for m in rest[2:]:
            await m.ack_sync()
        again = await sub.fetch(5, timeout=5)
        assert [(m.data, m.metadata.num_delivered) for m in again] == [(b"j5", 2)]
        await again[0].ack_sync()
        info = await js.consumer_info("WORK", "workers")
        assert (info.num_ack_pending, info.num_pending, info.delivered.stream_seq, info.ack_floor.stream_seq) == (0, 0, 20, 20)
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=0.5)
        await js.publish("work.job", b"late")
        assert [m.data for m in await sub.fetch(1, timeout=5)] == [b"late"]
        assert [c.name for c in await js.consumers_info("WORK")] == ["workers"]
        assert await js.delete_consumer("WORK", "workers")
        with pytest.raises(NotFoundError):
            await js.consumer_info("WORK", "workers")

    run(gateway, scenario)


def test_push_and_ordered_consumers_and_advisories(gateway: Gateway) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        events: list[tuple[str, dict[str, Any]]] = []

        async def advisory(msg: Any) -> None:
            events.append((msg.subject, orjson.loads(msg.data)))

        await nc.subscribe("$JS.EVENT.ADVISORY.>", cb=advisory)
        await js.add_stream(name="PUSH", subjects=["push.>"])
        for i in range(30):
            await js.publish("push.a" if i % 2 else "push.b", b"%d" % i)
        got: list[bytes] = []
        done = asyncio.Event()

        async def on_msg(msg: Any) -> None:
            got.append(msg.data)
            await msg.ack()
            if len(got) == 30:
                done.set()

        sub = await js.subscribe("push.>", durable="pusher", cb=on_msg, manual_ack=True)
        await asyncio.wait_for(done.wait(), 10)
        assert got == [b"%d" % i for i in range(30)]
        await sub.unsubscribe()

        ordered = await js.subscribe("push.a", ordered_consumer=True)
        seen = [(await ordered.next_msg(timeout=5)).data for _ in range(15)]
        assert seen == [b"%d" % i for i in range(1, 30, 2)]
        await ordered.unsubscribe()

        dead = await js.pull_subscribe("push.b", durable="dead", config=ConsumerConfig(ack_wait=0.3, max_deliver=2))
        first = await dead.fetch(1, timeout=5)
        await first[0].term()
        for _ in range(2):
            assert len(await dead.fetch(1, timeout=5)) == 1  # delivered twice, never acked: max deliveries
        deadline = asyncio.get_running_loop().time() + 10
        while not any("MAX_DELIVERIES" in s for s, _ in events) and asyncio.get_running_loop().time() < deadline:
            try:
                await dead.fetch(1, timeout=0.5)
            except nats.errors.TimeoutError:
                pass
        await js.delete_consumer("PUSH", "dead")
        await nc.flush()
        deadline = asyncio.get_running_loop().time() + 10
        while not any("CONSUMER.DELETED" in s for s, _ in events) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        kinds = {subject.split(".")[3] + "." + subject.split(".")[4]: body for subject, body in events}
        assert kinds["STREAM.CREATED"]["type"] == "io.nats.jetstream.advisory.v1.stream_action"
        created = {body["consumer"] for subject, body in events if ".CONSUMER.CREATED." in subject}
        assert {"pusher", "dead"} <= created
        assert kinds["CONSUMER.MSG_TERMINATED"]["stream_seq"] == 1
        assert kinds["CONSUMER.MAX_DELIVERIES"]["type"] == "io.nats.jetstream.advisory.v1.max_deliver"
        assert kinds["CONSUMER.MAX_DELIVERIES"]["deliveries"] == 2
        assert kinds["CONSUMER.DELETED"]["consumer"] == "dead"

    run(gateway, scenario)


def test_key_value(gateway: Gateway) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        kv = await js.create_key_value(bucket="config", history=5)
        r1 = await kv.put("app.timeout", b"30s")
        r2 = await kv.put("app.timeout", b"45s")
        entry = await kv.get("app.timeout")
        assert (entry.value, entry.revision, entry.key) == (b"45s", r2, "app.timeout")
        assert (await kv.get("app.timeout", revision=r1)).value == b"30s"
        with pytest.raises(KeyWrongLastSequenceError):
            await kv.create("app.timeout", b"x")
        with pytest.raises(KeyWrongLastSequenceError):
            await kv.update("app.timeout", b"x", last=r1)
        r3 = await kv.update("app.timeout", b"60s", last=r2)
        await kv.create("app.retries", b"3")
        assert sorted(await kv.keys()) == ["app.retries", "app.timeout"]
        assert [e.value for e in await kv.history("app.timeout")] == [b"30s", b"45s", b"60s"]
        watcher = await kv.watch("app.*")
        initial = []
        async for update in watcher:
            if update is None:
                break
            initial.append((update.key, update.value))
        assert sorted(initial) == [("app.retries", b"3"), ("app.timeout", b"60s")]
        await kv.put("app.new", b"1")
        update = await watcher.updates(timeout=5)
        assert (update.key, update.value, update.revision) == ("app.new", b"1", r3 + 2)
        await watcher.stop()
        await kv.delete("app.retries")
        with pytest.raises(KeyNotFoundError):
            await kv.get("app.retries")
        await kv.purge("app.timeout")
        with pytest.raises(KeyNotFoundError):
            await kv.get("app.timeout")
        status = await kv.status()
        assert status.bucket == "config" and status.history == 5
        await js.delete_key_value("config")
        with pytest.raises(Exception):
            await js.key_value("config")

    run(gateway, scenario)


def test_object_store(gateway: Gateway) -> None:
    async def scenario(nc: Any, js: Any) -> None:
        obs = await js.create_object_store("media")
        data = os.urandom(3 * 1024 * 1024 + 17)  # 25 chunks of 128 KiB: flow control on the way out
        info = await obs.put("clip.bin", data)
        assert (info.size, info.chunks) == (len(data), 25)
        got = await obs.get("clip.bin")
        assert got.data == data and hashlib.sha256(got.data).digest() == hashlib.sha256(data).digest()
        await obs.put("small.txt", b"hello")
        assert sorted(o.name for o in await obs.list()) == ["clip.bin", "small.txt"]
        await obs.delete("small.txt")
        assert [o.name for o in await obs.list(ignore_deletes=True)] == ["clip.bin"]
        assert [(o.name, bool(o.deleted)) for o in await obs.list()] == [("clip.bin", False), ("small.txt", True)]
        replaced = await obs.put("clip.bin", b"v2")
        assert (await obs.get("clip.bin")).data == b"v2" and replaced.size == 2

    run(gateway, scenario, timeout=120)


def test_pull_consumer_survives_kill_9(gateway: Gateway) -> None:
    async def before(nc: Any, js: Any) -> None:
        await js.add_stream(StreamConfig(name="DURABLE", subjects=["durable.>"]))
        for i in range(100):
            ack = await js.publish("durable.job", b"%d" % i)
            assert ack.seq == i + 1
        sub = await js.pull_subscribe("durable.>", durable="worker", config=ConsumerConfig(ack_wait=2, ack_policy=AckPolicy.EXPLICIT))
        delivered = await sub.fetch(30, timeout=5)
        assert len(delivered) == 30
        for m in delivered[:20]:
            await m.ack_sync()  # answered: this ack must survive

    async def after(nc: Any, js: Any) -> None:
        assert (await js.stream_info("DURABLE")).state.messages == 100
        sub = await js.pull_subscribe("durable.>", durable="worker", stream="DURABLE")
        seen: list[int] = []
        while len(seen) < 80:
            try:
                batch = await sub.fetch(50, timeout=5)
            except nats.errors.TimeoutError:
                break
            for m in batch:
                seen.append(m.metadata.sequence.stream)
                await m.ack_sync()
        assert sorted(seen) == list(range(21, 101)), "acked ones came back, or unacked ones were lost"
        info = await js.consumer_info("DURABLE", "worker")
        assert (info.num_ack_pending, info.num_pending, info.ack_floor.stream_seq) == (0, 0, 100)

    run(gateway, before)
    gateway.kill9()
    gateway.start()
    run(gateway, after)
