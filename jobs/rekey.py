"""Re-encryption after a key rotation: the compaction job's step for encrypted streams.

`JetStream.rotate_key` starts a new key epoch for new writes at once; the values sealed before stay
under their older keys. With the account's keyring, compaction then, per encrypted stream whose
keyring holds keys of older epochs, under the table's commit lease (the gateway's flusher waits):
1. checks the stream's write-ahead log: a record still sealed under an older key (not flushed yet)
   would reach the table after this step, so the stream waits for the next run;
2. `MERGE`s the table onto itself: each row whose value names an older key gets its `data` and
   `headers` opened with Spark's `aes_decrypt` and sealed again with `aes_encrypt` under the current
   epoch's key of the same subject prefix (engine/keys/cipher.py's layout, same associated data); the
   match is on `seq` only, so no subject lands in the commit's predicate; a stream whose subjects are
   protected gets its `subject` sealed again too (and its plain subject, opened on the way, is what
   the other values' associated data names);
3. counts that no row names an older key any more, and destroys the older epochs' keys
   (`retire_epochs_before`): the replaced files, until a vacuum removes them, hold nothing anyone can open.
A value that does not open fails the stream's step (nothing is retired), not the job. Each step is one
Delta commit or one keyring rewrite, so a run killed anywhere is finished by the next one (failpoints
`rekey.merge` and `rekey.merged`, before and after the MERGE; tests/keys/test_rekey_kill.py).
The keys reach Spark only as an in-memory broadcast view.
"""

from __future__ import annotations

import json
import logging
from pyspark.sql import SparkSession

from engine.keys import Keyring, sql_decrypt, sql_encrypt
from engine.store.layout import Layout, TableLocation
from engine.store.objectstore import ObjectStoreError
from engine.store.sealed import key_refs
from jobs.tables import LeaseTimes, StreamLogs, leased, reached, spark_table

log = logging.getLogger("jetlake.jobs.rekey")


def encrypted_streams(layout: Layout) -> list[tuple[str, str, int, bool]]:
    """(name, stream id, key tokens, protected subjects) of the account's encrypted streams."""
    out = []
    folder = layout.stream_configs_key
    for meta in list(layout.objects.list(folder)):
        if "/" in meta.key[len(folder) + 1:] or not meta.key.endswith(".json"):
            continue
        try:
            record = json.loads(layout.objects.get(meta.key).data)
            if "encryption" in record:
                out.append((str(record["config"]["name"]), str(record["stream_id"]),
                            int(record["encryption"].get("key_tokens", 0)),
                            bool(record["encryption"].get("protected_subjects", False))))
        except (ObjectStoreError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping stream config %s: %s", meta.key, exc)
    return sorted(out)


def rekey(spark: SparkSession, layout: Layout, keyring: Keyring, times: LeaseTimes | None = None) -> dict[str, int]:
    """Re-encrypts every encrypted stream of the account that has keys of older epochs; returns figures."""
    figures = {"streams_rekeyed": 0, "streams_waiting": 0, "rows_reencrypted": 0, "keys_retired": 0, "rekey_errors": 0}
    for name, stream_id, key_tokens, protected in encrypted_streams(layout):
        try:
            result = _rekey_stream(spark, layout, keyring, name, stream_id, key_tokens, protected, times)
        except Exception:
            figures["rekey_errors"] += 1
            log.exception("rekey %s failed: nothing retired", name)
            continue
        for key, value in result.items():
            figures[key] += value
    return figures


def _rekey_stream(spark: SparkSession, layout: Layout, keyring: Keyring, name: str, stream_id: str,
                  key_tokens: int, protected: bool, times: LeaseTimes | None) -> dict[str, int]:
    keys = keyring.stream(stream_id, key_tokens)
    pairs = keys.rotation_keys()
    if not pairs:
        return {}
    old_refs = {old for old, _, _, _ in pairs}
    table = layout.stream_table_location(name)
    with leased(layout, table, times):
        if _log_needs(StreamLogs(layout, name), old_refs):
            log.info("rekey %s: its log still holds values under older keys; it waits for a flush", name)
            return {"streams_waiting": 1}
        view = f"_jetlake_rekey_{stream_id}"
        spark.createDataFrame(pairs, "old_ref binary, old_key binary, new_ref binary, new_key binary") \
            .createOrReplaceTempView(view)
        try:
            reached("rekey.merge")
            updated = _merge(spark, table, stream_id, view, protected)
            reached("rekey.merged")
            subject = " OR substring(s.subject, 1, 5) = m.old_ref" if protected else ""
            left = spark.sql(
                f"SELECT /*+ BROADCAST(m) */ count(*) FROM {spark_table(table)} s JOIN {view} m "
                f"ON substring(s.data, 1, 5) = m.old_ref OR substring(s.headers, 1, 5) = m.old_ref{subject}"
            ).collect()[0][0]
        finally:
            spark.catalog.dropTempView(view)
        if left:
            raise RuntimeError(f"{left} rows still name older keys after the rewrite")
        retired = keys.retire_epochs_before(keys.epoch)
    log.info("rekey %s: %d rows sealed again under epoch %d, %d older keys destroyed", name, updated, keys.epoch,
             len(retired))
    return {"streams_rekeyed": 1, "rows_reencrypted": updated, "keys_retired": len(retired)}


def _merge(spark: SparkSession, table: TableLocation, stream_id: str, view: str, protected: bool) -> int:
    opened_subject = sql_decrypt("s.subject", "m.old_key", stream_id, "subject", seq_sql="s.seq", strict=True)
    subject = f"CAST({opened_subject} AS STRING)" if protected else "s.subject"

    def again(column: str, field: str) -> str:
        plain = sql_decrypt(f"s.{column}", "m.old_key", stream_id, field, seq_sql="s.seq", subject_sql=subject,
                            strict=True)
        sealed = sql_encrypt(plain, "m.new_key", "m.new_ref", stream_id, field, seq_sql="s.seq", subject_sql=subject)
        return f"CASE WHEN s.{column} IS NULL THEN NULL ELSE {sealed} END"

    columns = f"{again('data', 'data')} AS data, {again('headers', 'headers')} AS headers"
    updates = "t.data = u.data, t.headers = u.headers"
    if protected:
        columns += ", " + sql_encrypt(opened_subject, "m.new_key", "m.new_ref", stream_id, "subject", seq_sql="s.seq") \
            + " AS subject"
        updates += ", t.subject = u.subject"
    row = spark.sql(
        f"MERGE INTO {spark_table(table)} t USING ("
        f"SELECT /*+ BROADCAST(m) */ s.seq AS seq, {columns} "
        f"FROM {spark_table(table)} s JOIN {view} m ON substring(s.data, 1, 5) = m.old_ref"
        f") u ON t.seq = u.seq WHEN MATCHED THEN UPDATE SET {updates}"
    ).collect()
    return int(row[0]["num_updated_rows"]) if row else 0


def _log_needs(logs: StreamLogs, refs: set[bytes]) -> bool:
    """Whether a record of the stream's log holds a value under one of `refs` (or cannot be read)."""
    try:
        return any(key_refs(r.kind, r.payload) & refs for r in logs.records())
    except ValueError:
        return True
