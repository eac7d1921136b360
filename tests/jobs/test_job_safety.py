"""The jobs are safe and restartable: a `jetlake jobs run` killed with SIGKILL at several points is
finished by a rerun, with the table's retention properties back at their custom values; a stream
deleted and re-created during a run keeps every acknowledged message; one failing stream does not
stop the others; a stream with a long (hashed) config file name is found."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

import engine.store.delta
import jobs.erase
import jobs.retention
import jobs.tables
from engine import JetStream
from engine.erasures import registry
from jobs import compact, erase, retention
from jobs.tables import read_tombstones
from tests.jobs.kills import kill_job_at
from tests.jobs.test_both_writers import table_rows
from tests.residue import find_residue, needles_for

pytestmark = pytest.mark.spark

CUSTOM = {"delta.deletedFileRetentionDuration": "interval 10 days", "delta.logRetentionDuration": "interval 45 days"}


def _properties(path: Path) -> dict[str, str]:
    return DeltaTable(str(path)).metadata().configuration


def test_a_killed_erase_run_is_finished_by_a_rerun_with_the_custom_properties_restored(
    js: JetStream, spark: SparkSession
) -> None:
    js.add_stream({"name": "K", "subjects": ["k.>"]})
    path = js.layout.stream_table("K")
    DeltaTable(str(path)).alter.set_table_properties(CUSTOM)
    marker = "zq7marker" + secrets.token_hex(8)
    kept = {}
    for i in range(6):
        js.publish_one(f"k.{marker}", f"{marker} {i}".encode())
        kept[js.publish_one("k.kept", f"kept {i}".encode()).seq] = f"kept {i}".encode()
        js.flush()
    answer = registry(js.layout).erase(js.stream("K"), filter_=f"k.{marker}")
    js.flush()

    for step in ("erase.retention_zeroed", "erase.retention_restored", "erase.tombstones_removed"):
        kill_job_at(js.layout.warehouse, "erase", step)
        assert registry(js.layout).get(answer["id"])["status"] == "pending", step
        if step == "erase.retention_zeroed":  # the moment defect 14 lost the custom values
            config = _properties(path)
            assert all(config[k] == erase.ZERO for k in CUSTOM) and erase.SAVED_RETENTION in config

    figures = erase.run(spark, js.layout)

    assert figures["requests_done"] == 1 and figures["errors"] == 0, figures
    status = registry(js.layout).get(answer["id"])
    assert status["status"] == "done" and status["receipt"]["verification"]["verified"] is True
    config = _properties(path)
    assert {k: config.get(k) for k in CUSTOM} == CUSTOM and erase.SAVED_RETENTION not in config
    assert not [t for t in read_tombstones(js.layout) if t.erase]
    assert [r[0] for r in table_rows(path)] == sorted(kept)
    assert not find_residue(js.layout.warehouse, needles_for(marker))
    for seq, data in kept.items():
        assert js.get_message("K", seq).data == data
    assert erase.run(spark, js.layout)["requests_done"] == 0


def test_killed_retention_and_compaction_runs_are_finished_by_a_rerun(js: JetStream, spark: SparkSession) -> None:
    js.add_stream({"name": "R", "subjects": ["r.*"]})
    live: dict[int, bytes] = {}
    for i in range(40):  # 40 commits: small files for compaction
        live[js.publish_one(f"r.{i % 2}", f"m{i}".encode()).seq] = f"m{i}".encode()
        js.flush()
    for seq in range(1, 41, 4):
        js.delete_message("R", seq, erase=False)
        live.pop(seq)
    js.flush()
    path = js.layout.stream_table("R")

    for step in ("retention.delete", "retention.deleted"):
        kill_job_at(js.layout.warehouse, "retention", step)
    assert [r[0] for r in table_rows(path)] == sorted(live), "the second kill came after the DELETE"
    assert len(read_tombstones(js.layout)) == 10, "no tombstone went before the rerun"
    figures = retention.run(spark, js.layout)
    assert figures["errors"] == 0 and figures["rows_deleted"] == 0 and figures["tombstones_removed"] == 10
    assert read_tombstones(js.layout) == []

    files = len(DeltaTable(str(path)).file_uris())
    kill_job_at(js.layout.warehouse, "compact", "compact.optimized")  # after OPTIMIZE, before checkpoint and vacuum
    assert len(DeltaTable(str(path)).file_uris()) <= 2 < files
    figures = compact.run(spark, js.layout)
    assert figures["errors"] == 0
    assert len(DeltaTable(str(path)).file_uris()) <= 2 < files
    assert table_rows(path) == sorted((s, f"r.{int(d[1:]) % 2}", d) for s, d in live.items())
    for seq, data in live.items():
        assert js.get_message("R", seq).data == data
    version = DeltaTable(str(path)).version()
    assert compact.run(spark, js.layout)["files_removed"] == 0 and retention.run(spark, js.layout)["rows_deleted"] == 0
    assert DeltaTable(str(path)).version() == version


# -- a stream deleted and re-created between a job's read and its commit ------------------------------


@contextmanager
def recreated_when_leased(
    monkeypatch: pytest.MonkeyPatch, lease: Path, action: Callable[[], None]
) -> Iterator[list[int]]:
    """Runs `action` (delete and re-create the stream) the first time a job asks for a table's
    `lease`, before it gets it: after the job has read what it will act on."""
    calls: list[int] = []
    real = jobs.tables.commit_lease

    @contextmanager
    def hooked(path: Path, *args: Any, **kwargs: Any) -> Iterator[None]:
        if path == lease and not calls:
            calls.append(1)
            action()
        with real(path, *args, **kwargs):
            yield

    for module in (jobs.tables, jobs.retention, jobs.erase):
        monkeypatch.setattr(module, "commit_lease", hooked, raising=False)
    yield calls


def _recreate(js: JetStream, name: str, count: int) -> Callable[[], dict[int, bytes]]:
    made: dict[int, bytes] = {}

    def action() -> None:
        js.delete_stream(name)
        js.add_stream({"name": name, "subjects": [f"{name.lower()}.>"]})
        for i in range(count):
            made[js.publish_one(f"{name.lower()}.new", f"acknowledged {i}".encode()).seq] = f"acknowledged {i}".encode()
        js.flush()

    action.made = made  # type: ignore[attr-defined]
    return action  # type: ignore[return-value]


def test_retention_keeps_the_messages_of_a_stream_recreated_meanwhile(
    js: JetStream, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    js.add_stream({"name": "RE", "subjects": ["re.>"]})
    for i in range(10):
        js.publish_one("re.old", f"old {i}".encode())
    js.flush()
    js.purge("RE", seq=6)  # tombstones 1..5 of the first stream
    js.flush()
    action = _recreate(js, "RE", 10)
    with recreated_when_leased(monkeypatch, js.layout.lease_file(js.layout.stream_table("RE")), action) as calls:
        figures = retention.run(spark, js.layout)
    assert calls, "the hook ran"
    made = action.made  # type: ignore[attr-defined]
    rows = DeltaTable(str(js.layout.stream_table("RE"))).to_pyarrow_table(columns=["seq", "data"])
    assert dict(zip(rows.column("seq").to_pylist(), rows.column("data").to_pylist(), strict=True)) == made
    assert figures["streams_changed"] == 1 and figures["rows_deleted"] == 0, figures
    for seq, data in made.items():
        assert js.get_message("RE", seq).data == data


def test_the_erase_job_keeps_the_messages_of_a_stream_recreated_meanwhile(
    js: JetStream, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    js.add_stream({"name": "ER", "subjects": ["er.>"]})
    for i in range(10):
        js.publish_one("er.old", f"old {i}".encode())
    js.flush()
    answer = registry(js.layout).erase(js.stream("ER"), filter_="er.old")
    js.flush()
    action = _recreate(js, "ER", 10)
    with recreated_when_leased(monkeypatch, js.layout.lease_file(js.layout.stream_table("ER")), action) as calls:
        figures = erase.run(spark, js.layout)
    assert calls, "the hook ran"
    made = action.made  # type: ignore[attr-defined]
    assert figures["requests_done"] == 1 and figures["rows_deleted"] == 0, figures
    assert registry(js.layout).get(answer["id"])["receipt"]["stream_deleted"] is True
    rows = DeltaTable(str(js.layout.stream_table("ER"))).to_pyarrow_table(columns=["seq", "data"])
    assert dict(zip(rows.column("seq").to_pylist(), rows.column("data").to_pylist(), strict=True)) == made


def test_stream_delete_and_create_wait_for_a_jobs_lease(js: JetStream, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a job holds a table's commit lease, a delete or a create of its stream asks for the lease
    and changes nothing in the folder before it has it."""
    js.add_stream({"name": "L", "subjects": ["l.>"]})
    js.publish_one("l.a", b"x")
    js.flush()
    table = js.layout.stream_table("L")
    lease = js.layout.lease_file(table)
    asked = threading.Event()
    real = engine.store.delta.commit_lease

    def watched(path: Path, *args: Any, **kwargs: Any) -> Any:
        if path == lease:
            asked.set()
        return real(path, *args, **kwargs)

    monkeypatch.setattr(engine.store.delta, "commit_lease", watched)
    for operation, before, after in (
        (lambda: js.delete_stream("L"), True, False),
        (lambda: js.add_stream({"name": "L", "subjects": ["l.>"]}), False, True),
    ):
        asked.clear()
        with jobs.tables.commit_lease(lease):
            worker = threading.Thread(target=operation)
            worker.start()
            assert asked.wait(30), "the engine asks for the table's lease"
            assert (table / "_delta_log").is_dir() is before, "nothing changes while the job holds it"
        worker.join(timeout=60)
        assert not worker.is_alive() and (table / "_delta_log").is_dir() is after


