"""Consumer fields over NATS beside nats-server: pull statuses at the limits, pacing, pause, ack metrics.

The same scenarios run against a real gateway and the real nats-server and must give the same
answers: `409 Exceeded MaxRequestBatch of N`, `409 Exceeded MaxRequestExpires of <dur>`, `409
Exceeded MaxRequestMaxBytes of N`, `409 Exceeded MaxWaiting` while another request waits (which
then ends with `408 Request Timeout`), and `408 Requests Pending` for a `no_wait` request whose
messages an earlier request already claims. A push or pull consumer with `replay_policy: original`
delivers with the gaps the messages were stored with, and one with `rate_limit_bps` no faster than
its bits per second (past a burst of one message of the stream's max_msg_size); `pause_until`
holds deliveries until then; a waiting pull hears `409 Server Shutdown` when the server stops; and
`sample_freq` publishes an ack's metric; priority groups (overflow, prioritized, pinned_client) pick
the request served, and `$JS.API.CONSUMER.UNPIN` drops a pin with nats-server's answers and errors
and the `$JS.EVENT.ADVISORY.CONSUMER.PINNED`/`UNPINNED` advisories (reason `admin`, or `timeout`
once `priority_timeout` passes). Pacing is checked as a lower bound on elapsed time, the
semantic itself; no upper bound is asserted.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import nats
import orjson
import pytest

from tests.gateway import Gateway
from tests.nats.conftest import NatsServer

NS = 1_000_000_000


async def _create(nc: Any, stream: str, config: dict[str, Any]) -> dict[str, Any]:
    name = config["durable_name"]
    body = orjson.dumps({"stream_name": stream, "config": config})
    reply = await nc.request(f"$JS.API.CONSUMER.CREATE.{stream}.{name}", body, timeout=10)
    answer = orjson.loads(reply.data)
    assert "error" not in answer, answer
    return answer


async def _pull_statuses(url: str) -> list[tuple[str, str]]:
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="P", subjects=["p.*"])
        for _ in range(3):
            await js.publish("p.x", b"x" * 10)
        await _create(nc, "P", {"durable_name": "LIM", "ack_policy": "explicit", "max_batch": 2,
                                "max_expires": NS, "max_bytes": 1000})
        await _create(nc, "P", {"durable_name": "W", "ack_policy": "explicit", "filter_subject": "p.none", "max_waiting": 1})
        await _create(nc, "P", {"durable_name": "RP", "ack_policy": "explicit", "max_ack_pending": 1})
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox + ".>")
        seen: list[tuple[str, str]] = []

        async def ask(consumer: str, request: dict[str, Any], token: str) -> None:
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.P.{consumer}", orjson.dumps(request), reply=f"{inbox}.{token}")

        async def status() -> tuple[str, str]:
            msg = await sub.next_msg(timeout=10)
            headers = msg.headers or {}
            return headers.get("Status", "message"), headers.get("Description", "")

        await ask("LIM", {"batch": 5}, "a")
        seen.append(await status())
        await ask("LIM", {"batch": 1, "expires": 5 * NS}, "b")
        seen.append(await status())
        await ask("LIM", {"batch": 1, "max_bytes": 5000}, "c")
        seen.append(await status())
        await ask("W", {"batch": 1, "expires": 6 * NS}, "d")  # waits: W's filter matches nothing
        await nc.flush()
        await ask("W", {"batch": 1, "expires": 1 * NS}, "e")
        seen.append(await status())  # the second one: max_waiting is 1 (d waits long enough on a loaded machine)
        seen.append(await status())  # the first one, once its 6 s are over
        await ask("RP", {"batch": 10, "expires": 3 * NS}, "f")  # one message, then held by max_ack_pending
        seen.append(await status())
        await ask("RP", {"batch": 1, "no_wait": True}, "g")
        seen.append(await status())
        return seen
    finally:
        await nc.close()


EXPECTED = [
    ("409", "Exceeded MaxRequestBatch of 2"),
    ("409", "Exceeded MaxRequestExpires of 1s"),
    ("409", "Exceeded MaxRequestMaxBytes of 1000"),
    ("409", "Exceeded MaxWaiting"),
    ("408", "Request Timeout"),
    ("message", ""),
    ("408", "Requests Pending"),
]


async def _pacing(url: str) -> tuple[float, float, float]:
    """(stored gap, delivered gap) under replay original, and seconds to push four ~900 B messages at 8000 bps."""
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="R", subjects=["r.*"], max_msg_size=1000)
        first = await js.publish("r.a", b"1")
        await asyncio.sleep(0.6)  # sets up the gap the replay must reproduce; the assertion reads the stored times
        second = await js.publish("r.a", b"2")
        stored = []
        for ack in (first, second):
            answer = await nc.request("$JS.API.STREAM.MSG.GET.R", orjson.dumps({"seq": ack.seq}), timeout=10)
            stored.append(_seconds(orjson.loads(answer.data)["message"]["time"]))
        gap = stored[1] - stored[0]
        inbox = nc.new_inbox()
        replay = await nc.subscribe(inbox)
        await nc.flush()
        await _create(nc, "R", {"durable_name": "REPLAY", "deliver_subject": inbox, "ack_policy": "none",
                                "replay_policy": "original", "filter_subject": "r.a"})
        await replay.next_msg(timeout=10)
        started = time.monotonic()
        await replay.next_msg(timeout=10)
        delivered_gap = time.monotonic() - started
        await _create(nc, "R", {"durable_name": "PULLREPLAY", "ack_policy": "explicit", "replay_policy": "original",
                                "filter_subject": "r.a"})
        pulled = await nc.subscribe(nc.new_inbox())
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.R.PULLREPLAY", orjson.dumps({"batch": 2, "expires": 5 * NS}), reply=pulled.subject)
        await pulled.next_msg(timeout=10)
        started = time.monotonic()
        await pulled.next_msg(timeout=10)
        delivered_gap = min(delivered_gap, time.monotonic() - started)  # a pull replays at the same pace
        for _ in range(4):
            await js.publish("r.b", b"z" * 900)
        inbox2 = nc.new_inbox()
        limited = await nc.subscribe(inbox2)
        await nc.flush()
        await _create(nc, "R", {"durable_name": "RATE", "deliver_subject": inbox2, "ack_policy": "none",
                                "rate_limit_bps": 8000, "filter_subject": "r.b"})
        await limited.next_msg(timeout=10)
        started = time.monotonic()
        for _ in range(3):
            await limited.next_msg(timeout=10)
        return gap, delivered_gap, time.monotonic() - started
    finally:
        await nc.close()


def _seconds(rfc3339: str) -> float:
    """An RFC 3339 time with nanoseconds (as both servers write it), in seconds since the epoch."""
    head, _, frac = rfc3339.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


@pytest.fixture(params=["jetlake", "nats-server"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "jetlake":
        server: Any = Gateway(tmp_path / "warehouse", "--flush-interval", "0.2").start(timeout=60)
        yield server.nats_url
    else:
        server = NatsServer(tmp_path / "ns")
        yield server.url
    server.stop()


def test_pull_statuses_at_the_consumer_limits(url: str) -> None:
    assert asyncio.run(asyncio.wait_for(_pull_statuses(url), 60)) == EXPECTED


def test_push_replay_original_and_rate_limit(url: str) -> None:
    gap, delivered_gap, limited = asyncio.run(asyncio.wait_for(_pacing(url), 60))
    assert gap >= 0.5
    assert delivered_gap >= gap * 0.9, (gap, delivered_gap)
    assert limited >= 3 * 0.9 * 0.9, limited  # three more messages of ~900 B at 1000 B/s after the first


async def _paused(url: str) -> tuple[bool, float]:
    """Whether a consumer created with `pause_until` 2 s ahead says it is paused, and how long its first message took."""
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="Z", subjects=["z.*"])
        await js.publish("z.a", b"held")
        until = datetime.fromtimestamp(time.time() + 2, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        created = await _create(nc, "Z", {"durable_name": "PAUSED", "ack_policy": "explicit", "pause_until": until})
        inbox = await nc.subscribe(nc.new_inbox())
        started = time.monotonic()
        await nc.publish("$JS.API.CONSUMER.MSG.NEXT.Z.PAUSED", orjson.dumps({"batch": 1, "expires": 8 * NS}), reply=inbox.subject)
        msg = await inbox.next_msg(timeout=10)
        assert msg.data == b"held", msg.headers
        return bool(created.get("paused")), time.monotonic() - started
    finally:
        await nc.close()


def test_pause_until_holds_deliveries(url: str) -> None:
    paused, waited = asyncio.run(asyncio.wait_for(_paused(url), 60))
    assert paused
    assert waited >= 1.0, waited  # created 2 s before the pause ends; the request came after the create


@pytest.mark.parametrize("target", ["jetlake", "nats-server"])
def test_a_waiting_pull_hears_the_server_shut_down(tmp_path: Path, target: str) -> None:
    server: Any = (
        Gateway(tmp_path / "warehouse").start(timeout=60) if target == "jetlake" else NatsServer(tmp_path / "ns")
    )
    url = server.nats_url if target == "jetlake" else server.url

    async def scenario() -> tuple[str, str]:
        nc = await nats.connect(url, max_reconnect_attempts=0, allow_reconnect=False)
        try:
            await nc.jetstream(timeout=10).add_stream(name="S", subjects=["s.*"])
            await _create(nc, "S", {"durable_name": "WAIT", "ack_policy": "explicit"})
            inbox = await nc.subscribe(nc.new_inbox())
            await nc.publish("$JS.API.CONSUMER.MSG.NEXT.S.WAIT", orjson.dumps({"batch": 3, "expires": 60 * NS}), reply=inbox.subject)
            await nc.flush()
            stopping = asyncio.get_running_loop().run_in_executor(None, server.stop)
            msg = await inbox.next_msg(timeout=30)
            await stopping
            headers = msg.headers or {}
            return headers.get("Status", ""), headers.get("Description", "")
        finally:
            await nc.close()

    try:
        assert asyncio.run(asyncio.wait_for(scenario(), 90)) == ("409", "Server Shutdown")
    finally:
        server.stop()


async def _ack_metric(url: str) -> dict[str, Any]:
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="M", subjects=["m.*"])
        await js.publish("m.a", b"sampled")
        await _create(nc, "M", {"durable_name": "SAMPLED", "ack_policy": "explicit", "sample_freq": "100%"})
        metrics = await nc.subscribe("$JS.EVENT.METRIC.CONSUMER.ACK.>")
        sub = await js.pull_subscribe_bind("SAMPLED", "M")
        [msg] = await sub.fetch(1, timeout=10)
        await msg.ack_sync()
        event = await metrics.next_msg(timeout=10)
        assert event.subject == "$JS.EVENT.METRIC.CONSUMER.ACK.M.SAMPLED"
        return orjson.loads(event.data)
    finally:
        await nc.close()


def test_sampled_acks_publish_their_metric(url: str) -> None:
    event = asyncio.run(asyncio.wait_for(_ack_metric(url), 60))
    assert event["type"] == "io.nats.jetstream.metric.v1.consumer_ack"
    assert {k: event[k] for k in ("stream", "consumer", "consumer_seq", "stream_seq", "deliveries")} == {
        "stream": "M", "consumer": "SAMPLED", "consumer_seq": 1, "stream_seq": 1, "deliveries": 1,
    }
    assert event["ack_time"] > 0


async def _priority_groups(url: str) -> list[tuple[str, str]]:
    """Pull requests against overflow, prioritized and pinned_client consumers: status or `message[+pin]`."""
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="G", subjects=["g.*"])
        for _ in range(4):
            await js.publish("g.a", b"x")
        for name, policy in (("OV", "overflow"), ("PIN", "pinned_client"), ("PRI", "prioritized")):
            await _create(nc, "G", {"durable_name": name, "ack_policy": "explicit", "priority_policy": policy, "priority_groups": ["A"]})
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox + ".>")
        seen: list[tuple[str, str]] = []
        pins: list[str] = []

        async def ask(consumer: str, request: dict[str, Any]) -> None:
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.G.{consumer}", orjson.dumps({"batch": 1, **request}), reply=f"{inbox}.{len(seen)}")
            msg = await sub.next_msg(timeout=10)
            headers = msg.headers or {}
            if "Status" in headers:
                seen.append((headers["Status"], headers.get("Description", "")))
            else:
                pin = headers.get("Nats-Pin-Id", "")
                if pin:
                    pins.append(pin)
                seen.append(("message", "pinned" if pin else ""))

        await ask("OV", {"no_wait": True})
        await ask("OV", {"no_wait": True, "group": "B"})
        await ask("OV", {"expires": NS, "group": "A", "min_pending": 5})
        await ask("OV", {"expires": 2 * NS, "group": "A", "min_pending": 4})
        await ask("OV", {"no_wait": True, "group": "A", "min_pending": 10})
        await ask("OV", {"no_wait": True, "group": "A", "min_ack_pending": 1})
        await ask("PRI", {"no_wait": True, "group": "A", "priority": 12})
        await ask("PRI", {"no_wait": True, "group": "A", "priority": 3})
        await ask("PIN", {"no_wait": True, "group": "A", "id": "bogus"})
        await ask("PIN", {"no_wait": True, "group": "A"})
        await ask("PIN", {"no_wait": True, "group": "A", "id": pins[0]})
        await ask("PIN", {"no_wait": True, "group": "A"})
        assert len(set(pins)) == 1, pins
        # prioritized: of two waiting requests, the lower number takes the next message
        await _create(nc, "G", {"durable_name": "PRI2", "ack_policy": "explicit", "priority_policy": "prioritized",
                                "priority_groups": ["A"], "filter_subject": "g.p"})
        waiting = {}
        for token, level in (("low", 5), ("high", 1)):
            waiting[token] = await nc.subscribe(nc.new_inbox())
            request = {"batch": 1, "expires": 3 * NS, "group": "A", "priority": level}
            await nc.publish("$JS.API.CONSUMER.MSG.NEXT.G.PRI2", orjson.dumps(request), reply=waiting[token].subject)
        await nc.flush()
        await js.publish("g.p", b"first")
        nexts = {asyncio.ensure_future(s.next_msg(timeout=10)): token for token, s in waiting.items()}
        done, pending = await asyncio.wait(nexts, return_when=asyncio.FIRST_COMPLETED)
        for future in pending:
            future.cancel()
        first = next(iter(done))
        seen.append(("message to", nexts[first] if not (first.result().headers or {}).get("Status") else "a status"))
        return seen
    finally:
        await nc.close()


def test_priority_groups(url: str) -> None:
    assert asyncio.run(asyncio.wait_for(_priority_groups(url), 60)) == [
        ("400", "Bad Request - Priority Group missing"),
        ("400", "Bad Request - Invalid Priority Group"),
        ("408", "Request Timeout"),  # overflow: min_pending 5 with 4 pending never takes one
        ("message", ""),
        ("404", "No Messages"),
        ("message", ""),  # min_ack_pending 1: one is pending its ack
        ("400", "Bad Request - Priority must be between 0 and 9"),
        ("message", ""),
        ("423", "Nats-Wrong-Pin-Id"),
        ("message", "pinned"),
        ("message", "pinned"),  # with the pin id
        ("404", "No Messages"),  # without it, while the pin holds
        ("message to", "high"),
    ]


async def _unpin(url: str) -> list[Any]:
    """The unpin API's answers (errors first, then a real unpin) and the pin advisories around it."""
    nc = await nats.connect(url, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="U", subjects=["u.*"])
        for _ in range(4):
            await js.publish("u.a", b"x")
        await _create(nc, "U", {"durable_name": "PIN", "ack_policy": "explicit", "priority_policy": "pinned_client",
                                "priority_groups": ["A"]})
        await _create(nc, "U", {"durable_name": "OV", "ack_policy": "explicit", "priority_policy": "overflow",
                                "priority_groups": ["A"]})
        await _create(nc, "U", {"durable_name": "TWO", "ack_policy": "explicit", "priority_policy": "pinned_client",
                                "priority_groups": ["A", "B"]})
        await _create(nc, "U", {"durable_name": "PLAIN", "ack_policy": "explicit"})
        await _create(nc, "U", {"durable_name": "LAPSE", "ack_policy": "explicit", "priority_policy": "pinned_client",
                                "priority_groups": ["A"], "priority_timeout": NS})
        advisories = await nc.subscribe("$JS.EVENT.ADVISORY.CONSUMER.*.U.*")  # after the creates: pins only
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox + ".>")
        seen: list[Any] = []
        pins: list[str] = []

        async def unpin(stream: str, consumer: str, body: bytes) -> None:
            answer = await nc.request(f"$JS.API.CONSUMER.UNPIN.{stream}.{consumer}", body, timeout=10)
            seen.append(orjson.loads(answer.data))

        async def pull(consumer: str, request: dict[str, Any]) -> None:
            body = orjson.dumps({"batch": 1, "no_wait": True, "group": "A", **request})
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.U.{consumer}", body, reply=f"{inbox}.{len(seen)}")
            msg = await sub.next_msg(timeout=10)
            headers = msg.headers or {}
            if "Status" in headers:
                seen.append((headers["Status"], headers.get("Description", "")))
                return
            pin = headers.get("Nats-Pin-Id", "")
            seen.append(("message", f"pin {pins.index(pin) if pin in pins else len(pins)}" if pin else ""))
            if pin and pin not in pins:
                pins.append(pin)

        async def advisory() -> dict[str, Any]:
            msg = await advisories.next_msg(timeout=10)
            event = orjson.loads(msg.data)
            assert event.pop("id") and event.pop("timestamp"), event
            if "pinned_id" in event:
                event["pinned_id"] = f"pin {pins.index(event['pinned_id'])}"
            return {"subject": msg.subject, **event}

        async def groups(consumer: str) -> Any:
            """Consumer info's `priority_groups`, the pin id as its place in `pins`, its time as set or zero."""
            reply = await nc.request(f"$JS.API.CONSUMER.INFO.U.{consumer}", b"", timeout=10)
            states = orjson.loads(reply.data).get("priority_groups", "absent")
            for state in states if isinstance(states, list) else ():
                if "pinned_client_id" in state:
                    state["pinned_client_id"] = f"pin {pins.index(state['pinned_client_id'])}"
                stamp = state.get("pinned_ts")
                if stamp and stamp != "0001-01-01T00:00:00Z":
                    pinned_at = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                    state["pinned_ts"] = "set" if pinned_at >= started else "before"
            return states

        started = datetime.now(timezone.utc).replace(microsecond=0)
        seen.append(await groups("PIN"))
        for body in (b"", b"[1]", b"{}", b'{"group": 5}', b'{"group": "no spaces"}', b'{"group": "B"}'):
            await unpin("U", "PIN", body)
        await unpin("NOPE", "PIN", b'{"group": "A"}')
        await unpin("U", "NOPE", b'{"group": "A"}')
        await pull("PIN", {})
        seen.append(await advisory())
        seen.append(await groups("PIN"))
        await pull("PIN", {})  # without the pin id, while the pin holds
        await unpin("U", "PIN", b'{"group": "A", "extra": true}')
        seen.append(await advisory())
        seen.append(await groups("PIN"))
        await pull("PIN", {"id": pins[0]})  # the id of the pin that was dropped
        await pull("PIN", {})
        seen.append(await advisory())
        await unpin("U", "OV", b'{"group": "A"}')  # a consumer with the group, not pinned: still announced
        seen.append(await advisory())
        seen.append(await groups("OV"))
        seen.append(await groups("PLAIN"))
        await pull("TWO", {"group": "B"})  # pinned through its second group: reported under its first
        seen.append(await advisory())
        seen.append(await groups("TWO"))
        await pull("LAPSE", {})
        seen.append(await advisory())
        seen.append(await advisory())  # the pin lapses after priority_timeout without a request
        return seen
    finally:
        await nc.close()


