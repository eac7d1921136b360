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

- the stream's Delta table (`<warehouse>/<account>/streams/<STREAM>`),
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

from engine.store.layout import Layout

log = logging.getLogger("jetlake.sql")

KV_PREFIX = "KV_"
KV_VIEW = "kv_{bucket}_values"
STREAM_COLUMNS = "s.seq, s.subject, s.ts, s.msg_id, s.headers, s.data, CAST(s.data AS STRING) AS text, s.size"


def register_views(spark: SparkSession, warehouse: str | Path | Layout) -> list[str]:
    """Registers a temporary view per stream (and per KV bucket) of `warehouse` in `spark`.

    Args:
        spark: a session with Delta configured (`jobs.spark.spark_session()` makes one).
        warehouse: the warehouse folder (or a `Layout` of it, for another account).

    Returns:
        The names of the views registered, streams first (sorted), then KV buckets. A warehouse with
        no streams yet registers nothing.
    """
    layout = warehouse if isinstance(warehouse, Layout) else Layout(warehouse)
    tombstones = _delta_path(layout.tombstones_table)
    names: list[str] = []
    taken: set[str] = set()
    buckets: list[tuple[str, str]] = []
    for record in _stream_records(layout):
        config = record["config"]
        name = str(config["name"])
        if config.get("storage", "file") == "memory":
            log.info("stream %s is kept in memory only: no table, no view", name)
            continue
        table = layout.stream_table(name)
        if not (table / "_delta_log").is_dir():
            log.warning("stream %s has no table at %s yet: no view", name, table)
            continue
        if name.lower() in taken:
            log.warning("stream %s: Spark's view names ignore case and %s is taken; no view", name, name.lower())
            continue
        spark.sql(_stream_view_sql(name, table, str(record["stream_id"]), int(config.get("max_age") or 0), tombstones))
        taken.add(name.lower())
        names.append(name)
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
    log.info("registered %d views over %s: %s", len(names), layout.root, ", ".join(names) or "none")
    return names


def _stream_records(layout: Layout) -> list[dict[str, Any]]:
    records = []
    folder = layout.stream_configs
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            record = json.loads(path.read_bytes())
            record["config"]["name"]
            record["stream_id"]
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a config being replaced right now
            log.warning("skipping stream config %s: %s", path, exc)
            continue
        records.append(record)
    return sorted(records, key=lambda r: str(r["config"]["name"]))


def _delta_path(table: Path) -> str | None:
    return str(table) if (table / "_delta_log").is_dir() else None


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _stream_view_sql(name: str, table: Path, stream_id: str, max_age_ns: int, tombstones: str | None) -> str:
    source = f"delta.{_ident(str(table))}"
    sql = f"CREATE OR REPLACE TEMPORARY VIEW {_ident(name)} AS SELECT "
    if tombstones is not None:
        # Tombstones are few (the retention job applies and removes them): broadcast them to every task.
        sql += (
            f"/*+ BROADCAST(t) */ {STREAM_COLUMNS} FROM {source} s LEFT ANTI JOIN "
            f"(SELECT first_seq, last_seq FROM delta.{_ident(tombstones)} WHERE stream_id = {_string(stream_id)}) t "
            "ON s.seq BETWEEN t.first_seq AND t.last_seq"
        )
    else:
        sql += f"{STREAM_COLUMNS} FROM {source} s"
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
