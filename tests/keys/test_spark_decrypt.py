"""Values sealed by engine.keys, in a real Delta table, decrypt with Spark's built-in `aes_decrypt`."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from pyspark.sql import SparkSession

from engine.keys import Keyring, StreamKeys, key_prefix, sql_decrypt, sql_key_ref
from engine.store.layout import partition_value
from tests.keys.conftest import new_stream_id

pytestmark = pytest.mark.spark

SUBJECTS = ["users.1.profile", "users.2.profile", "users.1.orders", "users.3.orders"]
MARKER = "marker-5150"


def _payloads() -> list[bytes]:
    return [f"{MARKER} message {i}".encode() for i in range(1, len(SUBJECTS) + 1)]


def _write_table(path: Path, stream: StreamKeys, *, protect_subjects: bool) -> None:
    seqs = list(range(1, len(SUBJECTS) + 1))
    columns = {
        "seq": pa.array(seqs, pa.int64()),
        "data": stream.seal_batch("data", seqs, SUBJECTS, _payloads()),
        "headers": stream.seal_batch("headers", seqs, SUBJECTS, [b'{"Marker":["' + MARKER.encode() + b'"]}'] * 4),
    }
    if protect_subjects:
        hasher = stream.subject_hasher()
        columns["subject"] = stream.seal_batch("subject", seqs, SUBJECTS, [s.encode() for s in SUBJECTS])
        columns["subject_partition"] = pa.array([hasher.partition_value(key_prefix(s, 2)) for s in SUBJECTS])
    else:
        columns["subject"] = pa.array(SUBJECTS)
        columns["subject_partition"] = pa.array([partition_value(s, 2) for s in SUBJECTS])
    write_deltalake(str(path), pa.table(columns), partition_by=["subject_partition"])


def _keys_view(spark: SparkSession, name: str, keys: list[tuple[bytes, bytes]]) -> None:
    spark.createDataFrame(keys, "key_ref binary, key binary").createOrReplaceTempView(name)


def _decrypted(spark: SparkSession, table: Path, keys: str, stream_id: str, *, strict: bool = False) -> list[tuple]:
    data = sql_decrypt("s.data", "k.key", stream_id, "data", subject_sql="s.subject", strict=strict)
    headers = sql_decrypt("s.headers", "k.key", stream_id, "headers", subject_sql="s.subject", strict=strict)
    rows = spark.sql(
        f"SELECT /*+ BROADCAST(k) */ s.seq, CAST({data} AS STRING) AS data, CAST({headers} AS STRING) AS headers "
        f"FROM delta.`{table}` s LEFT JOIN {keys} k ON {sql_key_ref('s.data')} = k.key_ref ORDER BY s.seq"
    ).collect()
    return [tuple(r) for r in rows]


def test_key_holders_decrypt_with_aes_decrypt_and_no_one_else(spark: SparkSession, tmp_path: Path,
                                                              ring: Keyring) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    table = tmp_path / "USERS"
    _write_table(table, stream, protect_subjects=False)
    header = f'{{"Marker":["{MARKER}"]}}'

    _keys_view(spark, "keys_holder", stream.sql_keys())
    expected = [(i, p.decode(), header) for i, p in enumerate(_payloads(), 1)]
    assert _decrypted(spark, table, "keys_holder", stream.stream_id, strict=True) == expected

    raw = spark.sql(f"SELECT data, headers FROM delta.`{table}`").collect()
    assert raw and not [r for r in raw if MARKER.encode() in bytes(r.data) or MARKER.encode() in bytes(r.headers)]

    _keys_view(spark, "keys_none", [])
    assert _decrypted(spark, table, "keys_none", stream.stream_id) == [(i, None, None) for i in range(1, 5)]

    other = ring.stream(new_stream_id(), key_tokens=2)
    other.seal_batch("data", [1, 2, 3], ["users.1", "users.2", "users.3"], [b"x", b"y", b"z"])
    _keys_view(spark, "keys_other", other.sql_keys())  # the same key ids, another stream's keys
    assert _decrypted(spark, table, "keys_other", stream.stream_id) == [(i, None, None) for i in range(1, 5)]
    with pytest.raises(Exception, match="AES_CRYPTO_ERROR"):
        _decrypted(spark, table, "keys_other", stream.stream_id, strict=True)

    _keys_view(spark, "keys_random", [(ref, os.urandom(32)) for ref, _ in stream.sql_keys()])
    with pytest.raises(Exception, match="AES_CRYPTO_ERROR"):
        _decrypted(spark, table, "keys_random", stream.stream_id, strict=True)


def test_a_shredded_prefix_reads_null_in_sql(spark: SparkSession, tmp_path: Path, ring: Keyring) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    table = tmp_path / "USERS"
    _write_table(table, stream, protect_subjects=False)
    stream.destroy_prefix("users.1")
    _keys_view(spark, "keys_after", stream.sql_keys())
    rows = _decrypted(spark, table, "keys_after", stream.stream_id, strict=True)
    assert [r[1] is None for r in rows] == [s.startswith("users.1.") for s in SUBJECTS]
    assert [r[1] for r in rows if r[1] is not None] == [f"{MARKER} message 2", f"{MARKER} message 4"]


def test_protected_subjects_decrypt_and_filter_by_keyed_hash(spark: SparkSession, tmp_path: Path,
                                                             ring: Keyring) -> None:
    stream = ring.stream(new_stream_id(), key_tokens=2)
    table = tmp_path / "USERS"
    _write_table(table, stream, protect_subjects=True)
    _keys_view(spark, "keys_protected", stream.sql_keys())
    assert not list(table.glob("subject_partition=users*"))
    assert b"users." not in b"".join(p.read_bytes() for p in table.rglob("*") if p.is_file())

    subject = sql_decrypt("s.subject", "k.key", stream.stream_id, "subject", strict=True)
    data = sql_decrypt("s.data", "s.key", stream.stream_id, "data", subject_sql="plain_subject", strict=True)
    wanted = stream.subject_hasher().partition_value("users.1")
    rows = spark.sql(
        f"SELECT seq, plain_subject, CAST({data} AS STRING) AS data FROM ("
        f"  SELECT s.*, k.key, CAST({subject} AS STRING) AS plain_subject"
        f"  FROM delta.`{table}` s JOIN keys_protected k ON {sql_key_ref('s.subject')} = k.key_ref"
        f"  WHERE s.subject_partition = '{wanted}') s ORDER BY seq"
    ).collect()
    expected = [(1, "users.1.profile", f"{MARKER} message 1"), (3, "users.1.orders", f"{MARKER} message 3")]
    assert [tuple(r) for r in rows] == expected
