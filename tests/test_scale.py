"""Lakehouse scale at a size the suite affords: 2,000,000 messages on 100,000 subjects in one stream,
a KV bucket of 100,000 keys. What must stay exact at that size: per-subject limits, `last_by_subj`,
subject paging, a purge by a wildcard across many subjects, and all of it after a restart (clean, and
one that reads no snapshot); erasing one subject among them rewrites only the files holding it; and
what must stay bounded: the table's partition folders and files.

Run apart with `-m scale` (it takes about two minutes on a quiet machine); no timing is asserted.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from engine import EngineOptions, JetStream, ManualClock
from engine.erasures import registry
from engine.messages import PlainBatch
from engine.store.layout import HASHED_PARTITIONS, NAMED_PARTITIONS
from engine.stream import SUBJECTS_PAGE
from jobs import erase

pytestmark = pytest.mark.scale

MESSAGES = 2_000_000
SUBJECTS = 100_000
ROUNDS = MESSAGES // SUBJECTS  # each subject gets one message per round, in subject order
KEEP = 19  # max_msgs_per_subject: the first round leaves when the last one comes
BATCH = 50_000
GROUPS = 100  # subject k is ord.<k % GROUPS>.<k>: a wildcard on the second token takes 1,000 subjects


def subject(k: int) -> str:
    return f"ord.{k % GROUPS}.{k}"


def seq_of(k: int, round_: int) -> int:
    return round_ * SUBJECTS + k + 1


def _open(warehouse: Path) -> JetStream:
    js = JetStream(warehouse, EngineOptions(), clock=ManualClock())
    js.open(start_flusher=False)
    return js


def _crash(js: JetStream) -> None:
    """What a kill -9 leaves: no final flush, no snapshot; the warehouse is let go."""
    for stream in js.streams():  # the streams opened: the others have no log open
        stream.store.wal.close()
    js.consumers.acks.wal.close()
    js._owner.release()


def _publish(js: JetStream, subjects: list[str], first: int, count: int, payload: pa.BinaryArray) -> None:
    for start in range(first, first + count, BATCH):
        n = min(BATCH, first + count - start)
        answer = js.publish_batch(PlainBatch([subjects[i % len(subjects)] for i in range(start, start + n)], payload[:n]))
        assert not isinstance(answer, list) or all(not isinstance(a, Exception) for a in answer)
        if (start // BATCH) % 4 == 3:
            js.flush()  # as the flusher would: the unflushed log stays small


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A warehouse with the stream ORD: 2 M messages published, 1.9 M kept by the per-subject limit."""
    warehouse = tmp_path_factory.mktemp("scale") / "warehouse"
    warehouse.mkdir()
    js = _open(warehouse)
    try:
        js.add_stream({"name": "ORD", "subjects": ["ord.>"], "max_msgs_per_subject": KEEP})
        names = [subject(k) for k in range(SUBJECTS)]
        payload = pa.array([b"m" * 100] * BATCH, pa.binary())
        _publish(js, names, 0, MESSAGES, payload)
        js.flush()
    finally:
        js.close()
    yield warehouse


def _check_stream(js: JetStream) -> None:
    stream = js.stream("ORD")
    ix = stream.index
    assert ix.msgs == SUBJECTS * KEEP
    assert ix.num_subjects == SUBJECTS
    assert (ix.first_seq, ix.last_seq) == (seq_of(0, ROUNDS - KEEP), MESSAGES)
    rng = random.Random(5)
    for k in rng.sample(range(SUBJECTS), 200):
        assert ix.subject_state(subject(k)) == (KEEP, seq_of(k, ROUNDS - KEEP), seq_of(k, ROUNDS - 1)), k
        last = stream.last_by_subject(subject(k))
        assert (last.seq, last.subject, last.data) == (seq_of(k, ROUNDS - 1), subject(k), b"m" * 100)
        gone = seq_of(k, ROUNDS - KEEP - 1)
        assert not ix.is_live(gone), "the per-subject limit removed the older ones"
    page = js.stream_info("ORD", "ord.3.*")
    assert page["total"] == SUBJECTS // GROUPS and len(page["state"]["subjects"]) == SUBJECTS // GROUPS
    assert set(page["state"]["subjects"].values()) == {KEEP}
    everything = js.stream_info("ORD", ">")
    assert everything["total"] == SUBJECTS and len(everything["state"]["subjects"]) == min(SUBJECTS, SUBJECTS_PAGE)
    tail = js.stream_info("ORD", ">", offset=SUBJECTS - 7)["state"]["subjects"]
    expected = sorted(subject(k) for k in range(SUBJECTS))[-7:]
    assert list(tail) == expected, "pages are sorted by name and start at the offset"


def test_limits_last_by_subject_and_paging_are_exact_after_a_clean_restart(loaded: Path) -> None:
    js = _open(loaded)
    try:
        _check_stream(js)
    finally:
        js.close()


