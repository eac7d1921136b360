"""The storage interface's contract, run on both backends: a local folder and the real S3 server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from engine.store.objectstore import (
    ObjectExistsError,
    ObjectNotFoundError,
    ObjectStore,
    PreconditionFailedError,
    S3Settings,
    WarehouseLocation,
    to_delta_uri,
    to_spark_uri,
)
from engine.store.objectstore.local import LocalObjectStore
from tests.s3 import S3Server

WRITERS = 6


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    if request.param == "local":
        backend: ObjectStore = WarehouseLocation.parse(tmp_path / "warehouse").open()
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        backend = server.location().open()
    yield backend
    backend.close()


def test_put_get_head_delete(store: ObjectStore) -> None:
    written = store.put("a/config.json", b'{"x": 1}')
    got = store.get("a/config.json")
    assert got.data == b'{"x": 1}'
    assert got.version == written.version == store.head("a/config.json").version
    assert store.head("a/config.json").size == 8
    store.delete("a/config.json")
    with pytest.raises(ObjectNotFoundError):
        store.get("a/config.json")
    with pytest.raises(ObjectNotFoundError):
        store.head("a/config.json")
    store.delete("a/config.json")  # idempotent, as S3's DELETE


def test_a_folder_is_no_object(store: ObjectStore) -> None:
    store.put("folder/inner", b"x")
    with pytest.raises(ObjectNotFoundError):
        store.get("folder")
    with pytest.raises(ObjectNotFoundError):
        store.head("folder")
    with pytest.raises(ObjectNotFoundError):
        store.get_stream("folder")


def test_put_replaces_the_whole_object_and_changes_its_version(store: ObjectStore) -> None:
    first = store.put("k", b"x" * 100)
    second = store.put("k", b"short")
    assert store.get("k").data == b"short"
    assert second.version != first.version


def test_create_is_put_if_absent(store: ObjectStore) -> None:
    store.create("once", b"first")
    with pytest.raises(ObjectExistsError):
        store.create("once", b"second")
    assert store.get("once").data == b"first"


def test_replace_is_compare_and_swap_on_the_version(store: ObjectStore) -> None:
    v1 = store.create("state", b"1").version
    v2 = store.replace("state", b"2", v1).version
    with pytest.raises(PreconditionFailedError):
        store.replace("state", b"stale", v1)
    assert store.get("state").data == b"2"
    store.delete("state")
    with pytest.raises(PreconditionFailedError):
        store.replace("state", b"gone", v2)
    with pytest.raises(ObjectNotFoundError):
        store.get("state")


def test_concurrent_creates_have_one_winner(store: ObjectStore) -> None:
    barrier = threading.Barrier(WRITERS)

    def create(i: int) -> bool:
        barrier.wait(timeout=30)
        try:
            store.create("race", str(i).encode())
            return True
        except ObjectExistsError:
            return False

    with ThreadPoolExecutor(WRITERS) as pool:
        won = list(pool.map(create, range(WRITERS)))
    assert won.count(True) == 1
    assert store.get("race").data == str(won.index(True)).encode()


def test_concurrent_compare_and_swap_loses_no_increment(store: ObjectStore) -> None:
    """Each writer adds 1 to a counter by read, compute, replace-at-version, retry: none is lost."""
    store.create("counter", b"0")
    increments = 5

    def add(_: int) -> int:
        retries = 0
        for _ in range(increments):
            while True:
                current = store.get("counter")
                try:
                    store.replace("counter", str(int(current.data) + 1).encode(), current.version)
                    break
                except PreconditionFailedError:
                    retries += 1
        return retries

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(add, range(WRITERS)))
    assert int(store.get("counter").data) == WRITERS * increments


def test_list_is_recursive_in_key_order_under_a_folder(store: ObjectStore) -> None:
    for key in ["s/b/2", "s/a", "s/b/1", "sx/other", "top"]:
        store.put(key, key.encode())
    assert [meta.key for meta in store.list("s")] == ["s/a", "s/b/1", "s/b/2"]
    assert [meta.key for meta in store.list("s/")] == ["s/a", "s/b/1", "s/b/2"]
    assert [meta.key for meta in store.list("")] == ["s/a", "s/b/1", "s/b/2", "sx/other", "top"]
    assert [(m.key, m.size) for m in store.list("s/b")] == [("s/b/1", 5), ("s/b/2", 5)]
    assert list(store.list("nothing")) == []


def test_large_objects_stream_in_and_out_and_read_by_range(store: ObjectStore) -> None:
    chunk = bytes(range(256)) * 4096  # 1 MiB
    meta = store.put("big/object", (chunk for _ in range(8)))
    assert meta.size == 8 * len(chunk) == store.head("big/object").size
    pieces = list(store.get_stream("big/object", chunk_size=1 << 20))
    assert len(pieces) > 1, "streamed in chunks, not read whole"
    assert b"".join(pieces) == chunk * 8
    assert store.get_range("big/object", 1000, 1010) == chunk[1000:1010]
    assert store.get_range("big/object", meta.size - 3, meta.size + 100) == chunk[-3:]
    assert store.get_range("big/object", meta.size + 5, meta.size + 9) == b""
    with pytest.raises(ObjectNotFoundError):
        store.get_stream("big/missing")


@pytest.mark.parametrize("key", ["", "/abs", "a//b", "a/../b", "./a", "a/", ".jl-tmp-x", "a/.jl-tmp-1"])
def test_keys_that_could_escape_or_collide_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.put(key, b"x")


def test_local_writes_leave_no_temporary_file(tmp_path: Path) -> None:
    store = LocalObjectStore(tmp_path / "w")
    store.put("a/b", b"1")
    store.create("a/c", b"2")
    store.replace("a/b", b"3", store.head("a/b").version)
    with pytest.raises(ObjectExistsError):
        store.create("a/c", b"again")
    with pytest.raises(PreconditionFailedError):
        store.replace("a/b", b"stale", "nope")
    assert sorted(p.name for p in (tmp_path / "w" / "a").iterdir()) == ["b", "c"]


def test_s3_bucket_is_created_when_missing(s3_server: S3Server) -> None:
    location = WarehouseLocation.parse("s3://jetlake-new-bucket/wh", s3_server.env)
    assert not (s3_server.data_dir / "jetlake-new-bucket").exists()
    store = location.open()
    store.put("x", b"1")
    assert (s3_server.data_dir / "jetlake-new-bucket" / "wh" / "x").read_bytes() == b"1"
    assert location.open().get("x").data == b"1"  # a second open finds the bucket


def test_warehouse_uris_map_between_delta_rs_and_spark(tmp_path: Path) -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000/", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
           "AWS_ALLOW_HTTP": "true"}
    location = WarehouseLocation.parse("s3://my-bucket/some/prefix/", env)
    assert location.is_s3 and location.bucket == "my-bucket" and location.prefix == "some/prefix"
    assert location.uri("default/streams/ORDERS") == "s3://my-bucket/some/prefix/default/streams/ORDERS"
    assert location.spark_uri("default/streams/ORDERS") == "s3a://my-bucket/some/prefix/default/streams/ORDERS"
    assert to_delta_uri(location.spark_uri("t")) == location.uri("t")
    assert to_spark_uri(str(tmp_path)) == str(tmp_path)
    options = location.storage_options()
    assert options is not None
    assert options["aws_conditional_put"] == "etag" and options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert options["AWS_ALLOW_HTTP"] == "true" and options["AWS_REGION"] == "us-east-1"
    conf = S3Settings.from_env(env).spark_conf()
    assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert conf["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    local = WarehouseLocation.parse(tmp_path / "wh")
    assert not local.is_s3 and local.uri("a") == str(tmp_path / "wh" / "a") and local.storage_options() is None
    assert WarehouseLocation.parse(f"file://{tmp_path}/wh").root == tmp_path / "wh"


@pytest.mark.parametrize("uri", ["s3://jl/x", "s3://Upper/x", "s3://bad_bucket/x", "gs://bucket/x", "s3://a..b/x"])
def test_bad_warehouse_uris_are_refused(uri: str) -> None:
    with pytest.raises(ValueError):
        WarehouseLocation.parse(uri, {})
