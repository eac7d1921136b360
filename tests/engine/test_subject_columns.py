"""The column forms of subject checks (a batch of many distinct subjects) agree with the scalar ones."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from engine.store.layout import NAMED_PARTITIONS, Partitioner
from engine.subjects import is_valid_publish_subject, matches_mask, subject_matches, valid_publish_mask

EDGES = ["a", "a.b", "a..b", ".a", "a.", "", "*", ">", "a.*", "a.>", "a.b*", "a*b", "a>", "a b", "a\tb", "a\x7fb",
         "a\x00", "é.ü", "a\u00a0b", "$KV.bucket.key", "x" * 512, "x" * 513, "é" * 512, "é" * 513, "a.*b"]


def _random_subjects(count: int) -> list[str]:
    rng = random.Random(3)
    alphabet = "ab.*> \t\x7f\x00é-_$"
    return EDGES + ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 8))) for _ in range(count)]


def test_valid_publish_mask_is_is_valid_publish_subject() -> None:
    subjects = _random_subjects(20_000)
    expected = [is_valid_publish_subject(s) for s in subjects]
    assert valid_publish_mask(pa.array(subjects, pa.string())).tolist() == expected
    assert any(expected) and not all(expected)


@pytest.mark.parametrize("filter_", ["a.>", "a.*", ">", "*", "*.b", "a", "a.b", "*.*.>", "$KV.bucket.>", "é.*"])
def test_matches_mask_is_subject_matches(filter_: str) -> None:
    subjects = [s for s in _random_subjects(20_000) if is_valid_publish_subject(s)]
    expected = [subject_matches(filter_, s) for s in subjects]
    assert matches_mask([filter_], pa.array(subjects, pa.string())).tolist() == expected
    assert any(expected)


@pytest.mark.parametrize("tokens", [0, 1, 2, 3])
def test_a_partition_column_is_what_one_call_per_subject_gives(tokens: int) -> None:
    """Including which prefixes get the named partitions (the first ones seen) and which are hashed."""
    rng = random.Random(tokens)
    subjects = [f"p{rng.randint(0, 2 * NAMED_PARTITIONS)}.q{rng.randint(0, 3)}.r{i}" for i in range(3000)]
    subjects += ["solo", "two.tokens", "p1"]
    one_by_one = Partitioner(tokens)
    expected = [one_by_one(s) for s in subjects]
    column = Partitioner(tokens)
    assert column.column(pa.array(subjects, pa.string())).to_pylist() == expected
    assert column.names() == one_by_one.names()
    if tokens:
        assert any(v.startswith("~") for v in expected) and len(np.unique(expected)) > NAMED_PARTITIONS
