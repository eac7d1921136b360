"""A commit's Parquet data files, written by pyarrow straight from the rows it is given.

delta-rs's `write_deltalake` copies the rows it is handed into its own buffers before it encodes them:
a flush of 300,000 messages took 71 MB more RSS through it, against 28 MB and less than half the
CPU written here (one encoder per file, fed from the rows as they are, or for a commit of several
partitions from one joined copy of them; a local file written in place, one on S3 PUT from memory).
The commit (commits.py, delta_log.py) is made of the add actions made here, which carry what
delta-rs's writer puts in them: the Hive partition folders as it names them, and the statistics of
the table's `delta.dataSkippingStatsColumns` only (no subject or payload value enters the log),
timestamps cut to milliseconds as delta-rs cuts them.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.store.delta_actions import AddFile
from engine.store.layout import TableLocation

log = logging.getLogger(__name__)

TARGET_FILE_BYTES = 100 * 1024 * 1024  # a file is closed past this many bytes, as delta-rs's target file size
_GROUPS_A_WRITE = 64  # row groups handed to the encoder at once (the file's size is checked between them)


@dataclass(frozen=True)
class FileEncoding:
    """How a table's files are encoded; top-level column names."""

    row_group_rows: int = 1024 * 1024
    compression: str = "snappy"
    plain: frozenset[str] = frozenset()  # no dictionary (ciphertext: every value distinct)
    delta_encoded: frozenset[str] = frozenset()  # DELTA_BINARY_PACKED (ascending unique integers)
    no_statistics: frozenset[str] = frozenset()  # no min/max in the footers (payloads, ciphertext)


def write_data_files(
    table: TableLocation, rows: pa.Table, partition_by: list[str], encoding: FileEncoding, stats_columns: list[str],
) -> list[AddFile]:
    """Writes `rows` into new files of `table` (a partition's rows in its own folder, in their order) and
    returns their add actions; no rows, no file. A failed write removes the files it made before it
    raises: nothing refers to them yet."""
    written: list[AddFile] = []
    try:
        for values, part in _partitions(rows, partition_by):
            folder = "/".join(f"{column}={quote(value, safe='')}" for column, value in zip(partition_by, values))
            for action in _write_partition(table, folder, dict(zip(partition_by, values)), part, encoding,
                                           stats_columns):
                written.append(action)
    except BaseException:
        _remove(table, written)
        raise
    return written


def _remove(table: TableLocation, actions: list[AddFile]) -> None:
    """Deletes files that no commit refers to (a write that failed part way)."""
    for action in actions:
        try:
            table.objects.delete(f"{table.key}/{action.path}")
        except Exception as exc:  # noqa: BLE001 - an orphan file is vacuum's; the write's own error goes on
            log.warning("could not remove %s/%s after a failed write: %s", table, action.path, exc)


def _partitions(rows: pa.Table, partition_by: list[str]) -> Iterator[tuple[list[str], pa.Table]]:
    """Each partition's values and rows, without the partition columns (they live in the folder names)."""
    if not rows.num_rows:
        return
    if not partition_by:
        yield [], rows
        return
    if len(partition_by) != 1:
        raise ValueError(f"one partition column is written here, not {partition_by}")
    column = rows.column(partition_by[0])
    if column.null_count:
        raise ValueError(f"a row has no {partition_by[0]}")
    data = rows.drop_columns(partition_by)
    low, high = (value.as_py() for value in pc.min_max(column).values())
    if low == high:
        yield [low], data
        return
    encoded = pc.dictionary_encode(column.combine_chunks())
    values = encoded.dictionary.to_pylist()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")  # each partition's rows together, still in sequence order
    ends = np.cumsum(np.bincount(codes, minlength=len(values))).tolist()
    data = data.combine_chunks()  # one copy: `take` from the log's many small batches joins them on every call
    for code, (start, end) in enumerate(zip([0, *ends[:-1]], ends)):
        yield [values[code]], data.take(pa.array(order[start:end]))


