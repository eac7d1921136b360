"""KV buckets on the engine (JetStream's KV, ADR-8): buckets, puts and conditions, markers, history,
keys, ttl, limits, watches, and revisions read back from Delta after a restart.

`bytes` figures are memstore's: len(subject) + header block + len(value) + 16, the header block being
"NATS/1.0\\r\\n" + "Name: value\\r\\n" per value + "\\r\\n" (none without headers).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from deltalake import DeltaTable

from engine import JetStream, JetStreamError, ManualClock
from engine.config import NS_PER_S
from engine.kv import KeyValueStores, KvEntry
from engine.store.wal import WriteAheadLog, read_segment
from engine.stream import Stream
from tests.conftest import reopen

SECOND = NS_PER_S
DEL_HEADERS = {"KV-Operation": ["DEL"]}
PURGE_HEADERS = {"KV-Operation": ["PURGE"], "Nats-Rollup": ["sub"]}


def size(bucket: str, key: str, value: bytes = b"", headers: dict[str, list[str]] | None = None) -> int:
    block = 12 + sum(len(k) + 2 + len(v) + 2 for k, vs in headers.items() for v in vs) if headers else 0
    return len(f"$KV.{bucket}.{key}") + block + len(value) + 16


def expect_rev(revision: int) -> dict[str, list[str]]:
    return {"Nats-Expected-Last-Subject-Sequence": [str(revision)]}


def fails(err_code: int, call: Any, *args: Any, **kwargs: Any) -> JetStreamError:
    with pytest.raises(JetStreamError) as err:
        call(*args, **kwargs)
    assert err.value.err_code == err_code, err.value.to_dict()
    return err.value


def ops(entries: list[KvEntry]) -> list[tuple[str, bytes, int, str]]:
    return [(e.key, e.value, e.revision, e.operation) for e in entries]


@pytest.fixture
def kv(js: JetStream) -> KeyValueStores:
    return js.kv


# -- buckets ------------------------------------------------------------------------------------


def test_create_defaults_and_exact_status(kv: KeyValueStores) -> None:
    status, created = kv.create({"bucket": "cfg"})
    assert created
    assert status == {
        "bucket": "cfg", "values": 0, "history": 1, "ttl": 0, "bytes": 0, "backing_store": "JetStream",
        "is_compressed": False, "max_value_size": -1, "max_bytes": -1, "storage": "file", "replicas": 1,
        "stream": "KV_cfg",
    }
    config = kv.js.stream("KV_cfg").config
    assert config.subjects == ["$KV.cfg.>"]
    assert (config.max_msgs_per_subject, config.discard, config.deny_delete, config.allow_rollup_hdrs) == (1, "new", True, True)
    assert config.duplicate_window == 120 * SECOND
    assert config.metadata is not None and config.metadata["jetlake.partition_tokens"] == "2"


@pytest.mark.parametrize(("history", "stored"), [(0, 1), (1, 1), (5, 5), (64, 64)])
def test_history_from_1_to_64(kv: KeyValueStores, history: int, stored: int) -> None:
    status, _ = kv.create({"bucket": "h", "history": history})
    assert status["history"] == stored
    assert kv.js.stream("KV_h").config.max_msgs_per_subject == stored


@pytest.mark.parametrize("body", [
    {"bucket": "x", "history": 65},
    {"bucket": "x", "history": -1},
    {"bucket": "x", "ttl": -1},
])
def test_invalid_configs_are_refused_and_create_nothing(kv: KeyValueStores, body: dict[str, Any]) -> None:
    fails(10052, kv.create, body)
    assert kv.list() == {"total": 0, "buckets": []}


def test_unknown_fields_and_wrong_types_are_refused(kv: KeyValueStores) -> None:
    fails(10025, kv.create, {"bucket": "x", "histroy": 2})
    fails(10025, kv.create, {"bucket": "x", "history": "2"})
    assert kv.list()["total"] == 0


def test_full_config_is_kept_and_shown(kv: KeyValueStores) -> None:
    body = {"bucket": "m", "history": 3, "ttl": 10 * SECOND, "max_value_size": 100, "max_bytes": 4096,
            "storage": "memory", "description": "session cache"}
    status, created = kv.create(body)
    assert created
    assert {k: status[k] for k in ("history", "ttl", "max_value_size", "max_bytes", "storage", "description")} == {
        "history": 3, "ttl": 10 * SECOND, "max_value_size": 100, "max_bytes": 4096, "storage": "memory",
        "description": "session cache",
    }
    config = kv.js.stream("KV_m").config
    assert (config.max_age, config.max_msg_size, config.max_bytes, config.duplicate_window) == (10 * SECOND, 100, 4096, 10 * SECOND)


def test_create_is_idempotent_and_a_different_config_is_10058(kv: KeyValueStores) -> None:
    first, created = kv.create({"bucket": "b", "history": 2, "description": "d"})
    assert created
    kv.put("b", "k", b"v")
    again, created = kv.create({"bucket": "b", "history": 2, "description": "d"})
    assert not created and again["values"] == 1
    err = fails(10058, kv.create, {"bucket": "b", "history": 3, "description": "d"})
    assert err.code == 400
    assert kv.status("b")["history"] == 2 and kv.get("b", "k").value == b"v"


def test_list_and_destroy(kv: KeyValueStores) -> None:
    kv.js.add_stream({"name": "PLAIN", "subjects": ["plain.>"]})
    for name in ("zeta", "alpha"):
        kv.create({"bucket": name})
    kv.put("alpha", "k", b"1")
    listing = kv.list()
    assert listing["total"] == 2
    assert [(b["bucket"], b["values"]) for b in listing["buckets"]] == [("alpha", 1), ("zeta", 0)]
    kv.destroy("alpha")
    assert [b["bucket"] for b in kv.list()["buckets"]] == ["zeta"]
    err = fails(10059, kv.status, "alpha")
    assert err.code == 404
    fails(10059, kv.destroy, "alpha")
    fails(10059, kv.get, "alpha", "k")
    fails(10059, kv.put, "alpha", "k", b"x")
    assert kv.create({"bucket": "alpha"})[0]["values"] == 0, "a destroyed bucket's name is free again"


@pytest.mark.parametrize("bucket", ["", "a.b", "a b", "a*", "a>", "a/b", "ä", "a\n", "a\x00", "KV\tx", "x" * 300])
def test_invalid_bucket_names(kv: KeyValueStores, bucket: str) -> None:
    err = fails(10003, kv.status, bucket) if bucket else None
    assert err is None or err.code == 400
    with pytest.raises(JetStreamError) as create:
        kv.create({"bucket": bucket})
    assert create.value.code == 400
    assert kv.list()["total"] == 0


# -- keys: puts, conditions, markers ------------------------------------------------------------


@pytest.mark.parametrize("key", [
    "", ".a", "a.", "a..b", "a b", "a*", "a.*", "a.>", ">", "*", "ä", "a\n", "a\tb", "a\x00", "a\\b", "a,b",
])
def test_invalid_keys_are_refused_and_store_nothing(kv: KeyValueStores, key: str) -> None:
    kv.create({"bucket": "b"})
    for call in (lambda: kv.put("b", key, b"v"), lambda: kv.get("b", key), lambda: kv.delete("b", key),
                 lambda: kv.history("b", key)):
        err = fails(10003, call)
        assert err.code == 400
    assert kv.status("b")["values"] == 0 and kv.js.stream("KV_b").index.last_seq == 0


@pytest.mark.parametrize("key", ["a", "a.b.c", "a/b/c", "-_=/.x", "A9", "x" * 200])
def test_valid_keys(kv: KeyValueStores, key: str) -> None:
    kv.create({"bucket": "b"})
    assert kv.put("b", key, b"v") == 1
    assert kv.get("b", key).key == key
    assert kv.keys("b") == [key]


def test_put_get_latest_and_at_revision(kv: KeyValueStores, clock: ManualClock) -> None:
    kv.create({"bucket": "b", "history": 5})
    assert kv.put("b", "a", b"a1") == 1
    clock.advance(SECOND)
    assert kv.put("b", "b", b"b1") == 2
    assert kv.put("b", "a", b"a2") == 3
    latest = kv.get("b", "a")
    assert (latest.key, latest.value, latest.revision, latest.operation) == ("a", b"a2", 3, "PUT")
    assert latest.created == clock.now_ns()
    first = kv.get("b", "a", 1)
    assert (first.value, first.revision, first.created) == (b"a1", 1, clock.now_ns() - SECOND)
    fails(10037, kv.get, "b", "a", 2)  # revision 2 is key b's
    fails(10037, kv.get, "b", "a", 99)
    fails(10003, kv.get, "b", "a", 0)
    fails(10003, kv.get, "b", "a", -1)
    err = fails(10037, kv.get, "b", "nope")
    assert err.code == 404
    assert kv.put("b", "empty", b"") == 4
    assert kv.get("b", "empty").value == b""


def test_create_only(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b", "history": 10})
    assert kv.put("b", "k", b"v1", create=True) == 1
    err = fails(10071, kv.put, "b", "k", b"v2", create=True)
    assert err.code == 400
    assert kv.delete("b", "k") == 2
    assert kv.put("b", "k", b"v3", create=True) == 3, "a delete marker counts as absent"
    assert kv.delete("b", "k", purge=True) == 4
    assert kv.put("b", "k", b"v5", create=True) == 5, "a purge marker counts as absent"
    fails(10071, kv.put, "b", "k", b"v6", create=True)
    assert kv.get("b", "k").value == b"v5"
    assert kv.js.stream("KV_b").index.last_seq == 5, "refused creates take no revision"


def test_update_at_revision(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b", "history": 10})
    fails(10071, kv.put, "b", "k", b"x", last_revision=1)
    assert kv.put("b", "k", b"v1", last_revision=0) == 1, "revision 0: the key must not exist"
    assert kv.put("b", "other", b"o") == 2
    err = fails(10071, kv.put, "b", "k", b"v2", last_revision=2)
    assert err.code == 400 and err.description == "wrong last sequence: 1"
    assert kv.put("b", "k", b"v2", last_revision=1) == 3
    fails(10071, kv.put, "b", "k", b"v3", last_revision=1)
    fails(10003, kv.put, "b", "k", b"v3", last_revision=-1)
    fails(10071, kv.delete, "b", "k", last_revision=1)
    assert kv.delete("b", "k", last_revision=3) == 4
    assert kv.get("b", "k", 3).value == b"v2"


def test_delete_keeps_history_and_purge_drops_it(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b", "history": 10})
    kv.put("b", "k", b"v1")
    kv.put("b", "k", b"v2")
    kv.put("b", "other", b"o")
    assert kv.delete("b", "k") == 4
    fails(10037, kv.get, "b", "k")
    assert kv.get("b", "k", 2).value == b"v2", "an older revision stays readable after a delete"
    history = kv.history("b", "k")
    assert ops(history) == [("k", b"v1", 1, "PUT"), ("k", b"v2", 2, "PUT"), ("k", b"", 4, "DEL")]
    assert [e.delta for e in history] == [2, 1, 0]
    assert kv.keys("b") == ["other"]
    assert kv.delete("b", "k", purge=True) == 5
    assert ops(kv.history("b", "k")) == [("k", b"", 5, "PURGE")]
    fails(10037, kv.get, "b", "k")
    fails(10037, kv.get, "b", "k", 2)
    status = kv.status("b")
    assert (status["values"], status["bytes"]) == (2, size("b", "other", b"o") + size("b", "k", b"", PURGE_HEADERS))
    assert ops(kv.history("b", "other")) == [("other", b"o", 3, "PUT")], "a purge drops one key only"
    fails(10037, kv.history, "b", "never")
    assert kv.delete("b", "never") == 6, "deleting an absent key leaves a marker, as JetStream"


def test_history_is_bounded_by_the_bucket_history(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b", "history": 3})
    for i in range(1, 6):
        kv.put("b", "k", f"v{i}".encode())
    kv.put("b", "j", b"j")
    assert ops(kv.history("b", "k")) == [("k", b"v3", 3, "PUT"), ("k", b"v4", 4, "PUT"), ("k", b"v5", 5, "PUT")]
    fails(10037, kv.get, "b", "k", 2)
    status = kv.status("b")
    assert (status["values"], status["bytes"]) == (4, 3 * size("b", "k", b"v1") + size("b", "j", b"j"))
    kv.delete("b", "k")
    assert [e.revision for e in kv.history("b", "k")] == [4, 5, 7], "a marker takes a history slot"


def test_history_one_keeps_only_the_latest(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b"})
    kv.put("b", "k", b"1")
    kv.put("b", "k", b"2", create=False)
    assert ops(kv.history("b", "k")) == [("k", b"2", 2, "PUT")]
    assert kv.status("b")["values"] == 1


def test_exact_status_figures(kv: KeyValueStores) -> None:
    kv.create({"bucket": "s", "history": 4})
    kv.put("s", "a", b"hello")
    kv.put("s", "b.c", b"x" * 100)
    kv.put("s", "a", b"again", create=False, last_revision=1)
    kv.put("s", "new", b"n", create=True)
    kv.delete("s", "b.c")
    status = kv.status("s")
    expected = (
        size("s", "a", b"hello") + size("s", "b.c", b"x" * 100) + size("s", "a", b"again", expect_rev(1))
        + size("s", "new", b"n", expect_rev(0)) + size("s", "b.c", b"", DEL_HEADERS)
    )
    assert (status["values"], status["bytes"], status["history"], status["ttl"]) == (5, expected, 4, 0)


# -- keys ---------------------------------------------------------------------------------------


def test_keys_with_filters_leave_out_deleted_and_purged(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b", "history": 3})
    for key in ("user.1.name", "user.1.mail", "user.2.name", "team.a", "top", "user.3.name", "gone", "purged"):
        kv.put("b", key, key.encode())
    kv.put("b", "user.1.name", b"renamed")  # now the newest revision
    kv.delete("b", "gone")
    kv.delete("b", "purged", purge=True)
    kv.delete("b", "user.3.name")
    assert kv.keys("b") == ["user.1.mail", "user.2.name", "team.a", "top", "user.1.name"]
    assert kv.keys("b", ">") == kv.keys("b")
    assert kv.keys("b", "user.>") == ["user.1.mail", "user.2.name", "user.1.name"]
    assert kv.keys("b", "user.*.name") == ["user.2.name", "user.1.name"]
    assert kv.keys("b", "*") == ["top"]
    assert kv.keys("b", "*.*") == ["team.a"]
    assert kv.keys("b", "user.1.*") == ["user.1.mail", "user.1.name"]
    assert kv.keys("b", "top") == ["top"]
    assert kv.keys("b", "gone") == []
    assert kv.keys("b", "nothing.>") == []
    for bad in ("", "a..b", "a.>.b", "a*", ".a", "a b", ">>"):
        fails(10003, kv.keys, "b", bad)


def test_keys_of_an_empty_bucket(kv: KeyValueStores) -> None:
    kv.create({"bucket": "b"})
    assert kv.keys("b") == []
    fails(10059, kv.keys, "none")


# -- ttl and limits -----------------------------------------------------------------------------


def test_ttl_expires_values_from_every_read(kv: KeyValueStores, clock: ManualClock) -> None:
    kv.create({"bucket": "t", "ttl": 10 * SECOND, "history": 5})
    kv.put("t", "old", b"1")
    clock.advance(6 * SECOND)
    kv.put("t", "young", b"2")
    clock.advance(4 * SECOND)
    assert kv.keys("t") == ["old", "young"], "exactly ttl old is still there"
    clock.advance(1)
    assert kv.keys("t") == ["young"]
    fails(10037, kv.get, "t", "old")
    fails(10037, kv.get, "t", "old", 1)
    fails(10037, kv.history, "t", "old")
    status = kv.status("t")
    assert (status["values"], status["bytes"], status["ttl"]) == (1, size("t", "young", b"2"), 10 * SECOND)
    assert kv.put("t", "old", b"3", create=True) == 3, "an expired key can be created again"
    clock.advance(10 * SECOND)
    assert kv.keys("t") == ["old"]
    clock.advance(10 * SECOND)
    assert kv.keys("t") == [] and kv.status("t")["values"] == 0


def test_max_value_size_is_10054(kv: KeyValueStores) -> None:
    kv.create({"bucket": "v", "max_value_size": 8})
    assert kv.put("v", "k", b"12345678") == 1
    err = fails(10054, kv.put, "v", "k", b"123456789")
    assert err.code == 400
    assert kv.get("v", "k").value == b"12345678"
    status = kv.status("v")
    assert (status["values"], status["bytes"]) == (1, size("v", "k", b"12345678"))


def test_max_bytes_with_discard_new_is_10077(kv: KeyValueStores) -> None:
    one = size("f", "k0", b"x" * 50)
    kv.create({"bucket": "f", "max_bytes": 3 * one, "history": 5})
    for i in range(3):
        kv.put("f", f"k{i}", b"x" * 50)
    err = fails(10077, kv.put, "f", "k3", b"x" * 50)
    assert err.code == 503
    fails(10077, kv.put, "f", "k0", b"x" * 50)
    assert kv.keys("f") == ["k0", "k1", "k2"], "discard new: nothing old was dropped"
    assert kv.status("f")["bytes"] == 3 * one
    assert kv.js.stream("KV_f").index.last_seq == 3


# -- restart and reads from Delta ---------------------------------------------------------------


def test_revisions_survive_a_restart_and_read_from_delta(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    js.kv.create({"bucket": "r", "history": 4})
    js.kv.put("r", "a", b"a1")
    js.kv.put("r", "b", b"b1")
    js.kv.put("r", "a", b"a2")
    js.kv.delete("r", "b")
    js.kv.put("r", "c", b"c1")
    js.kv.delete("r", "c", purge=True)
    js.flush()
    engine[0] = js = reopen(js, clock)
    stream = js.stream("KV_r")
    table = DeltaTable(str(js.layout.stream_table("KV_r")))
    assert table.transaction_version(stream.stream_id) == stream.index.last_seq == 6, "every revision is in Delta"
    segments = WriteAheadLog(js.layout.wal_dir("KV_r")).segments()
    assert sum(len(read_segment(p)[0]) for p in segments) == 0, "none in the log"
    kv = js.kv
    assert (kv.get("r", "a").value, kv.get("r", "a").revision) == (b"a2", 3)
    assert kv.get("r", "a", 1).value == b"a1"
    assert kv.get("r", "b", 2).value == b"b1"
    fails(10037, kv.get, "r", "b")
    fails(10037, kv.get, "r", "c")
    assert ops(kv.history("r", "b")) == [("b", b"b1", 2, "PUT"), ("b", b"", 4, "DEL")]
    assert ops(kv.history("r", "c")) == [("c", b"", 6, "PURGE")]
    assert kv.keys("r") == ["a"]
    assert kv.put("r", "a", b"a3", last_revision=3) == 7, "revisions continue after a restart"
    fails(10071, kv.put, "r", "a", b"x", create=True)
    assert kv.put("r", "b", b"b2", create=True) == 8
    assert kv.status("r")["values"] == 7
    engine[0] = js = reopen(js, clock)  # unflushed this time: from the write-ahead log
    assert js.kv.get("r", "b").revision == 8 and js.kv.get("r", "a").value == b"a3"


def test_a_get_is_an_index_lookup_not_a_scan(kv: KeyValueStores, monkeypatch: pytest.MonkeyPatch) -> None:
    kv.create({"bucket": "g", "history": 3})
    for i in range(50):
        kv.put("g", f"k{i % 10}", str(i).encode())
    kv.js.flush()

    def scan(*args: Any, **kwargs: Any) -> np.ndarray:
        raise AssertionError("a get must not scan the stream")

    monkeypatch.setattr(Stream, "live_seqs", scan)
    monkeypatch.setattr(Stream, "last_seqs", scan)
    monkeypatch.setattr(Stream, "load_many", scan)
    assert kv.get("g", "k3").value == b"43"
    assert kv.get("g", "k3", 34).value == b"33"
    fails(10037, kv.get, "g", "k3", 4)  # dropped by history 3
    fails(10037, kv.get, "g", "k3", 35)  # key k4's
    assert kv.put("g", "k3", b"new", create=False) == 51


# -- watch --------------------------------------------------------------------------------------


def _fill(kv: KeyValueStores) -> None:
    kv.create({"bucket": "w", "history": 5})
    kv.put("w", "a", b"a1")      # 1
    kv.put("w", "b", b"b1")      # 2
    kv.put("w", "a", b"a2")      # 3
    kv.put("w", "c.x", b"c1")    # 4
    kv.delete("w", "b")          # 5


def test_watch_initial_latest_per_key_then_updates(kv: KeyValueStores) -> None:
    _fill(kv)
    watch = kv.watch("w")
    initial = watch.initial()
    assert ops(initial) == [("a", b"a2", 3, "PUT"), ("c.x", b"c1", 4, "PUT"), ("b", b"", 5, "DEL")]
    assert [e.delta for e in initial] == [2, 1, 0]
    assert all(e.bucket == "w" for e in initial)
    assert watch.updates() == []
    kv.put("w", "d", b"d1")
    kv.delete("w", "a", purge=True)
    assert ops(watch.updates()) == [("d", b"d1", 6, "PUT"), ("a", b"", 7, "PURGE")]
    assert watch.updates() == []
    assert not watch.closed


def test_watch_include_history(kv: KeyValueStores) -> None:
    _fill(kv)
    watch = kv.watch("w", include_history=True)
    initial = watch.initial()
    assert [e.revision for e in initial] == [1, 2, 3, 4, 5]
    assert [e.delta for e in initial] == [4, 3, 2, 1, 0]


def test_watch_updates_only(kv: KeyValueStores) -> None:
    _fill(kv)
    watch = kv.watch("w", updates_only=True)
    assert watch.initial() == []
    kv.put("w", "a", b"a3")
    assert ops(watch.updates()) == [("a", b"a3", 6, "PUT")]
    fails(10003, kv.watch, "w", include_history=True, updates_only=True)


def test_watch_ignore_deletes_and_key_filter(kv: KeyValueStores) -> None:
    _fill(kv)
    watch = kv.watch("w", ignore_deletes=True)
    assert [e.key for e in watch.initial()] == ["a", "c.x"]
    kv.delete("w", "c.x")
    kv.put("w", "e", b"e")
    assert ops(watch.updates()) == [("e", b"e", 7, "PUT")]
    filtered = kv.watch("w", "c.*")
    assert ops(filtered.initial()) == [("c.x", b"", 6, "DEL")]
    kv.put("w", "a", b"not c")
    kv.put("w", "c.y", b"c.y")
    assert ops(filtered.updates()) == [("c.y", b"c.y", 9, "PUT")]
    exact = kv.watch("w", "a")
    assert ops(exact.initial()) == [("a", b"not c", 8, "PUT")]
    for bad in ("", "a..b", "a b", "x.>.y"):
        fails(10003, kv.watch, "w", bad)


def test_watch_of_an_empty_bucket_and_a_destroyed_one(kv: KeyValueStores) -> None:
    kv.create({"bucket": "w"})
    watch = kv.watch("w")
    assert watch.initial() == []
    kv.put("w", "k", b"v")
    assert ops(watch.updates()) == [("k", b"v", 1, "PUT")]
    kv.destroy("w")
    assert watch.closed and watch.updates() == []
    kv.create({"bucket": "w"})
    kv.put("w", "k", b"again")
    assert watch.closed and watch.updates() == [], "a watch of a destroyed bucket does not follow a new one"


def test_watch_updates_in_pages(kv: KeyValueStores) -> None:
    kv.create({"bucket": "w"})
    watch = kv.watch("w", "even.>")
    watch.initial()
    for i in range(30):
        kv.put("w", f"{'even' if i % 2 == 0 else 'odd'}.{i}", b"x")
    seen: list[int] = []
    while page := watch.updates(limit=4):
        seen.extend(e.revision for e in page)
    rest = watch.updates(limit=4)
    assert rest == []
    assert seen == list(range(1, 31, 2)), "no update lost or repeated across pages"


def test_watch_after_a_restart_reads_from_delta(engine: list[JetStream], clock: ManualClock) -> None:
    js = engine[0]
    _fill(js.kv)
    js.flush()
    engine[0] = js = reopen(js, clock)
    watch = js.kv.watch("w", include_history=True)
    assert ops(watch.initial())[:2] == [("a", b"a1", 1, "PUT"), ("b", b"b1", 2, "PUT")]
    js.kv.put("w", "z", b"z")
    assert ops(watch.updates()) == [("z", b"z", 6, "PUT")]
