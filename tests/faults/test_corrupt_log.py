"""A damaged record anywhere in a stream's log: reported with its segment and byte offset, and every
intact record after it recovered (as nats-server rebuilds a message block past a bad record).

Before, damage in the last segment cut the log there (acknowledged messages after it were lost and
their sequences given again) and damage in an earlier segment stopped the gateway from starting.
The damaged record's own messages are lost (its bytes are gone); no sequence is given twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine.store.failpoints import ENV
from engine.store.layout import Layout
from engine.store.lease import commit_lease
from engine.store.rows import decode
from engine.store.wal import HEADER_SIZE, read_segment
from tests.faults.harness import Load, create_stream, table_rows
from tests.gateway import Gateway

STREAM = "FAULTS"


def _log_of_three_segments(warehouse: Path, clock: ManualClock) -> dict[int, bytes]:
    """Publishes 3 rounds of 4 records (5 messages each); a flush that cannot commit (a lease is held)
    seals a segment after each round; then the process "dies" with nothing committed."""
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    acked: dict[int, bytes] = {}
    lease = Layout(warehouse).lease_file(Layout(warehouse).stream_table(STREAM))
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
        for round_ in range(3):
            for record in range(4):
                batch = [InboundMessage(f"faults.{i}", b"r%d-%d-%d" % (round_, record, i)) for i in range(5)]
                for msg, ack in zip(batch, js.publish(batch), strict=True):
                    acked[ack.seq] = msg.data  # type: ignore[union-attr]
            with commit_lease(lease, timeout=5):
                js.flush()
    finally:
        for stream in js.streams():
            stream.store.close()
        js._owner.release()
    return acked


def _records(segment: Path) -> list[tuple[int, list[int]]]:
    """(byte offset, sequences) of each record of a segment."""
    records, _ = read_segment(segment)
    out, offset = [], 0
    for record in records:
        rows = decode(record.kind, record.payload)
        out.append((offset, list(range(rows.first_seq, rows.last_seq + 1))))
        offset += HEADER_SIZE + len(record.payload)
    return out


@pytest.mark.parametrize(("where", "segment_index", "record_index"), [
    ("at the tail", 2, 3),
    ("in the middle of a segment", 2, 1),
    ("in a middle segment", 1, 1),
])
def test_a_damaged_record_is_reported_and_what_follows_is_recovered(
    warehouse: Path, clock: ManualClock, where: str, segment_index: int, record_index: int
) -> None:
    acked = _log_of_three_segments(warehouse, clock)
    segments = sorted((warehouse / "default" / "_wal" / STREAM).glob("*.wal"))
    assert len(segments) == 3
    segment = segments[segment_index]
    offset, lost = _records(segment)[record_index]
    data = bytearray(segment.read_bytes())
    data[offset + HEADER_SIZE + 3] ^= 0xFF  # a byte of the record's payload
    segment.write_bytes(bytes(data))

    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    try:
        reported = js.health()["log_damage"]
        assert [(d["stream"], d["segment"], d["offset"]) for d in reported] == [(STREAM, segment.name, offset)], where
        stream = js.stream(STREAM)
        for seq, payload in acked.items():
            if seq in lost:
                assert not stream.index.is_live(seq)
            else:
                assert js.get_message(STREAM, seq).data == payload, f"seq {seq} after the damage {where} is lost"
        fresh = js.publish_one("faults.fresh", b"fresh")
        assert fresh.seq > max(acked), "a sequence is given twice"  # type: ignore[union-attr]
        js.flush()
    finally:
        js.close()
    rows = table_rows(warehouse)
    assert set(rows) == (set(acked) - set(lost)) | {fresh.seq}  # type: ignore[union-attr]


def test_a_record_damaged_under_a_running_gateway_is_reported_after_a_restart(warehouse: Path) -> None:
    """The `corrupt` failpoint flips a byte of an appended (and acknowledged) record: after a kill -9
    and a restart, `/healthz` names the segment and offset, the one damaged record's messages are the
    only ones missing, and no sequence is given twice."""
    gw = Gateway(warehouse, "--flush-interval", "60", env={ENV: "wal.append=corrupt@6"}).start()
    load = Load(gw.url, consume=False, deletes=False, max_batches=12)
    try:
        with gw.client() as c:
            create_stream(c)
        load.start().join()
        assert "failpoint wal.append fires: corrupt" in gw.log.read_text()
        gw.kill9()
    finally:
        gw.stop()
    gw = Gateway(warehouse, "--flush-interval", "0.2").start()
    try:
        with gw.client() as c:
            damage = c.get("/healthz").json()["log_damage"]
            assert [(d["stream"], d["lost_records"], d["tail"]) for d in damage] == [(STREAM, 1, False)]
            assert damage[0]["segment"].endswith(".wal") and damage[0]["offset"] > 0
            missing = sorted(seq for seq in load.acked.values()
                             if c.get(f"/v1/streams/{STREAM}/messages/{seq}").status_code == 404)
            assert missing and missing == list(range(missing[0], missing[-1] + 1)), "one record's messages, in a row"
            fresh = c.post("/v1/publish/faults.fresh", content=b"fresh").json()
            assert fresh["seq"] > max(load.acked.values())
    finally:
        gw.stop()
