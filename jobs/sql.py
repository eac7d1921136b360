"""SQL over the warehouse: every stream as a view holding exactly what the API returns.

```python
from jobs.spark import spark_session
from jobs.sql import register_views

spark = spark_session()
register_views(spark, "./warehouse")          # ['ORDERS', 'KV_config', 'kv_config_values', ...]
spark.sql("SELECT subject, count(*) FROM ORDERS GROUP BY subject").show()
spark.sql("SELECT key, text FROM kv_config_values").show()
```

A stream's table keeps deleted, purged and limit-removed messages until the retention job rewrites
its files; the view hides them at once. Per stream, the view is

- the stream's Delta table (`<warehouse>/<account>/streams/<STREAM>`, on a local folder or `s3a://` on S3),
- minus every sequence inside a tombstone range of the stream's `stream_id` (a left anti join on
  `seq BETWEEN first_seq AND last_seq`; the tombstones of an earlier stream of the same name carry
  another `stream_id` and do not apply),
- minus messages older than the stream's `max_age` at the time the query runs (by `ts`),
- with the columns `seq, subject, ts, msg_id, headers, data, text, size`, where
  `text = CAST(data AS STRING)` (UTF-8; invalid bytes come out as U+FFFD).

Each KV bucket (a stream `KV_<bucket>` with subjects `$KV.<bucket>.>`) also gets the view
`kv_<bucket>_values`: the latest live entry per key, without keys whose latest entry is a delete or
purge marker (header `KV-Operation: DEL|PURGE`); columns `bucket, key, revision, created, value, text`.
(Spark's view names are case-insensitive, so `kv_<bucket>` would collide with the stream's view.)

An encrypted stream (engine/store/sealed.py: `data` and `headers` sealed, `msg_id` in the sealed
headers) is decrypted in its view for a key holder: `register_views(..., keyring=)` registers the
stream's live data keys as an in-memory view (`_jetlake_keys_<stream id>`, broadcast to the tasks, so
no key lands in a shuffle file) and the stream's view opens each value with Spark's built-in
`try_aes_decrypt(..., 'GCM', 'DEFAULT', aad)`: the same columns as a plain stream's, NULL `data` for
a value whose key was destroyed or that fails authentication. A stream whose subjects are protected
has its `subject` opened the same way (NULL when its key was destroyed). Without the keyring the view
shows the ciphertext (`data`, `headers`, and a protected `subject`, as binary), `text` is NULL, and a
KV bucket's values view is not made.

The views are SQL views over `delta.`<path>``: each query reads the tables' latest versions, so a
session registered once keeps seeing new flushes and the jobs' rewrites. What is still in the
gateway's write-ahead log is not in a table yet: `jetlake sql` first asks the gateway to flush
(`POST /v1/flush`); a user of their own session can do the same. `storage: "memory"` streams have no
table and get no view.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from engine.keys import Keyring, sql_decrypt, sql_key_ref
from engine.store.layout import Layout, TableLocation
from engine.store.objectstore import ObjectStoreError

log = logging.getLogger("jetlake.sql")

KV_PREFIX = "KV_"
KV_VIEW = "kv_{bucket}_values"
STREAM_COLUMNS = "s.seq, s.subject, s.ts, s.msg_id, s.headers, s.data, CAST(s.data AS STRING) AS text, s.size"
SEALED_COLUMNS = "s.seq, s.subject, s.ts, s.msg_id, s.headers, s.data, CAST(NULL AS STRING) AS text, s.size"
KEYS_VIEW = "_jetlake_keys_{stream_id}"
HEADERS_TYPE = "map<string,array<string>>"


def register_views(spark: SparkSession, warehouse: str | Path | Layout, keyring: Keyring | None = None) -> list[str]:
    """Registers a temporary view per stream (and per KV bucket) of `warehouse` in `spark`.

    Args:
        spark: a session with Delta configured (`jobs.spark.spark_session()` makes one).
        warehouse: the warehouse folder (or a `Layout` of it, for another account).
        keyring: the account's open keyring: encrypted streams' views decrypt (see above).

    Returns:
        The names of the views registered, streams first (sorted), then KV buckets. A warehouse with
        no streams yet registers nothing.
    """
    layout = warehouse if isinstance(warehouse, Layout) else Layout(warehouse)
    tombstones = _delta_path(layout, layout.tombstones)
    names: list[str] = []
    taken: set[str] = set()
    buckets: list[tuple[str, str]] = []
    for record in _stream_records(layout):
        config = record["config"]
        name = str(config["name"])
        if config.get("storage", "file") == "memory":
            log.info("stream %s is kept in memory only: no table, no view", name)
            continue
        location = layout.stream_table_location(name)
        table = _delta_path(layout, location)
        if table is None:
            log.warning("stream %s has no table at %s yet: no view", name, location)
            continue
        if name.lower() in taken:
            log.warning("stream %s: Spark's view names ignore case and %s is taken; no view", name, name.lower())
            continue
        stream_id, max_age = str(record["stream_id"]), int(config.get("max_age") or 0)
        encrypted = "encryption" in record
        if encrypted and keyring is not None:
            keys_view = KEYS_VIEW.format(stream_id=stream_id)
            keys = keyring.stream(stream_id, int(record["encryption"].get("key_tokens", 0))).sql_keys()
            spark.createDataFrame(keys, "key_ref binary, key binary").createOrReplaceTempView(keys_view)
            protected = bool(record["encryption"].get("protected_subjects", False))
            spark.sql(_decrypted_view_sql(name, table, stream_id, max_age, tombstones, keys_view, protected))
        else:
            if encrypted:
                log.warning("stream %s is encrypted and no key was given: its view shows ciphertext", name)
            columns = SEALED_COLUMNS if encrypted else STREAM_COLUMNS
            spark.sql(_stream_view_sql(name, table, stream_id, max_age, tombstones, columns))
        taken.add(name.lower())
        names.append(name)
        if encrypted and keyring is None:
            continue  # no values view over ciphertext
        if name.startswith(KV_PREFIX) and len(name) > len(KV_PREFIX):
            buckets.append((name, name[len(KV_PREFIX):]))
    for stream, bucket in buckets:
        view = KV_VIEW.format(bucket=bucket)
        if view.lower() in taken:
            log.warning("KV bucket %s: the view name %s is taken by a stream; no view", bucket, view)
            continue
        spark.sql(_kv_view_sql(view, stream, bucket))
        taken.add(view.lower())
        names.append(view)
    log.info("registered %d views over %s: %s", len(names), layout, ", ".join(names) or "none")
    return names


def _stream_records(layout: Layout) -> list[dict[str, Any]]:
    """The stream config records, through the warehouse's object store (a local folder or S3)."""
    records = []
    folder = layout.stream_configs_key
    for meta in list(layout.objects.list(folder)):
        if "/" in meta.key[len(folder) + 1:] or not meta.key.endswith(".json"):
            continue
        try:
            record = json.loads(layout.objects.get(meta.key).data)
            record["config"]["name"]
            record["stream_id"]
        except (ObjectStoreError, ValueError, KeyError, TypeError) as exc:  # a config being replaced right now
            log.warning("skipping stream config %s: %s", meta.key, exc)
            continue
        records.append(record)
    return sorted(records, key=lambda r: str(r["config"]["name"]))


