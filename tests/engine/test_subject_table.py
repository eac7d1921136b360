"""The subject table: bulk lookups stay right when its bounded front dict is cleared under them, and its
compact lookup table (ids in slots, hashes per id) stays exact through forgetting and restarts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine.errors import NoMessageFoundError
import xxhash

from engine import subject_table
from engine.subject_table import _FRONT, SubjectTable, _hash, _place_many


def test_bulk_ids_survive_the_front_dict_being_cleared_during_the_lookup() -> None:
    table = SubjectTable()
    first = [f"a.{i}" for i in range(_FRONT - 10)]
    ids = table.ids(first)  # remembered in the front dict, which is now nearly full
    later = [f"b.{i}" for i in range(100)]  # misses: interning them clears the front dict
    mixed = first[:50] + later + first[-50:]
    got = table.ids(mixed).tolist()
    assert got[:50] == ids[:50].tolist() and got[-50:] == ids[-50:].tolist()
    assert [table.name(sid) for sid in got] == mixed
    assert table.ids(later).tolist() == got[50:150]


def test_lookups_and_a_snapshot_round_trip_stay_exact_with_forgotten_subjects() -> None:
    """The lookup table holds ids only (the hashes live per id): bulk and single lookups, forgetting,
    re-interning and a snapshot's arrays (still a hash per slot) agree with a plain dict."""
    table = SubjectTable()
    names = [f"orders.{i}" for i in range(30_000)]
    expected = dict(zip(names, table.ids(names).tolist(), strict=True))
    expected.update({f"users.{i}": table.id(f"users.{i}") for i in range(500)})  # one by one
    assert len(set(expected.values())) == len(expected) == table.count
    gone = np.array([expected[f"orders.{i}"] for i in range(0, 30_000, 3)], np.int64)
    table.msgs[: table.count] = 1
    table.msgs[gone] = 0
    assert table.forget(gone) == len(gone)
    arrays = table.to_arrays()
    live_slots = arrays["subject_slots"] > 1
    ids, hashes = arrays["subject_slot_ids"][live_slots][:500], arrays["subject_slots"][live_slots][:500]
    assert all(_hash(table.name_bytes(int(sid))) == int(h)  # the snapshot's layout: the hash of the slot's id
               for sid, h in zip(ids, hashes, strict=True))
    for current in (table, SubjectTable.from_arrays(arrays)):
        for name, sid in expected.items():
            forgotten = name.startswith("orders.") and int(name.split(".")[1]) % 3 == 0
            assert current.find(name) == (-1 if forgotten else sid)
        probe = [f"orders.{i}" for i in range(0, 30_000, 7)]
        assert current.ids(probe[1::3]).tolist() == [expected[n] for n in probe[1::3]]  # not forgotten (i % 3 != 0)
        again = current.id("orders.0")  # forgotten, seen again: a new id, found from now on
        assert again >= 30_500 and current.find("orders.0") == again
        assert current.find("nobody.here") == -1


def test_a_hundred_thousand_subjects_stay_exact_through_a_restart_and_a_crash(warehouse: Path,
                                                                            clock: ManualClock) -> None:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    js.add_stream({"name": "K", "subjects": ["k.>"]})
    n = 100_000
    for start in range(0, n, 5000):
        js.publish([InboundMessage(f"k.{i % 10}.{i}", f"v{i}".encode()) for i in range(start, start + 5000)])
    js.publish([InboundMessage("k.3.33", b"again")])
    js.flush()
    js.purge("K", "k.9.>")  # a wildcard purge across 10,000 subjects
    js.flush()
    for how in ("restart", "crash"):
        if how == "restart":
            js.close()
        else:
            for stream in js.streams():
                stream.store.wal.close()
            js.consumers.acks.wal.close()
            js._owner.release()
        js = JetStream(warehouse, EngineOptions(), clock=clock)
        js.open(start_flusher=False)
        stream = js.stream("K")
        state = stream.state(subjects_filter="k.3.*")
        assert state["num_subjects"] == 90_000 and state["messages"] == 90_001
        assert state["subjects_total"] == 10_000
        assert state["subjects"]["k.3.33"] == 2 and state["subjects"]["k.3.3"] == 1
        assert stream.last_by_subject("k.3.33").data == b"again"
        for i in (0, 1, 12_345, 99_998):
            assert stream.last_by_subject(f"k.{i % 10}.{i}").data == f"v{i}".encode()
        with pytest.raises(NoMessageFoundError):
            stream.last_by_subject("k.9.99999")
    js.close()


