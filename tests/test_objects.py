"""Object stores in the engine (ADR-20 over a stream `OBJ_<bucket>`): buckets, puts of every size around
the chunk size, JetStream's digest, atomic replacement, deletes, failed and interrupted puts (their
chunks purged, tombstoned, and rewritten away by the retention job), damage detection and watches."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from engine import JetStream, ManualClock
from engine.errors import JetStreamError
from engine.info import rfc3339
from engine.objects import DEFAULT_CHUNK_SIZE, FLUSH_AT_BYTES, ObjectInfo, chunk_subject, meta_subject
from jobs import retention
from jobs.tables import list_streams, read_tombstones
from tests.conftest import reopen
from tests.jobs.test_both_writers import table_rows

CHUNK = 1024


def sha256_digest(data: bytes) -> str:
    return "SHA-256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode()


def payload(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(f"{seed}".encode()).digest()
    return (block * (size // len(block) + 1))[:size] if size else b""


def subjects(js: JetStream, bucket: str) -> dict[str, int]:
    return dict(js.stream_info(f"OBJ_{bucket}", subjects_filter=">")["state"].get("subjects") or {})


def chunk_subjects(js: JetStream, bucket: str) -> list[str]:
    return sorted(s for s in subjects(js, bucket) if s.startswith(f"$O.{bucket}.C."))


def stream_id(js: JetStream, bucket: str) -> str:
    return next(s.stream_id for s in list_streams(js.layout) if s.name == f"OBJ_{bucket}")


def tombstoned(js: JetStream, bucket: str) -> set[int]:
    """Every sequence the tombstones of the bucket's stream name (written at the flush)."""
    js.flush()
    return {s for t in read_tombstones(js.layout, stream_id(js, bucket)) for s in range(t.first_seq, t.last_seq + 1)}


def assert_error(exc: pytest.ExceptionInfo[JetStreamError], code: int, err_code: int) -> None:
    assert (exc.value.code, exc.value.err_code) == (code, err_code), exc.value


@pytest.fixture
def bucket(js: JetStream) -> str:
    js.objects.create({"bucket": "files"})
    return "files"


def read(js: JetStream, bucket: str, name: str) -> bytes:
    info = js.objects.info(bucket, name)
    return b"".join(b"".join(batch) for batch in js.objects.read_batches(info, js.objects.chunk_seqs(info)))


# -- buckets ------------------------------------------------------------------------------------


def test_bucket_create_status_list_seal_destroy(js: JetStream) -> None:
    status, created = js.objects.create({"bucket": "docs", "description": "papers", "max_bytes": 10_000_000})
    assert created
    assert status == {
        "bucket": "docs",
        "description": "papers",
        "ttl": 0,
        "storage": "file",
        "replicas": 1,
        "sealed": False,
        "size": 0,
        "max_bytes": 10_000_000,
        "backing_store": "JetStream",
        "is_compressed": False,
        "stream": "OBJ_docs",
    }
    config = js.stream_info("OBJ_docs")["config"]
    assert config["subjects"] == ["$O.docs.C.>", "$O.docs.M.>"]
    assert (config["discard"], config["allow_rollup_hdrs"], config["allow_direct"]) == ("new", True, True)

    again, created_again = js.objects.create({"bucket": "docs", "description": "papers", "max_bytes": 10_000_000})
    assert not created_again and again == status, "an identical create is idempotent"
    with pytest.raises(JetStreamError) as exc:
        js.objects.create({"bucket": "docs", "description": "other"})
    assert_error(exc, 400, 10058)

    js.objects.create({"bucket": "alpha"})
    js.add_stream({"name": "PLAIN", "subjects": ["plain.>"]})
    listed = js.objects.list()
    assert listed["total"] == 2 and [b["bucket"] for b in listed["buckets"]] == [
        "alpha",
        "docs",
    ], "plain streams are not buckets"

    info = js.objects.put("docs", "a", b"x" * 100)
    assert js.objects.status("docs")["size"] > 100
    sealed = js.objects.seal("docs")
    assert sealed["sealed"] is True and js.objects.status("docs")["sealed"] is True
    assert read(js, "docs", "a") == b"x" * 100
    assert js.objects.info("docs", "a").nuid == info.nuid

    js.objects.destroy("docs")
    assert [b["bucket"] for b in js.objects.list()["buckets"]] == ["alpha"]
    for call in (
        lambda: js.objects.status("docs"),
        lambda: js.objects.destroy("docs"),
        lambda: js.objects.info("docs", "a"),
    ):
        with pytest.raises(JetStreamError) as exc:
            call()
        assert_error(exc, 404, 10059)


