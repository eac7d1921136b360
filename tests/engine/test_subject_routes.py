"""The streams' subject routes answer as a scan of every stream's filters would (engine/subject_routes.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine import EngineOptions, JetStream, errors
from engine.subject_routes import SubjectRoutes
from engine.subjects import subject_matches, subjects_collide

TOKENS = ["a", "b", "c", "*", ">"]


def _filter(rng: random.Random) -> str:
    tokens = [rng.choice(TOKENS) for _ in range(rng.randint(1, 4))]
    if ">" in tokens:
        tokens = tokens[: tokens.index(">") + 1]
    return ".".join(tokens)


def _literal(rng: random.Random) -> str:
    return ".".join(rng.choice("abcd") for _ in range(rng.randint(1, 5)))


def test_routes_match_and_collide_as_a_scan_would() -> None:
    rng = random.Random(7)
    for _ in range(200):
        filters = {f"S{i}": [_filter(rng) for _ in range(rng.randint(1, 3))] for i in range(rng.randint(1, 6))}
        routes = SubjectRoutes()
        for name, fs in filters.items():
            routes.set(name, fs)
        dropped = rng.choice(list(filters))
        routes.discard(dropped)
        kept = {n: fs for n, fs in filters.items() if n != dropped}
        for _ in range(20):
            query = _filter(rng)
            assert routes.colliding(query) == {n for n, fs in kept.items() if any(subjects_collide(query, f) for f in fs)}
            subject = _literal(rng)
            matching = {n for n, fs in kept.items() if any(subject_matches(f, subject) for f in fs)}
            found = routes.match(subject)
            assert (found in matching) if matching else found is None


def test_replacing_a_streams_filters_forgets_the_old_ones() -> None:
    routes = SubjectRoutes()
    routes.set("ORDERS", ["orders.*", "returns.>"])
    routes.set("ORDERS", ["orders.eu.>"])
    assert routes.match("returns.x") is None and routes.match("orders.us") is None
    assert routes.match("orders.eu.1") == "ORDERS"
    routes.discard("ORDERS")
    assert routes.colliding(">") == set()


def test_a_streams_subjects_route_publishes_through_updates_and_deletes(tmp_path: Path) -> None:
    js = JetStream(tmp_path / "warehouse", EngineOptions())
    js.open(start_flusher=False)
    try:
        js.add_stream({"name": "A", "subjects": ["orders.*"]})
        with pytest.raises(errors.JetStreamError) as overlap:
            js.add_stream({"name": "B", "subjects": ["orders.>"]})
        assert overlap.value.err_code == 10065
        js.update_stream("A", {"name": "A", "subjects": ["shipments.*"]})
        assert js.stream_name_for_subject("orders.1") is None
        assert js.stream_name_for_subject("shipments.1") == "A"
        js.add_stream({"name": "B", "subjects": ["orders.>"]})
        assert js.stream_name_for_subject("orders.1.x") == "B"
        js.delete_stream("A")
        assert js.stream_name_for_subject("shipments.1") is None
        js.add_stream({"name": "C", "subjects": ["shipments.>"]})
        assert js.stream_name_for_subject("shipments.1") == "C"
    finally:
        js.close()


def test_filtered_listings_page_the_streams_a_scan_would_find(tmp_path: Path) -> None:
    """STREAM.LIST and STREAM.NAMES with a subject filter (found by the routes) list, in name order and
    page by page, exactly the streams whose subjects collide with the filter; an update moves a stream
    in or out of a filter's listing."""
    subjects = {"E": ["e.>"], "D": ["d.*.x", "d.y"], "C": ["c"], "B": ["b.*"], "A": ["a.b.c", "ab"], "F": ["f.*.f"]}
    js = JetStream(tmp_path / "warehouse", EngineOptions())
    js.open(start_flusher=False)
    try:
        for name, subs in subjects.items():
            js.add_stream({"name": name, "subjects": subs})
        js.update_stream("C", {"name": "C", "subjects": ["c", "b.c.d"]})
        subjects["C"] = ["c", "b.c.d"]
        for query in (">", "*", "*.*", "b.>", "*.*.f", "a.*.c", "d.q.x", "e", "zz.>"):
            expected = sorted(n for n, subs in subjects.items() if any(subjects_collide(query, s) for s in subs))
            assert js.stream_names(query)["streams"] == expected, query
            for offset in range(len(expected) + 1):
                page = js.list_streams(query, offset, 2)
                assert [s["config"]["name"] for s in page["streams"]] == expected[offset : offset + 2], (query, offset)
                assert page["total"] == len(expected)
                assert js.stream_names(query, offset, 2)["streams"] == expected[offset : offset + 2]
    finally:
        js.close()
