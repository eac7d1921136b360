"""delta-rs's view of a table: the independent reader tests check what the engine's own log writer
(engine/store/delta_log.py) made."""

from __future__ import annotations

from deltalake import DeltaTable

from engine.store.layout import TableLocation


def open_table(table: TableLocation) -> DeltaTable:
    return DeltaTable(table.uri, storage_options=table.storage_options)