# -- per-stream isolation and the layout's names --------------------------------------------------


def test_one_failing_stream_does_not_stop_the_others_and_long_names_are_found(
    js: JetStream, spark: SparkSession
) -> None:
    long_name = "L" * 230  # its config file name is hashed by the layout
    names = ["A_BROKEN", "B_FINE", long_name]
    ids = {}
    for name in names:
        js.add_stream({"name": name, "subjects": [f"{name[:20].lower()}.>"]})
        for i in range(3):
            js.publish_one(f"{name[:20].lower()}.x", f"{name[:20]} {i}".encode())
        js.flush()
        ids[name] = registry(js.layout).erase(js.stream(name), seq=2)["id"]
        js.flush()
    assert not js.layout.stream_configs.joinpath(f"{long_name}.json").exists()
    broken = js.layout.stream_table("A_BROKEN") / "_delta_log" / "00000000000000000001.json"
    broken.write_bytes(b"{not a delta commit")

    figures = erase.run(spark, js.layout)

    assert figures["streams_failed"] == 1 and figures["errors"] == 1 and list(figures["failed_streams"]) == ["A_BROKEN"]
    assert figures["per_stream"]["A_BROKEN"]["status"] == "failed"
    assert figures["per_stream"]["B_FINE"] == {"requests": 1, "done": 1, "status": "done"}
    assert figures["per_stream"][long_name]["status"] == "done"
    assert registry(js.layout).get(ids["A_BROKEN"])["status"] == "pending"
    for name in names[1:]:
        assert registry(js.layout).get(ids[name])["status"] == "done"
        assert [r[0] for r in table_rows(js.layout.stream_table(name))] == [1, 3]
    erase_tombstones = {t.stream_id for t in read_tombstones(js.layout) if t.erase}
    assert erase_tombstones == {js.stream("A_BROKEN").stream_id}, "done streams' erase tombstones are removed"
