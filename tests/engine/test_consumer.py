"""Consumer semantics on the engine, with a hand-moved clock: ConsumerInfo against hand-computed JetStream values.

Every test drives one stream `S` (subjects `s.>`) and mostly one consumer `C`; `figures` reduces a
ConsumerInfo to the numbers JetStream reports, and `want` builds the expected ones. Deliveries are
`(stream_seq, consumer_seq, num_delivered)`. Deadlines are due when `now >= deadline`, as in
nats-server's checkPending; the clock only moves by whole milliseconds (the ack table keeps µs).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine import JetStream, JetStreamError, ManualClock, PubAck
from engine.config import NS_PER_S
from tests.conftest import reopen
from engine.info import rfc3339

SECOND = NS_PER_S
MS = SECOND // 1000






def stream(js: JetStream, **config: Any) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"], **config})


def consumer(js: JetStream, name: str | None = "C", **config: Any) -> dict[str, Any]:
    body = {"durable_name": name, **config} if name else config
    info, created = js.add_consumer("S", body)
    assert created
    return info


def pub(js: JetStream, subject: str = "s.a", data: bytes = b"x") -> int:
    ack = js.publish_one(subject, data)
    assert isinstance(ack, PubAck), ack
    return ack.seq


def pull(js: JetStream, n: int = 10, name: str = "C") -> list[tuple[int, int, int]]:
    return [(d.msg.seq, d.consumer_seq, d.num_delivered) for d in js.fetch("S", name, n)]


def seqs(js: JetStream, n: int = 10, name: str = "C") -> list[int]:
    return [s for s, _, _ in pull(js, n, name)]


def ack(js: JetStream, *stream_seqs: int, kind: str = "ack", delay: int = 0, name: str = "C") -> None:
    results = js.ack("S", name, [(s, kind, delay) for s in stream_seqs])
    assert results == [None] * len(stream_seqs), results


def figures(js: JetStream, name: str = "C") -> dict[str, Any]:
    i = js.consumer_info("S", name)
    out: dict[str, Any] = {k: (i[k]["consumer_seq"], i[k]["stream_seq"]) for k in ("delivered", "ack_floor")}
    return out | {k: i[k] for k in ("num_ack_pending", "num_redelivered", "num_waiting", "num_pending")}


def want(delivered: tuple[int, int], ack_floor: tuple[int, int], ack_pending: int = 0, redelivered: int = 0, pending: int = 0) -> dict[str, Any]:
    keys = ("delivered", "ack_floor", "num_ack_pending", "num_redelivered", "num_waiting", "num_pending")
    return dict(zip(keys, (delivered, ack_floor, ack_pending, redelivered, 0, pending), strict=True))


def err_code(exc: pytest.ExceptionInfo[JetStreamError]) -> tuple[int, int]:
    return exc.value.code, exc.value.err_code


# -- lifecycle ----------------------------------------------------------------------------------


def test_durable_create_is_idempotent_and_a_different_config_is_refused(js: JetStream) -> None:
    stream(js)
    info = consumer(js, ack_policy="explicit")
    assert (info["name"], info["config"]["durable_name"], info["config"]["ack_wait"]) == ("C", "C", 30 * SECOND)
    again, created = js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    assert not created and again["created"] == info["created"]
    with pytest.raises(JetStreamError) as exc:
        js.add_consumer("S", {"durable_name": "C", "ack_policy": "all"})
    assert err_code(exc) == (400, 10148)
    named, created = js.add_consumer("S", {"name": "N", "ack_policy": "explicit", "inactive_threshold": 60 * SECOND})
    assert created and named["name"] == "N" and named["config"]["inactive_threshold"] == 60 * SECOND


def test_info_list_and_delete(js: JetStream) -> None:
    stream(js)
    consumer(js, "B")
    consumer(js, "A", ack_policy="explicit")
    listing = js.list_consumers("S")
    assert (listing["total"], [c["name"] for c in listing["consumers"]]) == (2, ["A", "B"])
    assert js.stream_info("S")["state"]["consumer_count"] == 2
    js.delete_consumer("S", "A")
    for call in (lambda: js.consumer_info("S", "A"), lambda: js.fetch("S", "A", 1), lambda: js.delete_consumer("S", "A")):
        with pytest.raises(JetStreamError) as exc:
            call()
        assert err_code(exc) == (404, 10014)
    assert [c["name"] for c in js.list_consumers("S")["consumers"]] == ["B"]


def test_unpin_checks_the_group_first_then_drops_the_pin_and_tells_the_door(js: JetStream) -> None:
    """jsConsumerUnpinRequest's order: the group (10025, 10162) before the stream and consumer (10059,
    10014), then the consumer's own groups (10160); an unpin drops the pin info reports, and the
    callback a door set hears it."""
    stream(js)
    consumer(js, priority_policy="pinned_client", priority_groups=["A", "B"])
    consumer(js, "PLAIN")
    heard: list[tuple[str, str, str]] = []
    js.consumers.on_unpin = lambda *args: heard.append(args)
    for args, code in ((("NOPE", "C", ""), (400, 10025)), (("NOPE", "C", "a b"), (400, 10162)),
                       (("NOPE", "C", "A"), (404, 10059)), (("S", "NOPE", "A"), (404, 10014)),
                       (("S", "C", "Z"), (400, 10160)), (("S", "PLAIN", "A"), (400, 10160))):
        with pytest.raises(JetStreamError) as exc:
            js.consumers.unpin(js.stream, *args)
        assert err_code(exc) == code, args
    assert heard == []
    assert js.consumer_info("S", "C")["priority_groups"] == [{"group": "A", "pinned_ts": "0001-01-01T00:00:00Z"}]
    assert "priority_groups" not in js.consumer_info("S", "PLAIN")
    js.consumers.get(js.stream("S"), "C").pin = ("pin-id", 5 * SECOND)  # what a door's pinned request sets
    assert js.consumer_info("S", "C")["priority_groups"] == [
        {"group": "A", "pinned_client_id": "pin-id", "pinned_ts": rfc3339(5 * SECOND)}]
    js.consumers.unpin(js.stream, "S", "C", "B")
    assert heard == [("S", "C", "B")]
    assert js.consumer_info("S", "C")["priority_groups"] == [{"group": "A", "pinned_ts": "0001-01-01T00:00:00Z"}]


def test_max_consumers_of_the_stream(js: JetStream) -> None:
    stream(js, max_consumers=2)
    consumer(js, "A")
    consumer(js, "B")
    with pytest.raises(JetStreamError) as exc:
        consumer(js, "X")
    assert exc.value.err_code == 10026
    assert js.add_consumer("S", {"durable_name": "A"})[1] is False, "an identical create is still answered"
    js.delete_consumer("S", "A")
    consumer(js, "X")


def test_update_changes_what_may_change(js: JetStream) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", max_ack_pending=1)
    for i in range(3):
        pub(js, "s.a", bytes([i]))
    assert seqs(js) == [1]
    info = js.update_consumer("S", "C", {"durable_name": "C", "ack_policy": "explicit", "max_ack_pending": 3, "description": "d"})
    assert (info["config"]["max_ack_pending"], info["config"]["description"]) == (3, "d")
    assert seqs(js) == [2, 3], "the new max_ack_pending applies at once"
    for change in ({"ack_policy": "all"}, {"ack_policy": "explicit", "deliver_policy": "new"}):
        with pytest.raises(JetStreamError) as exc:
            js.update_consumer("S", "C", {"durable_name": "C", **change})
        assert err_code(exc) == (400, 10012)
    with pytest.raises(JetStreamError) as exc:
        js.update_consumer("S", "nope", {"durable_name": "nope"})
    assert exc.value.code == 404


def test_update_of_the_filter_changes_what_is_delivered(js: JetStream) -> None:
    stream(js)
    consumer(js, filter_subject="s.a")
    pub(js, "s.a")
    pub(js, "s.b")
    js.update_consumer("S", "C", {"durable_name": "C", "filter_subject": "s.b"})
    assert figures(js)["num_pending"] == 1
    assert seqs(js) == [2]


def test_ephemeral_is_removed_after_inactive_threshold(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    info = consumer(js, None, ack_policy="explicit")
    name = info["name"]
    assert len(name) == 8 and "durable_name" not in info["config"]
    assert info["config"]["inactive_threshold"] == 5 * SECOND
    clock.advance(4 * SECOND)
    assert pull(js, name=name) == []  # activity
    clock.advance(5 * SECOND)
    js.flush()
    assert js.consumer_info("S", name)["name"] == name
    clock.advance(1 * MS)
    js.flush()
    with pytest.raises(JetStreamError) as exc:
        js.consumer_info("S", name)
    assert err_code(exc) == (404, 10014)
    assert js.stream_info("S")["state"]["consumer_count"] == 0


# -- where delivery starts ----------------------------------------------------------------------


def _five(js: JetStream, clock: ManualClock) -> None:
    """s.a(1) s.b(2) s.a(3) s.c(4) s.b(5), one second apart."""
    stream(js)
    for subject in ("s.a", "s.b", "s.a", "s.c", "s.b"):
        pub(js, subject)
        clock.advance(SECOND)


START = 1_700_000_000 * SECOND  # ManualClock's start: message n was published at START + (n-1)s


@pytest.mark.parametrize(
    ("config", "start_floor", "expected"),
    [
        ({"deliver_policy": "all"}, 0, [1, 2, 3, 4, 5]),
        ({"deliver_policy": "last"}, 4, [5]),
        ({"deliver_policy": "last", "filter_subject": "s.a"}, 2, [3]),
        ({"deliver_policy": "new"}, 5, []),
        ({"deliver_policy": "by_start_sequence", "opt_start_seq": 3}, 2, [3, 4, 5]),
        ({"deliver_policy": "by_start_time", "opt_start_time": rfc3339(START + 3 * SECOND)}, 3, [4, 5]),
        ({"deliver_policy": "last_per_subject", "filter_subject": "s.>"}, 2, [3, 4, 5]),
        ({"deliver_policy": "last_per_subject", "filter_subject": "s.b"}, 4, [5]),
        ({"deliver_policy": "all", "filter_subject": "s.b"}, 0, [2, 5]),
        ({"deliver_policy": "by_start_sequence", "opt_start_seq": 2, "filter_subjects": ["s.a", "s.c"]}, 1, [3, 4]),
    ],
)
def test_deliver_policies(js: JetStream, clock: ManualClock, config: dict[str, Any], start_floor: int, expected: list[int]) -> None:
    _five(js, clock)
    consumer(js, ack_policy="explicit", **config)
    assert figures(js) == want((0, start_floor), (0, start_floor), pending=len(expected))
    assert seqs(js) == expected
    n = len(expected)
    last = expected[-1] if expected else start_floor
    assert figures(js) == want((n, last), (0, start_floor), ack_pending=n)
    new = pub(js, config.get("filter_subject", "s.a").replace(">", "z"))
    assert figures(js)["num_pending"] == 1
    assert seqs(js) == [new], "after the starting set, every new matching message"


def test_filter_subjects_with_wildcards(js: JetStream) -> None:
    stream(js)
    for subject in ("s.a.x", "s.b.y", "s.b.x", "s.a.q.r", "s.c.z", "s.c.y"):
        pub(js, subject)
    consumer(js, "ONE", filter_subject="s.*.x")
    consumer(js, "MANY", filter_subjects=["s.a.>", "s.*.z"])
    assert (figures(js, "ONE")["num_pending"], figures(js, "MANY")["num_pending"]) == (2, 3)
    assert seqs(js, name="ONE") == [1, 3]
    assert seqs(js, name="MANY") == [1, 4, 5]
    assert figures(js, "MANY") == want((3, 5), (3, 5))  # ack none


# -- ack policies -------------------------------------------------------------------------------


def test_ack_none_counts_delivery_as_ack(js: JetStream) -> None:
    stream(js)
    consumer(js)
    assert js.consumer_info("S", "C")["config"]["ack_policy"] == "none"
    for _ in range(3):
        pub(js)
    assert pull(js, 2) == [(1, 1, 1), (2, 2, 1)]
    assert figures(js) == want((2, 2), (2, 2), pending=1)
    results = js.ack("S", "C", [(1, "ack", 0)])
    assert isinstance(results[0], JetStreamError) and results[0].code == 400
    assert figures(js) == want((2, 2), (2, 2), pending=1)


def test_ack_all_acks_everything_pending_up_to_n(js: JetStream) -> None:
    stream(js)
    consumer(js, ack_policy="all")
    for _ in range(5):
        pub(js)
    assert seqs(js) == [1, 2, 3, 4, 5]
    ack(js, 3)
    assert figures(js) == want((5, 5), (3, 3), ack_pending=2)
    results = js.ack("S", "C", [(2, "ack", 0)])
    assert isinstance(results[0], JetStreamError), "2 was acked by the ack of 3"
    ack(js, 5)
    assert figures(js) == want((5, 5), (5, 5))


def test_explicit_ack_floor_moves_over_contiguous_acks(js: JetStream) -> None:
    stream(js)
    consumer(js, ack_policy="explicit")
    for _ in range(4):
        pub(js)
    assert seqs(js, 3) == [1, 2, 3]
    ack(js, 2)
    assert figures(js) == want((3, 3), (0, 0), ack_pending=2, pending=1)
    ack(js, 1)
    assert figures(js) == want((3, 3), (2, 2), ack_pending=1, pending=1)
    ack(js, 3)
    assert figures(js) == want((3, 3), (3, 3), pending=1)


def test_ack_wait_expiry_redelivers(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=2 * SECOND)
    pub(js)
    pub(js)
    assert pull(js) == [(1, 1, 1), (2, 2, 1)]
    clock.advance(SECOND)
    ack(js, 2)
    clock.advance(SECOND - MS)
    assert pull(js) == []
    clock.advance(MS)
    assert pull(js) == [(1, 3, 2)]
    assert figures(js) == want((3, 2), (0, 0), ack_pending=1, redelivered=1)
    ack(js, 1)
    assert figures(js) == want((3, 2), (3, 2))


def test_ack_of_a_redelivered_message_moves_the_floor(js: JetStream) -> None:
    """nats-server's trackPending keeps the first delivery's consumer seq, so the floor moves over 1."""
    stream(js)
    consumer(js, ack_policy="explicit")
    pub(js)
    pub(js)
    assert seqs(js) == [1, 2]
    ack(js, 1, kind="nak")
    assert pull(js) == [(1, 3, 2)]
    ack(js, 1)
    assert figures(js) == want((3, 2), (1, 1), ack_pending=1)


def test_max_deliver_drops_the_message_after_the_last_ack_wait(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=SECOND, max_deliver=2)
    pub(js)
    assert pull(js) == [(1, 1, 1)]
    clock.advance(SECOND)
    assert pull(js) == [(1, 2, 2)]
    assert figures(js) == want((2, 1), (0, 0), ack_pending=1, redelivered=1)
    clock.advance(SECOND)
    js.flush()
    assert figures(js) == want((2, 1), (0, 0), ack_pending=1, redelivered=1), "pending until the next pull"
    assert pull(js) == []
    # Out of deliveries, not acknowledged: the ack floor stays below it, and it still counts as redelivered
    # (what nats-server 2.15 reports; tests/api/test_max_deliver_vs_nats.py compares step by step).
    assert figures(js) == want((2, 1), (0, 0), redelivered=1)
    pub(js)
    assert pull(js) == [(2, 3, 1)]
    ack(js, 2)
    assert figures(js) == want((3, 2), (3, 2), redelivered=1)


def test_max_deliver_after_naks(js: JetStream) -> None:
    """A nak queues the message at once; the pull that would deliver it past max_deliver ends it instead."""
    stream(js)
    consumer(js, ack_policy="explicit", max_deliver=2)
    pub(js)
    pub(js)
    assert pull(js, 2) == [(1, 1, 1), (2, 2, 1)]
    ack(js, 1, kind="nak")
    assert pull(js) == [(1, 3, 2)]
    ack(js, 1, kind="nak")
    assert pull(js) == []
    assert figures(js) == want((3, 2), (0, 0), ack_pending=1, redelivered=1)
    ack(js, 2)
    assert figures(js) == want((3, 2), (3, 2), redelivered=1)


def test_max_deliver_leaves_pending_without_a_pull(js: JetStream, clock: ManualClock) -> None:
    """nats-server's checkPending runs on the ack timer: with max_deliver 1 the message leaves pending with no
    pull waiting; the ack floor stays where it was."""
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=SECOND, max_deliver=1)
    pub(js)
    assert pull(js) == [(1, 1, 1)]
    clock.advance(SECOND)
    js.flush()
    assert figures(js) == want((1, 1), (0, 0))


def test_backoff_sets_each_redelivery_wait(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    info = consumer(js, ack_policy="explicit", backoff=[SECOND, 2 * SECOND, 4 * SECOND], max_deliver=5)
    assert info["config"]["ack_wait"] == SECOND
    pub(js)
    assert pull(js) == [(1, 1, 1)]
    for count, wait in ((2, SECOND), (3, 2 * SECOND), (4, 4 * SECOND), (5, 4 * SECOND)):
        clock.advance(wait - MS)
        assert pull(js) == [], f"delivery {count} comes {wait / SECOND}s after the previous one"
        clock.advance(MS)
        assert pull(js) == [(1, count, count)]
    assert figures(js) == want((5, 1), (0, 0), ack_pending=1, redelivered=1)
    clock.advance(4 * SECOND)
    assert pull(js) == []
    assert figures(js) == want((5, 1), (0, 0), redelivered=1)


def test_nak_redelivers_at_once_or_after_its_delay(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=30 * SECOND)
    pub(js)
    pub(js)
    assert seqs(js) == [1, 2]
    ack(js, 1, kind="nak")
    assert pull(js) == [(1, 3, 2)]
    assert figures(js) == want((3, 2), (0, 0), ack_pending=2, redelivered=1)
    ack(js, 2, kind="nak", delay=5 * SECOND)
    clock.advance(5 * SECOND - MS)
    assert pull(js) == []
    clock.advance(MS)
    assert pull(js) == [(2, 4, 2)]
    assert figures(js) == want((4, 2), (0, 0), ack_pending=2, redelivered=2)


def test_wpi_restarts_the_ack_timer(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=2 * SECOND)
    pub(js)
    assert pull(js) == [(1, 1, 1)]
    clock.advance(1500 * MS)
    ack(js, 1, kind="wpi")
    clock.advance(2 * SECOND - MS)
    assert pull(js) == []
    assert figures(js) == want((1, 1), (0, 0), ack_pending=1)
    clock.advance(MS)
    assert pull(js) == [(1, 2, 2)]


def test_term_stops_redelivery(js: JetStream, clock: ManualClock) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=SECOND)
    pub(js)
    pub(js)
    assert seqs(js) == [1, 2]
    ack(js, 1, kind="term")
    assert figures(js) == want((2, 2), (1, 1), ack_pending=1)
    clock.advance(SECOND)
    assert pull(js) == [(2, 3, 2)]


def test_max_ack_pending_stops_delivery_until_acks(js: JetStream) -> None:
    stream(js)
    consumer(js, ack_policy="explicit", max_ack_pending=2)
    for _ in range(5):
        pub(js)
    assert seqs(js) == [1, 2]
    assert seqs(js) == []
    assert figures(js) == want((2, 2), (0, 0), ack_pending=2, pending=3)
    ack(js, 1)
    assert seqs(js) == [3]
    ack(js, 2, 3)
    assert seqs(js) == [4, 5]
    assert figures(js) == want((5, 5), (3, 3), ack_pending=2)


def test_deleted_and_purged_messages_are_never_delivered(js: JetStream) -> None:
    stream(js)
    for subject in ("s.a", "s.b", "s.a", "s.b", "s.a"):
        pub(js, subject)
    consumer(js, ack_policy="explicit")
    js.delete_message("S", 1)
    js.purge("S", "s.b")
    assert figures(js)["num_pending"] == 2
    assert seqs(js) == [3, 5]


def test_deleting_a_pending_message_takes_it_out_of_pending(js: JetStream) -> None:
    stream(js)
    consumer(js, ack_policy="explicit")
    pub(js)
    pub(js)
    assert seqs(js) == [1, 2]
    js.delete_message("S", 1)
    assert figures(js) == want((2, 2), (1, 1), ack_pending=1)


# -- retention ----------------------------------------------------------------------------------


def test_workqueue_acked_messages_leave_at_once(js: JetStream) -> None:
    stream(js, retention="workqueue")
    consumer(js, "A", ack_policy="explicit", filter_subject="s.a.>")
    for subject in ("s.a.1", "s.a.2", "s.a.3", "s.b"):
        pub(js, subject)
    assert seqs(js, name="A") == [1, 2, 3]
    ack(js, 1, name="A")
    ack(js, 2, kind="term", name="A")
    ack(js, 3, kind="nak", name="A")
    state = js.stream_info("S")["state"]
    assert (state["messages"], state["first_seq"], state["last_seq"]) == (2, 3, 4)
    assert figures(js, "A") == want((3, 3), (2, 2), ack_pending=1)
    with pytest.raises(JetStreamError) as exc:
        consumer(js, "B", ack_policy="explicit", filter_subject="s.a.2")
    assert exc.value.err_code == 10100
    with pytest.raises(JetStreamError) as exc:
        consumer(js, "B", ack_policy="explicit")
    assert exc.value.err_code == 10099
    consumer(js, "B", ack_policy="explicit", filter_subject="s.b")
    assert seqs(js, name="B") == [4]
    ack(js, 4, name="B")
    assert js.stream_info("S")["state"]["messages"] == 1


def test_interest_keeps_a_message_until_every_matching_consumer_acked(js: JetStream) -> None:
    stream(js, retention="interest")
    assert pub(js, "s.a") == 1
    state = js.stream_info("S")["state"]
    assert (state["messages"], state["last_seq"]) == (0, 1), "no interest: not kept, but the sequence is taken"
    consumer(js, "ALL", ack_policy="explicit")
    consumer(js, "B", ack_policy="explicit", filter_subject="s.b")
    pub(js, "s.a")  # 2
    pub(js, "s.b")  # 3
    pub(js, "s.b")  # 4
    assert seqs(js, name="ALL") == [2, 3, 4]
    ack(js, 2, 3, 4, name="ALL")
    assert js.stream_info("S")["state"]["messages"] == 2, "2 left (B does not match it); 3 and 4 wait for B"
    assert seqs(js, name="B") == [3, 4]
    ack(js, 3, name="B")
    state = js.stream_info("S")["state"]
    assert (state["messages"], state["first_seq"]) == (1, 4)
    js.delete_consumer("S", "B")
    assert js.stream_info("S")["state"]["messages"] == 0, "what only B held is released"


def test_interest_ack_none_delivery_releases_the_message(js: JetStream) -> None:
    """nats-server's deliverMsg: `ap == AckNone && retention != limits` → the stream drops its interest."""
    stream(js, retention="interest")
    consumer(js, "N", ack_policy="none")
    pub(js)
    pub(js)
    assert seqs(js, name="N") == [1, 2]
    assert js.stream_info("S")["state"]["messages"] == 0


