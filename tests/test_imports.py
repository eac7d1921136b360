"""The layering of DESIGN.md: engine/ knows nothing of HTTP or Spark; jobs/ reuses engine/store/ only
(every on-disk format has one reader and one writer, there), nothing else of the engine, nothing of api/."""

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


def test_jobs_reuse_only_the_storage_layer_of_the_engine() -> None:
    for path, names in _imports("jobs").items():
        bad = {n for n in names if n.split(".")[0] == "engine" and not n.startswith("engine.store.")}
        bad |= {n for n in names if n.split(".")[0] in {"api", "fastapi", "starlette", "uvicorn"}}
        assert not bad, f"{path} imports {bad}"


def test_jobs_keep_no_copy_of_an_engine_format() -> None:
    """The log's record header and the erasure requests' folder are read through engine/store/ only."""
    for path in (ROOT / "jobs").rglob("*.py"):
        text = path.read_text()
        for marker in ("JLW", "struct.Struct", '"erasures"'):
            assert marker not in text, f"{path.name} carries its own copy of a format ({marker})"


def test_the_gateway_does_not_load_spark_at_import() -> None:
    for path, names in _imports("api", top_level_only=True).items():
        assert not {n for n in names if n.split(".")[0] in {"pyspark", "jobs"}}, f"{path} imports Spark at module level"
