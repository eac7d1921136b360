"""The NATS door's fetcher on a real engine: consumer info waits for a threaded fetch's messages.

nats-server counts a message as delivered when it is in the client's write buffer, so a consumer
info on the same connection never answers `num_pending: 0` ahead of the messages it counts. nats.py's
KV watcher ends its initial values on that answer; a fetch that ran in a worker thread while the info
was answered on the loop made `kv.watch` and `kv.keys()` miss values under load (the CI failure of
tests/nats/test_nats_py.py::test_key_value). The stream lock held by another thread forces the fetch
into a worker thread, as a flush committing the stream does.
"""

from __future__ import annotations

import asyncio
import threading

from api.nats.fetcher import Fetcher
from engine import JetStream


def test_consumer_info_waits_until_a_threaded_fetch_has_been_sent(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    js.add_consumer("S", {"durable_name": "C"})
    js.publish_one("s.a", b"x")
    fetcher = Fetcher(js)
    stream = js.stream("S")
    held, release = threading.Event(), threading.Event()

    def hold_the_lock() -> None:
        with stream.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold_the_lock)
    holder.start()
    assert held.wait(10)

    async def scenario() -> list[str]:
        order: list[str] = []

        async def deliver() -> None:
            got = await fetcher.fetch("S", "C", 10, 0)
            order.append(f"sent {len(got)}")

        task = asyncio.get_running_loop().create_task(deliver())
        await asyncio.sleep(0)  # the fetch found the lock taken and went to a worker thread
        fetcher.after_delivery("S", "C", lambda: order.append(f"info pending {js.consumer_info('S', 'C')['num_pending']}"))
        assert order == []
        release.set()
        await asyncio.wait_for(task, 10)
        for _ in range(3):
            await asyncio.sleep(0)
        return order

    try:
        order = asyncio.run(scenario())
    finally:
        release.set()
        holder.join(10)
    assert order == ["sent 1", "info pending 0"]


def test_consumer_info_answers_at_once_when_no_fetch_runs(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    js.add_consumer("S", {"durable_name": "C"})
    js.publish_one("s.a", b"x")
    answered: list[int] = []
    Fetcher(js).after_delivery("S", "C", lambda: answered.append(js.consumer_info("S", "C")["num_pending"]))
    assert answered == [1]
