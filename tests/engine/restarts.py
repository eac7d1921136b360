"""An engine opened without its flusher, and what a kill -9 leaves of one: for restart tests."""

from __future__ import annotations

from pathlib import Path

from engine import EngineOptions, JetStream, ManualClock


def open_engine(warehouse: Path, clock: ManualClock) -> JetStream:
    js = JetStream(warehouse, EngineOptions(), clock=clock)
    js.open(start_flusher=False)
    return js


def crash(js: JetStream) -> None:
    """What a kill -9 leaves: no final flush, no snapshot or catalog copy written; the warehouse is let go."""
    for stream in js.streams():
        stream.store.wal.close()
    js.consumers.acks.wal.close()
    js._owner.release()
