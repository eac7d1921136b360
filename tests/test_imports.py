"""The layering of DESIGN.md: engine/ knows nothing of HTTP or Spark; jobs/ reuses only layout, leases and
the storage interface."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(folder: str, top_level_only: bool = False) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / folder).rglob("*.py"):
        tree = ast.parse(path.read_text())
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        names: set[str] = set()
        for node in nodes:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


def test_engine_knows_nothing_of_http_or_spark() -> None:
    for path, names in _imports("engine").items():
        bad = {n for n in names if n.split(".")[0] in {"fastapi", "starlette", "uvicorn", "pyspark", "delta", "api", "jobs"}}
        assert not bad, f"{path} imports {bad}"


def test_jobs_reuse_only_layout_and_lease_from_the_engine() -> None:
    for path, names in _imports("jobs").items():
        allowed = {"engine.store.layout", "engine.store.lease", "engine.store.leases", "engine.store.objectstore",
                   "engine.store.objectstore.location"}
        bad = {n for n in names if n.split(".")[0] == "engine" and n not in allowed}
        bad |= {n for n in names if n.split(".")[0] in {"api", "fastapi"}}
        assert not bad, f"{path} imports {bad}"


def test_the_gateway_does_not_load_spark_at_import() -> None:
    for path, names in _imports("api", top_level_only=True).items():
        assert not {n for n in names if n.split(".")[0] in {"pyspark", "jobs"}}, f"{path} imports Spark at module level"
