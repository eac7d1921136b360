"""The layering of DESIGN.md: engine/ knows nothing of HTTP or Spark; jobs/ reuses engine/store/ only
(every on-disk format has one reader and one writer, there), nothing else of the engine, nothing of api/."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
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


def test_jobs_reuse_only_the_storage_layer_and_the_keys_of_the_engine() -> None:
    for path, names in _imports("jobs").items():
        bad = {n for n in names if n.split(".")[0] == "engine" and not n.startswith("engine.store.") and n != "engine.keys"}
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


def test_a_single_gateway_does_not_load_what_only_a_cluster_or_the_nats_door_needs() -> None:
    """What the gateway imports before it serves is its start-up time: the proxy's HTTP client and the
    NATS door are imported when a cluster or a NATS port asks for them."""
    probe = "import sys, api.cli, api.http.app; print(sorted({'httpx', 'api.nats.server', 'pyspark'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    loaded = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


_GATEWAY_WITHOUT_DELTA_RS = """
import shutil, sys, tempfile, api.cli, api.http.app
from engine import EngineOptions, JetStream
folder = tempfile.mkdtemp(prefix="jetlake-tests-")
for _ in range(2):  # a start, then a restart that recovers from the tables
    js = JetStream(folder + "/wh", EngineOptions())
    js.open(start_flusher=False)
    if "S" not in js.stream_names()["streams"]:
        js.add_stream({"name": "S", "subjects": ["s.>"], "max_msgs_per_subject": 1})
        js.add_consumer("S", {"durable_name": "C", "ack_policy": "explicit"})
    for i in range(3):
        js.publish_one(f"s.{i % 2}", b"x")
    js.flush()
    js.flusher.settle()
    assert js.stream("S").get(js.stream("S").index.last_seq).data == b"x"
    js.close()
shutil.rmtree(folder)
print(sorted(m for m in sys.modules if m.split(".")[0] in ("deltalake", "pyspark", "delta")))
"""


def test_the_gateway_does_not_load_delta_rs() -> None:
    """The gateway reads and writes its Delta logs itself (engine/store/delta_log.py): delta-rs's module
    is 134 MB, of which importing it mapped 26 MB into the gateway and committing through it more.
    Publishing, flushing, per-subject limits, consumers and a restart load neither it nor Spark."""
    assert not {p for p, names in _imports("engine").items() if {"deltalake"} & {n.split(".")[0] for n in names}}
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    loaded = subprocess.run([sys.executable, "-c", _GATEWAY_WITHOUT_DELTA_RS], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"


def test_the_front_doors_do_not_know_each_other() -> None:
    """api/http/ and api/nats/ share api/auth.py and api/waiters.py and the engine, nothing of each other."""
    for door, other in (("api/http", "api.nats"), ("api/nats", "api.http")):
        for path, names in _imports(door).items():
            bad = {n for n in names if n == other or n.startswith(other + ".")}
            assert not bad, f"{path} imports {bad}"


def _module_graph(folder: str) -> dict[str, set[str]]:
    """Module -> the modules of `folder` it imports, TYPE_CHECKING imports included (a type hint
    pointing up is a circle too: the lower room would know the upper one)."""
    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p for p in (ROOT / folder).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(t for a in node.names if (t := known(a.name)))
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in modules else known(node.module)
                    if target:
                        targets.add(target)
        graph[module] = targets - {module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_engine_has_no_import_circles() -> None:
    """stream/consumer, jetstream/buckets, store base/rows and the object store's location/s3 were circles."""
    assert _circles(_module_graph("engine")) == []


def test_the_front_doors_have_no_import_circles() -> None:
    """A lower room of a door (the sublist, deliveries, writes) takes a narrow Protocol or a callback
    from the room above it, never the upper class itself: not even in a type hint."""
    assert _circles(_module_graph("api")) == []