def test_interest_max_deliver_keeps_the_message(js: JetStream, clock: ManualClock) -> None:
    stream(js, retention="interest")
    consumer(js, ack_policy="explicit", ack_wait=SECOND, max_deliver=1)
    pub(js)
    assert seqs(js) == [1]
    clock.advance(SECOND)
    assert seqs(js) == []
    assert figures(js) == want((1, 1), (0, 0))
    assert js.stream_info("S")["state"]["messages"] == 1, "kept for DLQ handling (nats-server#4998)"


# -- restart ------------------------------------------------------------------------------------


def _info_without_ts(js: JetStream) -> dict[str, Any]:
    info = js.consumer_info("S", "C")
    info.pop("ts")
    return info


@pytest.mark.parametrize("flush_at", ["never", "middle", "end"])
def test_consumer_state_survives_a_restart(engine: list[JetStream], clock: ManualClock, flush_at: str) -> None:
    js = engine[0]
    stream(js)
    consumer(js, ack_policy="explicit", ack_wait=10 * SECOND)
    for _ in range(6):
        pub(js)
    assert seqs(js, 3) == [1, 2, 3]
    ack(js, 2)
    ack(js, 3, kind="nak", delay=20 * SECOND)
    if flush_at == "middle":
        js.flush()
    clock.advance(SECOND)
    assert seqs(js, 1) == [4]
    ack(js, 1)
    if flush_at == "end":
        js.flush()
    expected = want((4, 4), (2, 2), ack_pending=2, pending=2)
    assert figures(js) == expected
    before = _info_without_ts(js)
    engine[0] = js = reopen(js, clock)
    assert _info_without_ts(js) == before
    assert figures(js) == expected
    assert seqs(js) == [5, 6], "acked messages are not delivered again"
    clock.advance(10 * SECOND)
    assert pull(js) == [(4, 7, 2), (5, 8, 2), (6, 9, 2)], "delivered at +1s, due at +11s"
    clock.advance(9 * SECOND - MS)
    assert pull(js) == []
    clock.advance(MS)
    assert pull(js) == [(3, 10, 2)], "3 was nak'ed at +0s with a 20s delay"
    assert figures(js) == want((10, 6), (2, 2), ack_pending=4, redelivered=4)
