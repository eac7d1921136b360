"""The subject table's bulk lookups stay right when its bounded front dict is cleared under them."""

from __future__ import annotations

from engine.subject_table import _FRONT, SubjectTable


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
