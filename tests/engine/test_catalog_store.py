"""The catalog copy (engine/catalog_store.py): a restart reads one object, not a file per stream and
per consumer, and finds exactly what the streams' own files say, whatever crashed between a change of
those files and the copy's rewrite; an account info counts idle streams from it, exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine.catalog_store import MAGIC, CatalogStore
from engine.store.layout import Layout
from engine.store import failpoints
from engine.store.objectstore import StoredObject
from tests.engine.restarts import crash, open_engine

CONFIGS: list[dict[str, Any]] = [
    {"name": "PLAIN", "subjects": ["plain.>"]},
    {"name": "LIMITS", "subjects": ["lim.*", "lim2.>"], "max_msgs": 10, "max_bytes": 1 << 20, "max_age": 3_600_000_000_000,
     "max_msgs_per_subject": 2, "discard": "new", "duplicate_window": 60_000_000_000, "max_consumers": 5},
    {"name": "WQ", "subjects": ["wq.>"], "retention": "workqueue", "description": "work", "metadata": {"k": "v"}},
    {"name": "INTEREST", "subjects": ["int.>"], "retention": "interest", "allow_rollup_hdrs": True, "deny_delete": True},
]




def _fill(js: JetStream) -> None:
    for body in CONFIGS:
        js.add_stream(body)
        js.add_consumer(body["name"], {"durable_name": "C", "ack_policy": "explicit"})
        prefix = body["subjects"][0].split(".")[0]
        js.publish([InboundMessage(f"{prefix}.a", b"one"), InboundMessage(f"{prefix}.b", b"two")])
    js.purge("PLAIN", "plain.b")
    js.flush()


def _catalog(js: JetStream) -> dict[str, Any]:
    """Every stream's config and consumer names, as the engine serves them (opening each)."""
    out = {}
    for name in js.stream_names()["streams"]:
        info = js.stream_info(name)
        consumers = [c["name"] for c in js.list_consumers(name)["consumers"]]
        out[name] = (info["config"], info["created"], consumers, info["state"]["messages"], info["state"]["bytes"])
    return out


def _truth(warehouse: Path, clock: ManualClock) -> dict[str, Any]:
    """The same, from every stream's own files: the copy removed first."""
    layout = Layout(warehouse, "default")
    layout.objects.delete_prefix(CatalogStore(layout).key.rpartition("/")[0])
    js = open_engine(warehouse, clock)
    try:
        return _catalog(js)
    finally:
        js.close()


class _Reads:
    """Counts the reads of stream and consumer config files through the warehouse's object store."""

    def __init__(self, js: JetStream) -> None:
        self.keys: list[str] = []
        get = js.layout.objects.get

        def counted(key: str) -> StoredObject:
            if "/_system/streams/" in key or "/_system/consumers/" in key:
                self.keys.append(key)
            return get(key)

        js.layout.objects.get = counted  # type: ignore[method-assign]