@pytest.mark.parametrize("name", ["", "a.b", "a b", "a*", "a>", "a/b", "ü", "x" * 201])
def test_invalid_bucket_names_are_refused(js: JetStream, name: str) -> None:
    with pytest.raises(JetStreamError) as exc:
        js.objects.create({"bucket": name})
    assert exc.value.code == 400
    if name:
        with pytest.raises(JetStreamError) as exc:
            js.objects.status(name)
        assert exc.value.code == 400


def test_bucket_config_is_checked(js: JetStream) -> None:
    for body in ({"bucket": "b", "ttl": -1}, {"bucket": "b", "unknown": 1}, {"bucket": 3}, {}):
        with pytest.raises(JetStreamError) as exc:
            js.objects.create(body)
        assert exc.value.code == 400, body
    assert js.objects.list()["total"] == 0


# -- put and get --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 7, 8 * CHUNK])
def test_put_get_round_trip(js: JetStream, bucket: str, clock: ManualClock, size: int) -> None:
    data = payload(size, size)
    info = js.objects.put(bucket, "dir/obj name.bin", data, chunk_size=CHUNK)
    chunks = -(-size // CHUNK)
    assert info.digest == sha256_digest(data)
    assert (info.name, info.bucket, info.size, info.chunks, info.deleted) == (
        "dir/obj name.bin",
        bucket,
        size,
        chunks,
        False,
    )
    assert len(info.nuid) == 22 and info.nuid.isalnum()
    assert info.mtime == clock.now_ns()
    assert info.to_json() == {
        "name": "dir/obj name.bin",
        "options": {"max_chunk_size": CHUNK},
        "bucket": bucket,
        "nuid": info.nuid,
        "size": size,
        "chunks": chunks,
        "digest": sha256_digest(data),
        "mtime": rfc3339(clock.now_ns()),
        "deleted": False,
    }
    assert js.objects.info(bucket, "dir/obj name.bin") == info
    seqs = js.objects.chunk_seqs(info)
    assert len(seqs) == chunks
    batches = [c for batch in js.objects.read_batches(info, seqs) for c in batch]
    assert b"".join(batches) == data
    assert all(len(c) == CHUNK for c in batches[:-1]) and (not batches or 0 < len(batches[-1]) <= CHUNK)
    expected_subjects = {meta_subject(bucket, "dir/obj name.bin"): 1}
    if chunks:
        expected_subjects[chunk_subject(bucket, info.nuid)] = chunks
    assert subjects(js, bucket) == expected_subjects


def test_meta_subject_is_padded_base64url_of_the_name(bucket: str) -> None:
    name = "ÿþ"  # base64 of it has "/" in the standard alphabet, and needs padding
    encoded = base64.urlsafe_b64encode(name.encode()).decode()
    assert "=" in encoded and ("-" in encoded or "_" in encoded)
    assert meta_subject(bucket, name) == f"$O.{bucket}.M.{encoded}"


def test_default_chunk_size_and_streamed_writes(js: JetStream, bucket: str) -> None:
    data = payload(3 * DEFAULT_CHUNK_SIZE + 5, 7)
    writer = js.objects.writer(bucket, "streamed")
    for i in range(0, len(data), 1000):  # pieces that do not line up with chunks
        writer.write(data[i : i + 1000])
    info = writer.finish(expected_digest=sha256_digest(data))
    assert (info.size, info.chunks, info.max_chunk_size) == (len(data), 4, DEFAULT_CHUNK_SIZE)
    assert read(js, bucket, "streamed") == data
    js.flush()
    assert read(js, bucket, "streamed") == data, "read back from the Delta table, not only the log"


def test_a_large_put_commits_its_chunks_as_it_goes(js: JetStream, bucket: str) -> None:
    """Without this, an upload outran the flusher: a 1 GiB put took 1.8 GB of the gateway's memory."""
    mib = 1024 * 1024
    store = js.stream(f"OBJ_{bucket}").store
    writer = js.objects.writer(bucket, "big")  # this engine has no flusher: only the writer flushes
    sha = hashlib.sha256()
    most = 0
    for i in range(3 * FLUSH_AT_BYTES // mib):
        block = payload(mib, i)
        sha.update(block)
        writer.write(block)
        most = max(most, store.pending_bytes())
    info = writer.finish()
    assert 0 < most <= FLUSH_AT_BYTES + mib
    assert (
        info.size == 3 * FLUSH_AT_BYTES and info.digest == "SHA-256=" + base64.urlsafe_b64encode(sha.digest()).decode()
    )
    assert js.flush_stats.commits >= 2
    assert hashlib.sha256(read(js, bucket, "big")).digest() == sha.digest()


def test_chunk_size_and_name_are_checked(js: JetStream, bucket: str) -> None:
    for size in (0, -1, js.options.max_payload + 1):
        with pytest.raises(JetStreamError) as exc:
            js.objects.writer(bucket, "a", chunk_size=size)
        assert_error(exc, 400, 10003)
    js.objects.put(bucket, "max", b"y" * 10, chunk_size=js.options.max_payload)
    for name in ("", "a\nb", "x" * 256):
        with pytest.raises(JetStreamError) as exc:
            js.objects.put(bucket, name, b"z")
        assert_error(exc, 400, 10003)
    with pytest.raises(JetStreamError) as exc:
        js.objects.put("nope", "a", b"z")
    assert_error(exc, 404, 10059)
    assert [i.name for i in js.objects.list_objects(bucket)] == ["max"]


def test_overwrite_replaces_atomically_and_purges_the_old_chunks(js: JetStream, bucket: str) -> None:
    first = js.objects.put(bucket, "o", payload(5 * CHUNK, 1), chunk_size=CHUNK)
    old_seqs = js.objects.chunk_seqs(first)
    writer = js.objects.writer(bucket, "o", chunk_size=CHUNK)
    writer.write(payload(3 * CHUNK + 1, 2))
    assert js.objects.info(bucket, "o") == first, "the new chunks are not visible before the info"
    assert read(js, bucket, "o") == payload(5 * CHUNK, 1)
    second = writer.finish()
    assert second.nuid != first.nuid and second.seq > first.seq
    assert read(js, bucket, "o") == payload(3 * CHUNK + 1, 2)
    assert subjects(js, bucket) == {meta_subject(bucket, "o"): 1, chunk_subject(bucket, second.nuid): 4}
    assert set(old_seqs) | {first.seq} <= tombstoned(js, bucket), "old chunks purged, the old info rolled up"
    assert [i.nuid for i in js.objects.list_objects(bucket)] == [second.nuid]


def test_reader_of_a_replaced_object_fails_loudly(js: JetStream, bucket: str) -> None:
    first = js.objects.put(bucket, "o", payload(4 * CHUNK, 1), chunk_size=CHUNK)
    seqs = js.objects.chunk_seqs(first)
    js.objects.put(bucket, "o", b"new", chunk_size=CHUNK)
    with pytest.raises(JetStreamError) as exc:
        list(js.objects.read_batches(first, seqs))
    assert exc.value.code == 500 and "damaged" in exc.value.description


def test_delete(js: JetStream, bucket: str) -> None:
    kept = js.objects.put(bucket, "kept", b"k")
    info = js.objects.put(bucket, "gone", payload(3 * CHUNK, 3), chunk_size=CHUNK)
    seqs = js.objects.chunk_seqs(info)
    deleted = js.objects.delete(bucket, "gone")
    assert (deleted.deleted, deleted.size, deleted.chunks, deleted.digest, deleted.name) == (True, 0, 0, "", "gone")
    assert deleted.to_json()["deleted"] is True and deleted.to_json()["digest"] == ""
    assert chunk_subjects(js, bucket) == [chunk_subject(bucket, kept.nuid)]
    assert set(seqs) <= tombstoned(js, bucket)
    assert [i.name for i in js.objects.list_objects(bucket)] == ["kept"]
    assert [(i.name, i.deleted) for i in js.objects.list_objects(bucket, include_deleted=True)] == [
        ("kept", False),
        ("gone", True),
    ]
    with pytest.raises(JetStreamError) as exc:
        js.objects.info(bucket, "gone")
    assert_error(exc, 404, 10037)
    assert js.objects.info(bucket, "gone", include_deleted=True).deleted

    last_seq = js.stream_info(f"OBJ_{bucket}")["state"]["last_seq"]
    assert js.objects.delete(bucket, "gone").deleted, "deleting again does nothing"
    assert js.stream_info(f"OBJ_{bucket}")["state"]["last_seq"] == last_seq
    with pytest.raises(JetStreamError) as exc:
        js.objects.delete(bucket, "never")
    assert_error(exc, 404, 10037)

    again = js.objects.put(bucket, "gone", b"back")
    assert not again.deleted and read(js, bucket, "gone") == b"back", "a deleted name can be put again"


def test_sealed_bucket_refuses_put_and_delete(js: JetStream, bucket: str) -> None:
    js.objects.put(bucket, "a", b"a")
    writer = js.objects.writer(bucket, "late", chunk_size=CHUNK)
    writer.write(payload(2 * CHUNK))
    js.objects.seal(bucket)
    with pytest.raises(JetStreamError) as exc:
        js.objects.put(bucket, "b", b"b")
    assert_error(exc, 400, 10109)
    with pytest.raises(JetStreamError) as exc:
        js.objects.delete(bucket, "a")
    assert_error(exc, 400, 10109)
    with pytest.raises(JetStreamError) as exc:
        writer.write(b"more")
        writer.finish()
    assert_error(exc, 400, 10109)
    writer.abort()  # cannot purge a sealed stream; logs and returns
    assert [i.name for i in js.objects.list_objects(bucket)] == ["a"]
    assert read(js, bucket, "a") == b"a"


def test_put_failing_midway_leaves_nothing(js: JetStream) -> None:
    js.objects.create({"bucket": "small", "max_bytes": 20 * CHUNK})
    js.objects.put("small", "fits", payload(5 * CHUNK, 1), chunk_size=CHUNK)
    before = js.stream_info("OBJ_small")["state"]["last_seq"]
    with pytest.raises(JetStreamError) as exc:
        js.objects.put("small", "big", payload(40 * CHUNK, 2), chunk_size=CHUNK)
    assert_error(exc, 503, 10077)
    assert [i.name for i in js.objects.list_objects("small")] == ["fits"]
    with pytest.raises(JetStreamError):
        js.objects.info("small", "big")
    assert len(chunk_subjects(js, "small")) == 1
    after = js.stream_info("OBJ_small")["state"]["last_seq"]
    assert after > before, "some chunks were stored before the limit"
    assert set(range(before + 1, after + 1)) <= tombstoned(js, "small"), "and purged"

    # The same through a streamed writer, failing on a later write.
    writer = js.objects.writer("small", "big2", chunk_size=CHUNK)
    writer.write(payload(10 * CHUNK, 3))
    with pytest.raises(JetStreamError) as exc:
        writer.write(payload(10 * CHUNK, 4))
    writer.abort()
    assert len(chunk_subjects(js, "small")) == 1
    assert read(js, "small", "fits") == payload(5 * CHUNK, 1)
    js.objects.put("small", "after", payload(10 * CHUNK, 5), chunk_size=CHUNK)  # the space is free again


def test_aborted_put_leaves_nothing_and_keeps_the_old_object(js: JetStream, bucket: str) -> None:
    old = js.objects.put(bucket, "o", b"old")
    writer = js.objects.writer(bucket, "o", chunk_size=CHUNK)
    writer.write(payload(3 * CHUNK))
    new_seqs = js.stream(f"OBJ_{bucket}").live_seqs(writer.subject).tolist()
    assert len(new_seqs) == 3
    writer.abort()
    assert js.objects.info(bucket, "o") == old and read(js, bucket, "o") == b"old"
    assert chunk_subjects(js, bucket) == [chunk_subject(bucket, old.nuid)]
    assert set(new_seqs) <= tombstoned(js, bucket)


def test_digest_mismatch_leaves_nothing(js: JetStream, bucket: str) -> None:
    writer = js.objects.writer(bucket, "o", chunk_size=CHUNK)
    writer.write(payload(2 * CHUNK + 3))
    with pytest.raises(JetStreamError) as exc:
        writer.finish(expected_digest=sha256_digest(b"something else"))
    assert_error(exc, 400, 10003)
    writer.abort()
    assert js.objects.list_objects(bucket, include_deleted=True) == []
    assert chunk_subjects(js, bucket) == []


def test_missing_chunk_fails_loudly(js: JetStream, bucket: str) -> None:
    info = js.objects.put(bucket, "o", payload(4 * CHUNK), chunk_size=CHUNK)
    js.flush()
    js.delete_message(f"OBJ_{bucket}", js.objects.chunk_seqs(info)[2], erase=False)
    with pytest.raises(JetStreamError) as exc:
        js.objects.chunk_seqs(info)
    assert exc.value.code == 500 and "damaged" in exc.value.description and "3 of 4" in exc.value.description

    other = js.objects.put(bucket, "p", payload(2 * CHUNK), chunk_size=CHUNK)
    js.purge(f"OBJ_{bucket}", chunk_subject(bucket, other.nuid))
    with pytest.raises(JetStreamError) as exc:
        js.objects.chunk_seqs(js.objects.info(bucket, "p"))
    assert exc.value.code == 500 and "0 of 2" in exc.value.description


# -- crashes and the retention job ----------------------------------------------------------------


@pytest.mark.spark
def test_chunks_of_an_interrupted_put_are_swept_at_open_and_rewritten_away(
    engine: list[JetStream], clock: ManualClock, spark: SparkSession
) -> None:
    js = engine[0]
    js.objects.create({"bucket": "b"})
    kept = js.objects.put("b", "kept", payload(2 * CHUNK, 1), chunk_size=CHUNK)
    replaced = js.objects.put("b", "replaced", payload(2 * CHUNK, 2), chunk_size=CHUNK)
    writer = js.objects.writer("b", "crashed", chunk_size=CHUNK)
    writer.write(payload(6 * CHUNK, 3))
    replacing = js.objects.writer("b", "replaced", chunk_size=CHUNK)
    replacing.write(payload(3 * CHUNK, 4))
    orphans = [writer.subject, replacing.subject]
    js.flush()
    path = js.layout.stream_table("OBJ_b")
    assert {s for _, s, _ in table_rows(path)} >= set(orphans), "the orphaned chunks reached the table"

    js = engine[0] = reopen(js, clock)  # closed without finish or abort: the puts were cut short
    assert chunk_subjects(js, "b") == sorted([chunk_subject("b", kept.nuid), chunk_subject("b", replaced.nuid)])
    assert read(js, "b", "kept") == payload(2 * CHUNK, 1) and read(js, "b", "replaced") == payload(2 * CHUNK, 2)
    assert [i.name for i in js.objects.list_objects("b")] == ["kept", "replaced"]
    assert js.objects.sweep_orphans() == 0, "a second sweep finds nothing"
    js.flush()

    figures = retention.run(spark, js.layout)
    assert figures["errors"] == 0
    rows = table_rows(path)
    assert not [r for r in rows if r[1] in orphans], "no row of the orphaned chunks remains"
    assert {s for _, s, _ in rows} == {
        chunk_subject("b", kept.nuid),
        chunk_subject("b", replaced.nuid),
        meta_subject("b", "kept"),
        meta_subject("b", "replaced"),
    }
    assert read(js, "b", "kept") == payload(2 * CHUNK, 1) and read(js, "b", "replaced") == payload(2 * CHUNK, 2)


def test_sweep_keeps_chunks_of_live_objects_after_a_restart(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    js.objects.create({"bucket": "b"})
    infos = {n: js.objects.put("b", str(n), payload(3 * CHUNK + n, n), chunk_size=CHUNK) for n in range(5)}
    js.objects.delete("b", "3")
    js = engine[0] = reopen(js, clock)
    for n, info in infos.items():
        if n != 3:
            assert js.objects.info("b", str(n)) == info
            assert read(js, "b", str(n)) == payload(3 * CHUNK + n, n)
    assert len(chunk_subjects(js, "b")) == 4


# -- watch ---------------------------------------------------------------------------------------


def test_watch(js: JetStream, bucket: str) -> None:
    js.objects.put(bucket, "a", b"a1")
    js.objects.put(bucket, "b", b"b1")
    js.objects.put(bucket, "a", b"a2")
    js.objects.put(bucket, "c", b"c1")
    js.objects.delete(bucket, "c")

    watch = js.objects.watch(bucket)
    initial = watch.initial()
    assert [(i.name, i.size, i.deleted) for i in initial] == [("b", 2, False), ("a", 2, False), ("c", 0, True)]
    assert all(isinstance(i, ObjectInfo) for i in initial)
    assert watch.updates() == []
    js.objects.put(bucket, "d", b"d11")
    js.objects.delete(bucket, "b")
    assert [(i.name, i.deleted) for i in watch.updates()] == [("d", False), ("b", True)]
    assert watch.updates() == []

    quiet = js.objects.watch(bucket, ignore_deletes=True)
    assert [i.name for i in quiet.initial()] == ["a", "d"]
    js.objects.delete(bucket, "a")
    js.objects.put(bucket, "e", b"e")
    assert [i.name for i in quiet.updates()] == ["e"]

    new_only = js.objects.watch(bucket, updates_only=True)
    assert new_only.initial() == []
    js.objects.put(bucket, "f", b"f")
    assert [i.name for i in new_only.updates()] == ["f"]

    history = js.objects.watch(bucket, include_history=True)
    assert [i.name for i in history.initial()] == ["c", "d", "b", "a", "e", "f"], "every info still stored"
    with pytest.raises(JetStreamError):
        js.objects.watch(bucket, include_history=True, updates_only=True)

    js.objects.destroy(bucket)
    assert watch.closed and watch.updates() == []


def test_memory_bucket(js: JetStream, tmp_path: Path) -> None:
    js.objects.create({"bucket": "mem", "storage": "memory"})
    data = payload(3 * CHUNK + 1)
    info = js.objects.put("mem", "o", data, chunk_size=CHUNK)
    assert read(js, "mem", "o") == data and info.digest == sha256_digest(data)
    js.objects.put("mem", "o", b"x", chunk_size=CHUNK)
    assert len(chunk_subjects(js, "mem")) == 1
