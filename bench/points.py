"""Point reads in-process: `last_by_subj` over a stream of M distinct subjects, and gets by sequence
and by time at random positions of a stream of N messages on 10 subjects, after a restart (every
read comes from the table, none from the log). Prints one JSON line: per read, the thread's CPU time
(what the read costs, whatever else the machine runs) and the wall time, p50 and p99, cold (first
touch of a row group) mixed with warm as random reads give them.

    PYTHONPATH=. python bench/points.py --workdir /tmp/points [--subjects 1000000] [--messages 1000000]

`--workdir` keeps the warehouses: a second run reuses them (only the reads are measured again).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import pyarrow as pa

from engine import EngineOptions, JetStream
from engine.messages import PlainBatch

BATCH = 50_000


def _open(warehouse: Path) -> JetStream:
    js = JetStream(warehouse, EngineOptions())
    js.open(start_flusher=False)
    return js


def _load(warehouse: Path, stream: str, subjects: list[str], count: int, flush_every: int = 4) -> None:
    """`count` messages of 100 B cycling through `subjects`, flushed every `flush_every` batches of
    BATCH (one file per flush: 8 makes files of ~400 row groups, as a 100 M-message load does)."""
    if (warehouse / "default" / "streams" / stream).exists():
        return
    warehouse.mkdir(parents=True, exist_ok=True)
    js = _open(warehouse)
    try:
        js.add_stream({"name": stream, "subjects": [f"{stream.lower()}.>"]})
        payload = pa.array([b"m" * 100] * BATCH, pa.binary())
        for start in range(0, count, BATCH):
            n = min(BATCH, count - start)
            js.publish_batch(PlainBatch([subjects[i % len(subjects)] for i in range(start, start + n)], payload[:n]))
            if (start // BATCH) % flush_every == flush_every - 1:
                js.flush()
        js.flush()
    finally:
        js.close()


def _rss_mb() -> dict[str, float]:
    """The process's resident memory now and at its peak (/proc/self/status), in MB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {name: round(int(status[name].split()[0]) / 1024, 1) for name in ("VmRSS", "VmHWM")}


def _percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"p50_ms": round(values[len(values) // 2] * 1000, 3),
            "p99_ms": round(values[int(len(values) * 0.99)] * 1000, 3)}


def _measure(read, args: list) -> dict[str, dict[str, float]]:
    cpu, wall = [], []
    for arg in args:
        c0, w0 = time.thread_time(), time.perf_counter()
        read(arg)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - w0)
    return {"cpu": _percentiles(cpu), "wall": _percentiles(wall)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--subjects", type=int, default=1_000_000)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--only", default="subjects,messages")
    parser.add_argument("--flush-every", type=int, default=4, help="batches of 50,000 per file written")
    parser.add_argument("--profile", default=None, help="write a cProfile of the reads here")
    opts = parser.parse_args()
    work = Path(opts.workdir)
    rng = random.Random(7)
    result: dict[str, object] = {"load_avg": os.getloadavg()[0]}
    profiler = None
    if opts.profile:
        import cProfile

        profiler = cProfile.Profile()
    if "subjects" in opts.only:
        names = [f"sub.{k}" for k in range(opts.subjects)]
        _load(work / "subjects", "SUB", names, opts.subjects)
        js = _open(work / "subjects")
        try:
            stream = js.stream("SUB")
            picks = [names[rng.randrange(len(names))] for _ in range(opts.reads)]
            if profiler:
                profiler.enable()
            result["last_by_subj"] = _measure(stream.last_by_subject, picks)
            if profiler:
                profiler.disable()
        finally:
            js.close()
    if "messages" in opts.only:
        names = [f"msg.{k}" for k in range(10)]
        _load(work / "messages", "MSG", names, opts.messages, opts.flush_every)
        js = _open(work / "messages")
        try:
            stream = js.stream("MSG")
            seqs = [rng.randrange(1, opts.messages + 1) for _ in range(opts.reads)]
            result["get_by_seq"] = _measure(stream.get, seqs)
            first, last = stream.get(1).ts, stream.get(opts.messages).ts
            times = [rng.randrange(first, last + 1) for _ in range(opts.reads)]
            result["get_by_time"] = _measure(stream.at_or_after_time, times)
            result["rss_mb"] = _rss_mb()
        finally:
            js.close()
    if profiler:
        profiler.dump_stats(opts.profile)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
