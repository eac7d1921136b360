"""Defect 1: a Delta commit that lands and then raises is not appended again.

delta-rs raises after the commit when its post-commit checkpoint fails (a nearly full disk, every
`delta.checkpointInterval`-th version). Here the checkpoint fails for real: `_last_checkpoint` is a
folder, so delta-rs cannot write the checkpoint's pointer file. Before the fix the flusher requeued
the landed commit and appended its rows again, and the next start failed for the whole warehouse
("sequence N is not after the last sequence N").
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from engine import EngineOptions, JetStream, ManualClock
from tests.faults.harness import table_rows

STREAM = "FAULTS"


def _engine(warehouse: Path, clock: ManualClock) -> JetStream:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    return js


def test_a_commit_whose_checkpoint_fails_is_stored_once(warehouse: Path, clock: ManualClock) -> None:
    js = _engine(warehouse, clock)
    js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
    table = warehouse / "default" / "streams" / STREAM
    DeltaTable(str(table)).alter.set_table_properties({"delta.checkpointInterval": "3"})
    (table / "_delta_log" / "_last_checkpoint").mkdir()
    try:
        for i in range(6):
            assert js.publish_one(f"faults.{i}", f"m{i}".encode()).seq == i + 1  # type: ignore[union-attr]
            js.flush()
    finally:
        js.close()
    again = _engine(warehouse, clock)  # before the fix: "sequence N is not after the last sequence N"
    try:
        assert again.stream_info(STREAM)["state"]["last_seq"] == 6
        assert again.publish_one("faults.next", b"next").seq == 7  # type: ignore[union-attr]
    finally:
        again.close()
    assert table_rows(warehouse) == {i + 1: None for i in range(7)}, "each message once in the table"
    assert js.flush_stats.failures == 0, "the failed checkpoint is logged; the commit stands"


def test_a_table_holding_rows_twice_opens_with_each_once(warehouse: Path, clock: ManualClock) -> None:
    """A warehouse damaged by the defect (a commit appended twice) opens; each sequence counts once."""
    js = _engine(warehouse, clock)
    try:
        js.add_stream({"name": STREAM, "subjects": ["faults.>"]})
        for i in range(4):
            js.publish_one(f"faults.{i}", b"m%d" % i)
        js.flush()
    finally:
        js.close()
    table = warehouse / "default" / "streams" / STREAM
    rows = DeltaTable(str(table)).to_pyarrow_table()
    write_deltalake(str(table), rows.filter(pc.greater(rows.column("seq"), 2)), mode="append",
                    partition_by=["subject_partition"])
    again = _engine(warehouse, clock)
    try:
        state = again.stream_info(STREAM)["state"]
        assert (state["messages"], state["last_seq"]) == (4, 4)
        assert again.get_message(STREAM, 3).data == b"m2"
        assert again.publish_one("faults.next", b"next").seq == 5  # type: ignore[union-attr]
    finally:
        again.close()