def test_a_restart_reads_the_copy_and_finds_what_the_files_say(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    _fill(js)
    js.close()
    copy = js.layout.objects.get(js.catalog.key).data
    assert copy.startswith(MAGIC)

    again = JetStream(warehouse, EngineOptions(), clock=clock)
    reads = _Reads(again)
    again.open(start_flusher=False)
    try:
        assert reads.keys == [], "the start read no stream's or consumer's config file"
        assert sorted(again.stream_names()["streams"]) == sorted(c["name"] for c in CONFIGS)
        found = _catalog(again)
    finally:
        again.close()
    assert found == _truth(warehouse, clock)


def test_changes_after_the_copy_are_found_after_a_crash(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    _fill(js)
    js.close()  # the copy holds the four streams

    js = open_engine(warehouse, clock)
    js.add_stream({"name": "NEW", "subjects": ["new.>"]})
    js.add_consumer("NEW", {"durable_name": "N", "ack_policy": "explicit"})
    js.update_stream("LIMITS", {**CONFIGS[1], "subjects": ["lim.*"], "max_msgs": 20})
    js.delete_stream("INTEREST")
    js.add_consumer("LIMITS", {"durable_name": "PUSH", "deliver_subject": "out.lim", "ack_policy": "explicit"})
    js.delete_consumer("PLAIN", "C")
    crash(js)  # no rewrite of the copy: only the marks say what changed

    again = open_engine(warehouse, clock)
    try:
        assert "LIMITS" not in _unopened(again) and "WQ" in _unopened(again), "a push consumer opens its stream"
        found = _catalog(again)
    finally:
        again.close()
    assert sorted(found) == ["LIMITS", "NEW", "PLAIN", "WQ"]
    assert found["LIMITS"][0]["subjects"] == ["lim.*"] and found["LIMITS"][0]["max_msgs"] == 20
    assert found["NEW"][2] == ["N"] and found["PLAIN"][2] == [] and found["LIMITS"][2] == ["C", "PUSH"]
    assert found == _truth(warehouse, clock)


@pytest.mark.parametrize("action", ["raise_after", "eio"])
def test_a_crash_between_a_stream_config_write_and_the_copy(warehouse: Path, clock: ManualClock, action: str) -> None:
    """`raise_after`: the config record is written and the create fails before the engine (or the copy)
    knows it, as if the process died there; `eio`: the mark is written and the record is not."""
    js = open_engine(warehouse, clock)
    _fill(js)
    js.close()

    js = open_engine(warehouse, clock)
    failpoints.arm(f"stream.config={action}")
    try:
        with pytest.raises(OSError):
            js.add_stream({"name": "HALF", "subjects": ["half.>"], "max_msgs": 7})
        with pytest.raises(OSError):
            js.update_stream("PLAIN", {"name": "PLAIN", "subjects": ["plain.>", "plain2.>"]})
    finally:
        failpoints.disarm()
    crash(js)

    again = open_engine(warehouse, clock)
    try:
        found = _catalog(again)
    finally:
        again.close()
    if action == "raise_after":
        assert found["HALF"][0]["subjects"] == ["half.>"] and found["HALF"][0]["max_msgs"] == 7
        assert found["PLAIN"][0]["subjects"] == ["plain.>", "plain2.>"]
    else:
        assert "HALF" not in found and found["PLAIN"][0]["subjects"] == ["plain.>"]
    assert found == _truth(warehouse, clock)


def test_a_damaged_copy_means_reading_every_file(warehouse: Path, clock: ManualClock) -> None:
    js = open_engine(warehouse, clock)
    _fill(js)
    js.close()
    copy = bytearray(js.layout.objects.get(js.catalog.key).data)
    copy[-5] ^= 0xFF
    js.layout.objects.put(js.catalog.key, bytes(copy))

    again = JetStream(warehouse, EngineOptions(), clock=clock)
    reads = _Reads(again)
    again.open(start_flusher=False)
    try:
        assert len(reads.keys) == 2 * len(CONFIGS), "every stream's and consumer's file was read"
        assert again.layout.objects.get(again.catalog.key).data != bytes(copy), "and the copy written anew"
        found = _catalog(again)
    finally:
        again.close()
    assert found == _truth(warehouse, clock)


def _unopened(js: JetStream) -> set[str]:
    return {name for name, entry in js.registry.entries.items() if entry.stream is None}


def _exact_account_info(js: JetStream) -> dict[str, Any]:
    info = js.account_info()
    js.registry.open_all()
    assert js.account_info() == info, "the counters are those of the streams opened"
    return info


def test_account_info_counts_idle_streams_from_the_copy_until_their_table_or_tombstones_change(
    warehouse: Path, clock: ManualClock
) -> None:
    js = open_engine(warehouse, clock)
    _fill(js)
    js.close()

    # a purge after the copy's counters (a tombstone commit only: the table's version stays), then a crash
    js = open_engine(warehouse, clock)
    js.purge("WQ")
    js.flush()
    crash(js)
    # a maintenance job's commit to a table (no content changed)
    DeltaTable(str(js.layout.stream_table("LIMITS"))).alter.set_table_properties({"delta.appendOnly": "false"})

    again = open_engine(warehouse, clock)
    try:
        assert _unopened(again) == {c["name"] for c in CONFIGS}
        info = again.account_info()
        assert _unopened(again) == {"PLAIN", "INTEREST"}, "the purged stream and the one a job changed were opened"
        assert info["streams"] == 4 and info["consumers"] == 4
        assert _exact_account_info(again) == info
    finally:
        again.close()

    last = open_engine(warehouse, clock)  # a clean close recorded every stream's counters
    try:
        assert last.account_info() == info and _unopened(last) == {c["name"] for c in CONFIGS}
        assert _exact_account_info(last) == info
    finally:
        last.close()


def test_a_rewrite_keeps_the_marks_of_changes_it_may_not_hold(warehouse: Path) -> None:
    """A mark goes only once the copy holds its stream's files after every change begun before the
    rewrite: not while a change is under way, nor when one began during the rewrite."""
    store = CatalogStore(Layout(warehouse, "default"))
    marks = lambda: sorted(m.key.rpartition("/")[2] for m in store.layout.objects.list(store.marks_key))  # noqa: E731
    with store.changing("A"):
        pass
    with store.changing("B"):
        assert marks() == ["A", "B"], "a mark is written before the change"
        assert store.rewrite(lambda marked: {})
        assert marks() == ["B"], "B's change is under way: its mark stays"

    def build(marked: set[str]) -> dict[str, Any]:
        with store.changing("B"):  # a change that begins while the copy is being written
            pass
        return {}

    assert store.rewrite(build) and marks() == ["B"]
    assert store.rewrite(lambda marked: {}) and marks() == [] and store.marked == 0


def test_many_changes_rewrite_the_copy_in_the_background(
    warehouse: Path, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("engine.catalog_store.REWRITE_AFTER", 4)
    js = open_engine(warehouse, clock)
    for i in range(10):
        js.add_stream({"name": f"B{i}", "subjects": [f"b{i}.>"]})
    assert js.catalog_upkeep.rewriter is not None
    js.catalog_upkeep.rewriter.join(timeout=60)
    marked = js.catalog.marked  # 0-6: the marks made while the (single) background rewrite ran stay
    assert marked < 10, "the copy was rewritten and its marks folded in"
    crash(js)
    again = JetStream(warehouse, EngineOptions(), clock=clock)
    reads = _Reads(again)
    again.open(start_flusher=False)
    try:
        assert sorted(again.stream_names()["streams"]) == sorted(f"B{i}" for i in range(10))
        read = {key.rsplit("/", 1)[1] for key in reads.keys}
        assert len(read) == marked, "only the streams still marked were read from their files"
    finally:
        again.close()


def test_counters_of_a_rewrite_before_a_crash_serve_the_next_account_info(warehouse: Path, clock: ManualClock) -> None:
    """A rewrite while streams serve (in the background, or a stop's before its index snapshots) holds
    their counters; a kill -9 later keeps them usable."""
    js = open_engine(warehouse, clock)
    _fill(js)
    js.catalog_upkeep.rewrite()
    js.publish([InboundMessage("plain.c", b"after the rewrite")])  # in PLAIN's log only, at the kill
    crash(js)

    again = open_engine(warehouse, clock)
    try:
        assert _unopened(again) == {"LIMITS", "WQ", "INTEREST"}, "PLAIN's log is replayed at start"
        info = again.account_info()
        assert _unopened(again) == {"LIMITS", "WQ", "INTEREST"}, "account info opened none of them"
        assert _exact_account_info(again) == info
    finally:
        again.close()
