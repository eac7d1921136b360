"""Every row of one of the gateway's own small tables (the tombstones, an ack table), read from the
files its log lists: what `DeltaTable.to_pyarrow_table` gave, for unpartitioned tables."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from engine.store.delta_actions import LogState
from engine.store.layout import TableLocation


def read_all(table: TableLocation, state: LogState, schema: pa.Schema) -> pa.Table:
    """The rows of every file of `state`, as `schema` (those columns only, read alone; a column a file
    lacks, from before it was added, is null)."""
    if state.partition_columns:
        raise ValueError(f"{table}: whole tables are read here unpartitioned only")
    parts = []
    for add in list(state.files.values()):
        file = pq.ParquetFile(table.file(add.path), filesystem=table.filesystem)
        rows = file.read(columns=[name for name in schema.names if name in file.schema_arrow.names])
        columns = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
                   for f in schema]
        parts.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()