def _unpin_error(err_code: int, code: int, description: str) -> dict[str, Any]:
    return {"type": "io.nats.jetstream.api.v1.consumer_unpin_response", "error": {"code": code, "err_code": err_code, "description": description}}


def _pin_event(kind: str, consumer: str, **fields: str) -> dict[str, Any]:
    verb = "PINNED" if kind == "pinned" else "UNPINNED"
    return {"subject": f"$JS.EVENT.ADVISORY.CONSUMER.{verb}.U.{consumer}", "type": f"io.nats.jetstream.advisory.v1.consumer_group_{kind}",
            "account": "$G", "stream": "U", "consumer": consumer, "group": "A", **fields}


def _groups(pin: str = "") -> list[dict[str, str]]:
    if pin:
        return [{"group": "A", "pinned_client_id": pin, "pinned_ts": "set"}]
    return [{"group": "A", "pinned_ts": "0001-01-01T00:00:00Z"}]


def test_unpin_and_the_pin_advisories(url: str) -> None:
    """The global account is `$G` in the advisories, and consumer info carries the pin state, as nats-server's."""
    assert asyncio.run(asyncio.wait_for(_unpin(url), 60)) == [
        _groups(),
        _unpin_error(10025, 400, "invalid JSON: unexpected end of JSON input"),
        _unpin_error(10025, 400, "invalid JSON: json: cannot unmarshal array into Go value of type server.JSApiConsumerUnpinRequest"),
        _unpin_error(10025, 400, "invalid JSON: consumer group not specified"),
        _unpin_error(10025, 400, "invalid JSON: json: cannot unmarshal number into Go struct field JSApiConsumerUnpinRequest.group of type string"),
        _unpin_error(10162, 400, "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters"),
        _unpin_error(10160, 400, "Provided priority group does not exist for this consumer"),
        _unpin_error(10059, 404, "stream not found"),
        _unpin_error(10014, 404, "consumer not found"),
        ("message", "pin 0"),
        _pin_event("pinned", "PIN", pinned_id="pin 0"),
        _groups("pin 0"),
        ("404", "No Messages"),
        {"type": "io.nats.jetstream.api.v1.consumer_unpin_response"},
        _pin_event("unpinned", "PIN", reason="admin"),
        _groups(),
        ("423", "Nats-Wrong-Pin-Id"),  # a dropped pin's id is a wrong one
        ("message", "pin 1"),
        _pin_event("pinned", "PIN", pinned_id="pin 1"),
        {"type": "io.nats.jetstream.api.v1.consumer_unpin_response"},
        _pin_event("unpinned", "OV", reason="admin"),
        _groups(),  # overflow: the group's entry, never a pin
        "absent",  # no priority policy: no entry
        ("message", "pin 2"),
        {**_pin_event("pinned", "TWO", pinned_id="pin 2"), "group": "B"},
        _groups("pin 2"),
        ("message", "pin 3"),
        _pin_event("pinned", "LAPSE", pinned_id="pin 3"),
        _pin_event("unpinned", "LAPSE", reason="timeout"),
    ]
