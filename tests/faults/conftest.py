"""The fault-injection suite: every test here carries the `faults` marker, so CI can run the suite in a
process of its own (`pytest -m faults`, beside `pytest -m "not faults"`); plain `pytest` runs it too."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(item.fspath).parents:
            item.add_marker(pytest.mark.faults)
