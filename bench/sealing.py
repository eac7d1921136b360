#!/usr/bin/env python3
"""Encryption at rest in-process: the engine's CPU per message with encryption on beside off.

Run:  .venv/bin/python bench/sealing.py [--quick] [--rounds N]

Two engines (engine.JetStream, no HTTP) on fresh warehouses, one plain and one with a master key, take
the same messages (bench/encryption.py's distinct 1 KiB records), in rounds that alternate which goes
first:
  pub_a    1,000 single publishes;
  pub_b    batches of 1,000 with a header on every message;
  flush    the flush of what a round published (the table's Parquet files);
  consume  after both engines restarted, a pull consumer reads everything back in batches of 500.
Then `write_<layout>`: flush_commits.py's writer properties for the same sealed table, the plain stream's
(snappy, dictionaries) against the encrypted stream's (no dictionary, statistics or compression).
Figures are CPU (time.process_time: user + system of this process, the writer's threads included) per
message, the least of the rounds: on a machine shared with other work, wall time and the gateway
bench's throughput move by ±30 % and more, CPU per operation much less, and the least of several
rounds least of all. `<phase>_ratio` = off / on (above 1: cheaper with encryption on).
Progress goes to stderr; one JSON line with every figure goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, log, set_log_name  # noqa: E402
from encryption import Payloads  # noqa: E402

sys.path.insert(0, str(ROOT))

from engine import EngineOptions, JetStream, ManualClock  # noqa: E402
from engine.keys import MasterKey  # noqa: E402
from engine.messages import InboundMessage  # noqa: E402
from engine.store import flush_commits  # noqa: E402
from tests.delta_tables import open_table  # noqa: E402
from engine.store.data_files import write_data_files  # noqa: E402
from engine.store.layout import PARTITION_COLUMN, Layout  # noqa: E402

KEY = MasterKey.from_config("bench-sealing-key-0123456789abcdef", "aes")
SIZES = {"quick": {"pub_a": 500, "pub_b": 5_000}, "full": {"pub_a": 1_000, "pub_b": 20_000}}


def cpu_us(work: Callable[[], object], count: int) -> float:
    start = time.process_time()
    work()
    return (time.process_time() - start) * 1e6 / count


def open_engine(folder: Path, encrypted: bool) -> JetStream:
    engine = JetStream(folder, EngineOptions(key=KEY if encrypted else None), clock=ManualClock())
    engine.open(start_flusher=False)
    return engine


def main() -> int:
    set_log_name("sealing")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = SIZES["quick" if args.quick else "full"]
    payloads = Payloads("distinct")
    single = [[InboundMessage(f"bench.{i % 16}", p)] for i, p in enumerate(payloads.take(sizes["pub_a"]))]
    batches = []
    for k in range(0, sizes["pub_b"], 1_000):
        values = payloads.take(1_000)
        batches.append([InboundMessage(f"bench.b.{(k + j) % 64}", values[j], {"X-Trace": [f"t{k + j}"]})
                        for j in range(1_000)])
    figures: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    with tempfile.TemporaryDirectory(prefix="jetlake-bench-sealing-") as tmp:
        engines = {mode: open_engine(Path(tmp) / mode, mode == "on") for mode in figures}
        for engine in engines.values():
            engine.add_stream({"name": "BENCH", "subjects": ["bench.>"]})
        published = 0
        for r in range(args.rounds):
            log(f"round {r + 1}: publish and flush")
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                engine, out = engines[mode], figures[mode]
                out.setdefault("pub_a", []).append(cpu_us(lambda: [engine.publish(m) for m in single], len(single)))
                out.setdefault("pub_b", []).append(cpu_us(lambda: [engine.publish(b) for b in batches], sizes["pub_b"]))
                out.setdefault("flush", []).append(cpu_us(engine.flush, len(single) + sizes["pub_b"]))
            published += len(single) + sizes["pub_b"]
        for mode in figures:
            engines[mode].close()
            engines[mode] = open_engine(Path(tmp) / mode, mode == "on")
        for r in range(args.rounds):
            log(f"round {r + 1}: consume")
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                engine = engines[mode]
                engine.add_consumer("BENCH", {"durable_name": f"C{r}", "ack_policy": "none"})
                figures[mode].setdefault("consume", []).append(
                    cpu_us(lambda: _consume(engine, f"C{r}", published), published))
        table = open_table(engines["on"].stream("BENCH").store.table).to_pyarrow_table().combine_chunks()
        for engine in engines.values():
            engine.close()
        log("sealed table written with each layout")
        layouts = {"plain_layout": flush_commits.message_encoding, "sealed_layout": flush_commits.sealed_message_encoding}
        writes: dict[str, list[float]] = {name: [] for name in layouts}
        files = Layout(Path(tmp) / "files")
        for r in range(args.rounds):
            for name, encoding in layouts.items():
                target = files.stream_table_location(f"{name}-{r}")
                writes[name].append(cpu_us(lambda: write_data_files(
                    target, table, [PARTITION_COLUMN], encoding(table), []), table.num_rows))
    result: dict[str, object] = {"bench": "sealing", "quick": args.quick, "rounds": args.rounds, "sizes": sizes}
    for phase in figures["off"]:
        off, on = min(figures["off"][phase]), min(figures["on"][phase])
        result.update({f"{phase}_off_cpu_us": round(off, 2), f"{phase}_on_cpu_us": round(on, 2),
                       f"{phase}_ratio": round(off / on, 3)})
    result.update({f"write_{name}_cpu_us": round(min(values), 2) for name, values in writes.items()})
    print(json.dumps(result), flush=True)
    return 0


def _consume(engine: JetStream, consumer: str, total: int) -> None:
    got = 0
    while got < total:
        delivered = engine.fetch("BENCH", consumer, 500)
        if not delivered:
            raise RuntimeError(f"the consumer stopped after {got} of {total} messages")
        got += len(delivered)


if __name__ == "__main__":
    sys.exit(main())