def test_state_columns_are_int32_until_a_sequence_past_31_bits_and_stay_exact_across_it() -> None:
    """The per-subject (msgs, first, last) columns are int32 for a stream's first 2**31 - 1 sequences and
    widen before a larger one is written (numpy's array assignment would wrap it silently); a snapshot
    keeps its int64 arrays, and one taken before the columns were narrow loads narrow."""
    from engine.index import MessageIndex  # noqa: PLC0415

    edge = 2**31 - 1
    index = MessageIndex()
    index.append_run(edge - 3, ["a.1", "a.2", "a.1"], [1, 1, 1], 1)
    index.append(edge, "a.3", 1, 2)
    table = index.subjects
    assert table.last.dtype == np.int32 and table.state("a.1") == (2, edge - 3, edge - 1)
    snapshot = table.to_arrays()
    assert {snapshot[k].dtype for k in ("subject_msgs", "subject_first", "subject_last")} == {np.dtype(np.int64)}
    assert SubjectTable.from_arrays(snapshot).last.dtype == np.int32

    index.append_run(edge + 1, ["a.1", "a.4"], [1, 1], 3)
    index.append(edge + 9, "a.2", 1, 4)
    assert table.last.dtype == np.int64
    assert [table.state(s) for s in ("a.1", "a.2", "a.3", "a.4")] == [
        (3, edge - 3, edge + 1), (2, edge - 2, edge + 9), (1, edge, edge), (1, edge + 2, edge + 2)]
    assert index.last_seqs("a.*").tolist() == [edge, edge + 1, edge + 2, edge + 9]
    index.remove_many(np.array([edge - 3, edge + 1], np.int64))
    assert table.state("a.1") == (1, edge - 1, edge - 1)
    wide = SubjectTable.from_arrays(table.to_arrays())
    assert wide.last.dtype == np.int64 and wide.state("a.2") == (2, edge - 2, edge + 9)


def test_a_snapshot_of_64_bit_hashes_loads_exactly_with_32_bit_ones() -> None:
    """Snapshots written before the hashes were narrowed hold a 64-bit hash per slot, each id at the slot
    its full hash's low bits give: they load into the narrow table (ids placed again) and every name
    is found under its id, forgotten slots dropped."""
    table = SubjectTable()
    names = [f"orders.{i}" for i in range(5_000)]
    ids = table.ids(names)
    table.msgs[: table.count] = 1
    table.msgs[ids[::4]] = 0
    table.forget(ids[::4])
    arrays = table.to_arrays()
    assert arrays["subject_slots"].dtype == np.uint32 and int(arrays["subject_slots"].max()) <= 0xFFFFFFFF
    live = [int(sid) for sid in ids if table.find(table.name(int(sid))) == int(sid)]
    wide = np.array([max(xxhash.xxh3_64_intdigest(table.name_bytes(sid)), 2) for sid in live], np.uint64)
    slot_ids = np.full(len(arrays["subject_slot_ids"]), -1, np.int32)
    _place_many(slot_ids, wide, np.array(live, np.int32))  # where the old code put them
    old = dict(arrays)
    old["subject_slots"] = np.zeros(len(slot_ids), np.uint64)
    old["subject_slots"][slot_ids >= 0] = wide[np.searchsorted(live, slot_ids[slot_ids >= 0])]
    old["subject_slot_ids"] = np.maximum(slot_ids, 0)
    loaded = SubjectTable.from_arrays(old)
    assert loaded._hashes.dtype == np.uint32
    assert all(loaded.find(table.name(sid)) == sid for sid in live)
    assert loaded.find(names[0]) == -1  # forgotten
    assert loaded.ids(names[1:400:4]).tolist() == ids[1:400:4].tolist()
    assert loaded.id("orders.new") == table.count


