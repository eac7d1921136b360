"""The commit path's own Parquet writer (engine/store/data_files.py) against delta-rs's `write_deltalake`,
which it replaced: the same folders, log paths, partition values and statistics for the same rows,
row groups in sequence order, and files split past the target size."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.store import data_files
from engine.store.commits import TableCommitter, ensure_table
from engine.store.flush_commits import message_encoding
from engine.store.layout import PARTITION_COLUMN, STREAM_SCHEMA, STREAM_TABLE_PROPERTIES, Layout
from tests.delta_tables import open_table

# every character a partition value may hold (layout.partition_value), '$' and '~' among them
PARTITIONS = ["orders", "$KV", "a~b", "x.y-z_1", "A$~.-_9", "$O~0123456789abcdef"]


def _rows(n: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    ts = 1_795_000_000_000_000 + np.sort(rng.integers(0, 10**9, n))
    headers = [[("Nats-Msg-Id", [f"id-{i}"])] if i % 3 == 0 else None for i in range(n)]
    table = pa.table({
        "seq": pa.array(np.arange(1, n + 1), pa.int64()),
        "subject": [f"{PARTITIONS[i % len(PARTITIONS)]}.k{i}" for i in range(n)],
        "ts": pa.array(ts, pa.int64()).cast(STREAM_SCHEMA.field("ts").type),
        "msg_id": [f"id-{i}" if i % 3 == 0 else None for i in range(n)],
        "headers": pa.array(headers, STREAM_SCHEMA.field("headers").type),
        "data": [rng.bytes(40) for _ in range(n)],
        "size": pa.array(np.full(n, 90), pa.int32()),
        PARTITION_COLUMN: [PARTITIONS[i % len(PARTITIONS)] for i in range(n)],
    }, schema=STREAM_SCHEMA)
    return pa.Table.from_batches(table.to_batches(max_chunksize=1000))  # the log's batches


def _adds(path: Path, version: int) -> list[dict]:
    lines = (path / "_delta_log" / f"{version:020d}.json").read_bytes().splitlines()
    return [orjson.loads(line)["add"] for line in lines if b'"add"' in line]


def _without_file_name(add: dict) -> tuple:
    folder = add["path"].rpartition("/")[0]
    return folder, tuple(sorted(add["partitionValues"].items())), orjson.loads(add["stats"])


def test_files_are_placed_and_described_as_delta_rs_writes_them(tmp_path: Path) -> None:
    rows = _rows(3_000)
    layout = Layout(tmp_path / "ours")
    ours = layout.stream_table_location("S")
    ensure_table(ours, STREAM_SCHEMA, [PARTITION_COLUMN], STREAM_TABLE_PROPERTIES)
    committer = TableCommitter(ours, "stream")
    version = committer.append(lambda _: rows, "S", 3_000, encoding=message_encoding(rows))
    theirs = tmp_path / "theirs"
    DeltaTable.create(str(theirs), schema=STREAM_SCHEMA, partition_by=[PARTITION_COLUMN],
                      configuration=STREAM_TABLE_PROPERTIES)
    write_deltalake(str(theirs), rows, mode="append", partition_by=[PARTITION_COLUMN])

    assert ours.local_path is not None
    ours_adds, theirs_adds = _adds(ours.local_path, version), _adds(theirs, 1)
    assert sorted(map(_without_file_name, ours_adds)) == sorted(map(_without_file_name, theirs_adds))
    folders = {p.name for p in ours.local_path.iterdir() if p.name != "_delta_log"}
    assert folders == {p.name for p in theirs.iterdir() if p.name != "_delta_log"} and len(folders) == len(PARTITIONS)
    assert "subject_partition=%24KV" in folders  # a '$' escaped on disk, its '%' again in the log
    assert {unquote(a["path"]) for a in ours_adds} == set(committer.added)
    assert all("subject" not in a["stats"] and "data" not in a["stats"] for a in ours_adds)

    for add in ours_adds:  # a partition's rows in sequence order, each file's row groups following on
        seqs = pq.read_table(ours.file(unquote(add["path"])), columns=["seq"]).column("seq").to_pylist()
        assert seqs == sorted(seqs) and orjson.loads(add["stats"])["numRecords"] == len(seqs)
    read = open_table(ours).to_pyarrow_table().sort_by("seq")
    assert read.select(STREAM_SCHEMA.names).equals(rows.combine_chunks().select(STREAM_SCHEMA.names))
    assert open_table(ours).transaction_version("S") == 3_000


def test_row_groups_run_in_sequence_order_with_the_stream_encoding(tmp_path: Path) -> None:
    every = _rows(5_000)
    rows = every.filter(pa.array([p == "orders" for p in every.column(PARTITION_COLUMN).to_pylist()]))
    table = Layout(tmp_path).stream_table_location("S")
    ensure_table(table, STREAM_SCHEMA, [PARTITION_COLUMN], STREAM_TABLE_PROPERTIES)
    encoding = data_files.FileEncoding(row_group_rows=256, delta_encoded=frozenset({"seq"}),
                                       no_statistics=frozenset({"data"}))
    TableCommitter(table, "stream").append(lambda _: rows, "S", 5_000, encoding=encoding)
    [file] = list(table.local_path.rglob("*.parquet"))  # type: ignore[union-attr]
    meta = pq.ParquetFile(file).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [256, 256, 256, 66]
    bounds = [meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups)]
    assert all(a.max < b.min for a, b in zip(bounds, bounds[1:])), "each group's sequences follow the last's"
    columns = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(meta.num_columns)}
    assert "DELTA_BINARY_PACKED" in columns["seq"].encodings
    assert "RLE_DICTIONARY" in columns["subject"].encodings
    assert "RLE_DICTIONARY" in columns["headers.key_value.key"].encodings
    assert not columns["data"].is_stats_set and columns["subject"].statistics.has_min_max


def test_a_partition_past_the_target_size_goes_to_several_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = _rows(6_000)
    table = Layout(tmp_path).stream_table_location("S")
    ensure_table(table, STREAM_SCHEMA, [PARTITION_COLUMN], STREAM_TABLE_PROPERTIES)
    monkeypatch.setattr(data_files, "TARGET_FILE_BYTES", 8 * 1024)
    monkeypatch.setattr(data_files, "_GROUPS_A_WRITE", 1)
    version = TableCommitter(table, "stream").append(
        lambda _: rows, "S", 6_000, encoding=data_files.FileEncoding(row_group_rows=100))
    adds = _adds(table.local_path, version)  # type: ignore[arg-type]
    assert len(adds) > 2 * len(PARTITIONS)
    for add in adds:
        stats = orjson.loads(add["stats"])
        seqs = pq.read_table(table.file(unquote(add["path"])), columns=["seq"]).column("seq").to_pylist()
        assert stats["numRecords"] == len(seqs) and seqs == sorted(seqs)
        assert (stats["minValues"]["seq"], stats["maxValues"]["seq"]) == (seqs[0], seqs[-1])
    assert sum(orjson.loads(a["stats"])["numRecords"] for a in adds) == 6_000
    assert open_table(table).to_pyarrow_table().column("seq").to_pylist().count(4_242) == 1


@pytest.mark.parametrize("micros", [0, 1, 999, 1_000, 299_999, 999_999])
def test_timestamp_statistics_are_cut_to_milliseconds_as_delta_rs_cuts_them(tmp_path: Path, micros: int) -> None:
    ts = pa.array([1_700_000_000_000_000 + micros], pa.int64()).cast(STREAM_SCHEMA.field("ts").type)
    rows = pa.table({"ts": ts})
    write_deltalake(str(tmp_path), rows)
    [theirs] = _adds(tmp_path, 0)
    assert orjson.loads(data_files._stats(rows, ["ts"])) == orjson.loads(theirs["stats"])