def _write_partition(
    table: TableLocation, folder: str, partition_values: dict[str, str], rows: pa.Table, encoding: FileEncoding,
    stats_columns: list[str],
) -> Iterator[AddFile]:
    """A partition's files: one, or more past TARGET_FILE_BYTES each."""
    offset = 0
    while offset < rows.num_rows:
        name = f"part-00001-{uuid.uuid4()}-c000.{_suffix(encoding)}parquet"
        relative = f"{folder}/{name}" if folder else name
        sink = _FileSink(table, relative)
        try:
            end = _write_file(sink.stream, rows, offset, encoding)
            stats = _stats(rows.slice(offset, end - offset), stats_columns)
            size = sink.close()
        except BaseException:
            sink.discard()
            raise
        yield AddFile(path=relative, size=size, partition_values=partition_values,
                      modification_time=time.time_ns() // 1_000_000, data_change=True, stats=stats)
        offset = end


def _write_file(stream: pa.NativeFile, rows: pa.Table, offset: int, encoding: FileEncoding) -> int:
    """Writes rows from `offset` until they end or the file passes TARGET_FILE_BYTES; the offset reached.
    The encoder takes `_GROUPS_A_WRITE` row groups at a time, from the rows' own buffers."""
    step = encoding.row_group_rows * _GROUPS_A_WRITE
    with pq.ParquetWriter(stream, rows.schema, **_writer_options(rows.schema, encoding)) as writer:
        while offset < rows.num_rows and stream.tell() < TARGET_FILE_BYTES:
            writer.write_table(rows.slice(offset, step), row_group_size=encoding.row_group_rows)
            offset = min(offset + step, rows.num_rows)
    return offset


def _suffix(encoding: FileEncoding) -> str:
    return "" if encoding.compression.lower() in ("none", "uncompressed") else f"{encoding.compression.lower()}."


class _FileSink:
    """Where one file's bytes go: the local file itself, or memory then one PUT to the object store."""

    def __init__(self, table: TableLocation, relative: str) -> None:
        self.table = table
        self.key = f"{table.key}/{relative}"
        self.local = None if table.local_path is None else table.local_path / relative
        if self.local is not None:
            self.local.parent.mkdir(parents=True, exist_ok=True)
            self.stream: pa.NativeFile = pa.OSFile(str(self.local), "wb")
        else:
            self.stream = pa.BufferOutputStream()

    def close(self) -> int:
        """Makes the file whole where it belongs; its size in bytes."""
        if self.local is not None:
            self.stream.close()
            return os.path.getsize(self.local)
        body = self.stream.getvalue()
        self.table.objects.put(self.key, memoryview(body).cast("B"))  # obstore reads unsigned bytes
        return body.size

    def discard(self) -> None:
        if not self.stream.closed:
            self.stream.close()
        if self.local is not None:
            self.local.unlink(missing_ok=True)


def _writer_options(schema: pa.Schema, encoding: FileEncoding) -> dict[str, object]:
    leaves = {field.name: list(_leaf_paths(field.name, field.type)) for field in schema}
    return {
        "compression": encoding.compression,
        "use_dictionary": [p for name, paths in leaves.items()
                           if name not in encoding.plain and name not in encoding.delta_encoded for p in paths],
        "column_encoding": {name: "DELTA_BINARY_PACKED" for name in encoding.delta_encoded if name in leaves},
        "write_statistics": [p for name, paths in leaves.items() if name not in encoding.no_statistics for p in paths],
    }


def _leaf_paths(path: str, kind: pa.DataType) -> Iterator[str]:
    """The Parquet column paths under an Arrow field, as pyarrow names them (compliant nested types)."""
    if pa.types.is_map(kind):
        yield from _leaf_paths(f"{path}.key_value.key", kind.key_type)
        yield from _leaf_paths(f"{path}.key_value.value", kind.item_type)
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        yield from _leaf_paths(f"{path}.list.element", kind.value_type)
    elif pa.types.is_struct(kind):
        for child in kind:
            yield from _leaf_paths(f"{path}.{child.name}", child.type)
    else:
        yield path


def _stats(rows: pa.Table, columns: list[str]) -> str:
    """The add action's statistics: the row count, and min, max and null count of each stats column."""
    lows: dict[str, object] = {}
    highs: dict[str, object] = {}
    nulls: dict[str, int] = {}
    for name in columns:
        if name not in rows.column_names:
            continue
        column = rows.column(name)
        nulls[name] = column.null_count
        if column.null_count == len(column):
            continue
        low, high = pc.min_max(column).values()
        if pa.types.is_timestamp(column.type):
            lows[name], highs[name] = _timestamp(low), _timestamp(high)
        elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            lows[name], highs[name] = low.as_py(), high.as_py()
    return orjson.dumps({"numRecords": rows.num_rows, "minValues": lows, "maxValues": highs,
                         "nullCount": nulls}).decode()


def _timestamp(value: pa.Scalar) -> str:
    """A timestamp as delta-rs writes it in statistics: UTC, cut to milliseconds, and no fraction only
    on a whole second (`…:20Z`, `…:20.000Z` for 1 µs past it, `…:20.299Z`)."""
    micros = value.cast(pa.timestamp("us", tz="UTC")).value
    seconds, fraction = divmod(micros, 1_000_000)
    text = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{text}.{fraction // 1000:03d}Z" if fraction else f"{text}Z"