def _delta_path(layout: Layout, table: TableLocation) -> str | None:
    """Spark's path of the table (`s3a://…` on S3), None while it has no commit yet."""
    folder = f"{table.key}/_delta_log/"
    return table.spark_uri if next(iter(layout.objects.list(folder)), None) is not None else None


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _stream_view_sql(name: str, table: str, stream_id: str, max_age_ns: int, tombstones: str | None,
                     columns: str = STREAM_COLUMNS) -> str:
    return f"CREATE OR REPLACE TEMPORARY VIEW {_ident(name)} AS " + _live_rows_sql(
        table, stream_id, max_age_ns, tombstones, columns)


def _decrypted_view_sql(name: str, table: str, stream_id: str, max_age_ns: int, tombstones: str | None,
                        keys_view: str, protected: bool = False) -> str:
    """An encrypted stream's view: the rows joined to their data key (by the key reference every sealed
    value starts with), opened with Spark's `try_aes_decrypt`, in a plain stream's columns. Protected
    subjects are opened first (the other values' associated data names the plain subject); a filter
    on `subject` then runs after decryption, over every file (no partition pruning by subject)."""
    subject = "s.subject"
    if protected:
        subject = f"CAST({sql_decrypt('s.subject', 'k.key', stream_id, 'subject')} AS STRING)"
    data = sql_decrypt("s.data", "k.key", stream_id, "data", subject_sql=subject)
    headers = sql_decrypt("s.headers", "k.key", stream_id, "headers", subject_sql=subject)
    columns = (f"s.seq, {subject} AS subject, s.ts, from_json(CAST({headers} AS STRING), '{HEADERS_TYPE}') AS headers, "
               f"{data} AS data, s.size")
    join = f"LEFT JOIN {_ident(keys_view)} k ON {sql_key_ref('s.data')} = k.key_ref"
    inner = _live_rows_sql(table, stream_id, max_age_ns, tombstones, columns, join, hint="BROADCAST(k)")
    return (
        f"CREATE OR REPLACE TEMPORARY VIEW {_ident(name)} AS SELECT seq, subject, ts, "
        "try_element_at(try_element_at(headers, 'Nats-Msg-Id'), 1) AS msg_id, headers, data, "
        f"CAST(data AS STRING) AS text, size FROM ({inner})"
    )