def test_the_table_stays_coarse_whatever_the_subject_count(loaded: Path) -> None:
    table = loaded / "default" / "streams" / "ORD"
    folders = [p for p in table.iterdir() if p.is_dir() and p.name != "_delta_log"]
    assert folders and len(folders) <= NAMED_PARTITIONS + HASHED_PARTITIONS, [p.name for p in folders]
    files = list(table.rglob("*.parquet"))
    flushes = -(-MESSAGES // (4 * BATCH)) + 1
    assert len(files) <= flushes * len(folders), "one file per partition per flush at most"


def test_a_restart_without_snapshot_rebuilds_the_same_state(loaded: Path) -> None:
    snapshot = loaded / "default" / "_system" / "index" / "ORD.idx"
    saved = snapshot.read_bytes()
    snapshot.unlink()
    try:
        js = _open(loaded)
        try:
            _check_stream(js)
        finally:
            js.close()
    finally:
        snapshot.write_bytes(saved)


def test_a_purge_by_wildcard_across_many_subjects_survives_a_crash(loaded: Path) -> None:
    js = _open(loaded)
    purged = js.purge("ORD", "ord.7.*")
    assert purged == SUBJECTS // GROUPS * KEEP
    js.flush()
    _crash(js)
    again = _open(loaded)
    try:
        ix = again.stream("ORD").index
        assert ix.msgs == (SUBJECTS - SUBJECTS // GROUPS) * KEEP
        assert ix.num_subjects == SUBJECTS - SUBJECTS // GROUPS
        assert again.stream_info("ORD", "ord.7.*").get("total", 0) == 0
        assert len(again.stream("ORD").last_seqs("ord.7.*")) == 0
        assert ix.subject_state(subject(8)) == (KEEP, seq_of(8, ROUNDS - KEEP), seq_of(8, ROUNDS - 1))
    finally:
        again.close()


def test_a_kv_bucket_of_100k_keys_lists_them_by_filter(tmp_path: Path) -> None:
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    js = _open(warehouse)
    try:
        js.kv.create({"bucket": "PROFILES", "history": 2})
        keys = [f"{'user' if k % 4 else 'group'}.{k}" for k in range(100_000)]
        payload = pa.array([b"v" * 40] * BATCH, pa.binary())
        _publish(js, [f"$KV.PROFILES.{key}" for key in keys], 0, len(keys), payload)
        js.kv.delete("PROFILES", "user.1")
        js.flush()
        js.close()
        js = _open(warehouse)
        groups = js.kv.keys("PROFILES", "group.*")
        assert sorted(groups) == sorted(k for k in keys if k.startswith("group."))
        users = js.kv.keys("PROFILES", "user.*")
        assert len(users) == 75_000 - 1 and "user.1" not in users and "user.3" in users
        assert js.kv.get("PROFILES", "user.99999").value == b"v" * 40
        assert js.kv.status("PROFILES")["values"] == 100_001  # the delete marker is a value of the stream
        assert np.unique(js.stream("KV_PROFILES").last_seqs(">")).size == 100_000
    finally:
        js.close()


def _data_files(table: Path) -> set[Path]:
    return {p.relative_to(table) for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}


@pytest.mark.spark
def test_erasing_one_subject_among_100k_rewrites_only_the_files_holding_it(tmp_path: Path, spark: SparkSession) -> None:
    """Five flushes of 40,000 messages on 100,000 subjects; one subject's messages are all in the third.
    The erase job deletes them by sequence: that file is rewritten, the four others stay as they are."""
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    js = _open(warehouse)
    try:
        js.add_stream({"name": "GDPR", "subjects": ["ord.>"]})
        names = [subject(k) for k in range(SUBJECTS)]
        payload = pa.array([b"p" * 100] * BATCH, pa.binary())
        secret = "ord.4.secret"
        for flush in range(5):
            subjects = [names[(flush * 40_000 + i) % SUBJECTS] for i in range(40_000)]
            if flush == 2:
                subjects[::1000] = [secret] * 40
            js.publish_batch(PlainBatch(subjects, payload[:40_000]))
            js.flush()
        table = js.layout.stream_table("GDPR")
        before = _data_files(table)
        assert len(before) == 5
        answer = registry(js.layout).erase(js.stream("GDPR"), filter_=secret)
        assert answer["messages"] == 40
        figures = erase.run(spark, js.layout)
        assert figures["requests_done"] == 1 and figures["rows_deleted"] == 40
        after = _data_files(table)
        kept = before & after
        assert len(kept) == 4, "only the file holding the subject was rewritten"
        assert len(after - before) == 1
        rows = DeltaTable(str(table)).to_pyarrow_table(columns=["subject"])
        assert rows.num_rows == 200_000 - 40 and secret not in set(rows.column("subject").to_pylist())
        assert js.stream("GDPR").index.num_subjects == SUBJECTS
    finally:
        js.close()
