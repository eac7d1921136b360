"""The row-group cache's memory: what it drops is freed at once, not at the next cyclic collection.

The gateway runs Python's cyclic collector rarely (api/cli.py: `gc.freeze`, high thresholds), so an
object that only the cyclic collector frees stays in memory for a long time. pyarrow's
`FileMetaData.schema` made every parsed footer such an object (a cycle through its cached
`ParquetSchema`): random reads over a 100 M-message table, whose footers do not all fit the cache,
grew the gateway by ~3 MB a read (bench/capacity.py, 4 GB after 1,200 reads).
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

from engine import JetStream
from engine.store.delta import DeltaStore
from engine.store.table_reads import Footer


def test_a_footer_dropped_by_the_cache_leaves_no_cyclic_garbage(js: JetStream) -> None:
    js.add_stream({"name": "S", "subjects": ["s.>"]})
    for i in range(3000):
        js.publish_one(f"s.{i % 7}", b"x" * 20)
    js.flush()
    store = js.stream("S").store
    assert isinstance(store, DeltaStore)
    files = sorted(Path(js.layout.stream_table("S")).rglob("*.parquet"))
    assert files
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        footer = Footer.read(str(files[0]), None)
        assert footer.schema.names[:3] == ["seq", "subject", "ts"] and footer.meta.num_rows > 0
        assert np.all(footer.lows <= footer.highs)
        del footer
        assert gc.collect() == 0, "a parsed footer was left for the cyclic collector"
        cache = store.reads._row_groups
        cache.clear()
        cache.footer(str(files[0]))  # what a read by sequence parses and keeps
        assert cache.nbytes > 0
        cache.clear()  # and what the cache drops
        assert gc.collect() == 0, "a footer dropped by the cache was left for the cyclic collector"
    finally:
        if was_enabled:
            gc.enable()