def _live_rows_sql(table: str, stream_id: str, max_age_ns: int, tombstones: str | None, columns: str,
                   join: str = "", hint: str = "") -> str:
    """The SELECT of a stream's rows that are not tombstoned nor older than `max_age`."""
    source = f"delta.{_ident(table)} s {join}".rstrip()
    hints = [h for h in (hint, "BROADCAST(t)" if tombstones is not None else "") if h]
    sql = f"SELECT /*+ {', '.join(hints)} */ " if hints else "SELECT "
    if tombstones is not None:
        # Tombstones are few (the retention job applies and removes them): broadcast them to every task.
        sql += (
            f"{columns} FROM {source} LEFT ANTI JOIN "
            f"(SELECT first_seq, last_seq FROM delta.{_ident(tombstones)} WHERE stream_id = {_string(stream_id)}) t "
            "ON s.seq BETWEEN t.first_seq AND t.last_seq"
        )
    else:
        sql += f"{columns} FROM {source}"
    if max_age_ns > 0:
        # current_timestamp() is fixed per query: the cut-off is the query's start, as a read's `now`.
        sql += f" WHERE unix_micros(s.ts) >= unix_micros(current_timestamp()) - {max_age_ns // 1000}"
    return sql


def _kv_view_sql(view: str, stream: str, bucket: str) -> str:
    prefix = f"$KV.{bucket}."
    marker = (
        "coalesce(exists(map_entries(headers), e -> lower(e.key) = 'kv-operation' "
        "AND exists(e.value, v -> upper(trim(v)) IN ('DEL', 'PURGE'))), false)"
    )
    return (
        f"CREATE OR REPLACE TEMPORARY VIEW {_ident(view)} AS "
        f"SELECT {_string(bucket)} AS bucket, key, seq AS revision, ts AS created, data AS value, text FROM ("
        f"SELECT substring(subject, {len(prefix) + 1}) AS key, seq, ts, data, text, {marker} AS removed, "
        "row_number() OVER (PARTITION BY subject ORDER BY seq DESC) AS latest "
        f"FROM {_ident(stream)} WHERE startswith(subject, {_string(prefix)})"
        ") WHERE latest = 1 AND NOT removed"
    )