def test_name_offsets_are_uint32_and_widen_before_the_arena_passes_their_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """The arena's offsets are uint32 (4 bytes a subject) and become int64 before an offset past their
    range is written (numpy would wrap it silently); names stay exact across it and through a snapshot."""
    monkeypatch.setattr(subject_table, "_NARROW_OFFSET_MAX", 1_000)
    table = SubjectTable()
    table.ids([f"k.{i:03d}" for i in range(100)])  # 500 bytes of names
    assert table._offsets.dtype == np.uint32
    table.id("single.one")
    table.ids([f"k.{i:03d}" for i in range(100, 200)])  # past 1,000 bytes
    assert table._offsets.dtype == np.int64
    names = [f"k.{i:03d}" for i in range(200)] + ["single.one"]
    for current in (table, SubjectTable.from_arrays(table.to_arrays())):
        assert sorted(current.name(sid) for sid in range(current.count)) == sorted(names)
        assert all(current.name(current.find(n)) == n for n in names)
    assert SubjectTable.from_arrays(table.to_arrays())._offsets.dtype == np.int64


def test_new_subjects_one_by_one_after_a_bulk_batch_grow_every_column() -> None:
    """A batch of new subjects grows the offsets one longer than the per-id columns, and each growth after
    that widened the gap: adding subjects one by one (KV puts of new keys) then reached an id the offsets
    had room for and the per-id columns did not (an IndexError on the publish path)."""
    table = SubjectTable()
    table.ids([f"bulk.{i}" for i in range(1_000)])
    table.id("one.0")
    table.ids([f"more.{i}" for i in range(999)])
    singles = [table.id(f"one.{i}") for i in range(1, 3_000)]
    assert singles == list(range(2_000, 4_999))
    assert table.find("bulk.0") == 0 and table.find("one.2999") == 4_998 and table.count == 4_999


@pytest.mark.parametrize("seed", range(6))
def test_random_interning_forgetting_and_snapshots_match_a_dict(seed: int) -> None:
    """Random single and bulk interning (new and known names, batches of every size), forgetting and
    snapshot round trips, against a plain dict: every name keeps its id until forgotten, forgotten names
    are not found, and names seen again get fresh ids. Growth of every column is crossed many times."""
    rng = np.random.default_rng(seed)
    table, model, next_id = SubjectTable(), {}, 0
    universe = [f"s.{i}.{'x' * int(rng.integers(0, 12))}" for i in range(20_000)]
    for _ in range(300):
        op = rng.integers(0, 10)
        if op < 4:  # one name at a time (a KV put of a new key)
            for name in rng.choice(universe, int(rng.integers(1, 400))).tolist():
                if name not in model:
                    model[name], next_id = next_id, next_id + 1
                assert table.id(name) == model[name]
        elif op < 8:  # a batch, duplicates and known names included
            batch = rng.choice(universe, int(rng.integers(1, 3_000))).tolist()
            for name in dict.fromkeys(batch):
                if name not in model:
                    model[name], next_id = next_id, next_id + 1
            assert table.ids(batch).tolist() == [model[n] for n in batch]
        elif op < 9 and model:  # some subjects lose their last message and are forgotten
            table.msgs[: table.count] = 1
            gone = rng.choice(list(model), min(len(model), int(rng.integers(1, 200))), replace=False).tolist()
            table.msgs[[model[n] for n in gone]] = 0
            table.forget(np.array([model[n] for n in gone], np.int64))
            for name in gone:
                del model[name]
        else:
            table = SubjectTable.from_arrays(table.to_arrays())
        assert table.count == next_id
    for name in universe[::7]:
        assert table.find(name) == model.get(name, -1)
    assert all(table.name(sid) == name for name, sid in model.items())
