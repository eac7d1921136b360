"""The fault-injection suite: every test here carries the `faults` marker, so CI can run the suite in a
process of its own (`pytest -m faults`, beside `pytest -m "not faults"`); plain `pytest` runs it too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.store import failpoints

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def armed() -> Iterator[Callable[[str], None]]:
    """Arms failpoints in this process (`armed("wal.append=eio@1")`); disarmed after the test."""
    yield failpoints.arm
    failpoints.disarm()
