#!/usr/bin/env python3
"""CPU per message of the NATS door's pull path, in-process: what `nats bench js fetch --batch 500` costs.

A real engine on a tmp warehouse, stream S of `--msgs` 1 KiB messages (flushed to the Delta table), a
durable pull consumer with explicit acks and no `max_ack_pending` limit. Then, until every message is
acked, the engine calls the NATS door makes for one pull of 500 and its acks (api/nats/pull.py,
fetcher.py, delivery.py, writes.py): `fetch_nowait(S, C, 500)`, the MSG frames of the batch
(`send_deliveries` to one subscriber, whose connection keeps the bytes), `ack_run_nowait` of the 500
sequences; and the ack table's flush every `--flush-every` batches (the gateway's flusher runs once a
second). The collector runs as in the gateway (api/cli.py). Each step's CPU (time.process_time) is
summed over the run and printed in µs per message; the machine is shared, so compare runs taken back
to back, not across hours.

    PYTHONPATH=$PWD .venv/bin/python bench/fetch_path.py [--msgs 100000] [--rounds 3] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa

sys.path.append(str(Path(__file__).resolve().parent.parent))  # PYTHONPATH first: compare trees

from api.nats.delivery import ack_prefix, send_deliveries  # noqa: E402
from api.nats.subscriptions import Match, Subscription  # noqa: E402
from engine import EngineOptions, JetStream, PlainBatch  # noqa: E402

STREAM, CONSUMER, INBOX = "S", "C", "_INBOX.bench"


class _Conn:
    """A connection that keeps the byte count of what the door would write to its socket."""

    headers = True

    def __init__(self) -> None:
        self.sent = 0

    def send(self, data: bytes) -> None:
        self.sent += len(data)


class _Sublist:
    def __init__(self, sub: Subscription) -> None:
        self._match = Match((sub,), ())

    def match(self, subject: str) -> Match:
        return self._match


class _Server:
    def __init__(self, conn: _Conn) -> None:
        self.sublist = _Sublist(Subscription(conn, INBOX, None, b"1"))  # type: ignore[arg-type]


def load(js: JetStream, msgs: int) -> None:
    js.add_stream({"name": STREAM, "subjects": ["bench.>"]})
    payload = b"x" * 1024
    for start in range(0, msgs, 1000):
        n = min(1000, msgs - start)
        js.publish_batch(PlainBatch([f"bench.{i % 4}" for i in range(n)], pa.array([payload] * n, pa.binary())))
    js.flush()


def consume(js: JetStream, batch: int, flush_every: int, name: str) -> dict[str, float]:
    """Pulls and acks the whole stream once; CPU seconds per step."""
    js.add_consumer(STREAM, {"durable_name": name, "ack_policy": "explicit", "max_ack_pending": -1})
    conn = _Conn()
    server = _Server(conn)
    prefix = ack_prefix(STREAM, name)
    cpu = {"fetch": 0.0, "frame": 0.0, "ack": 0.0, "flush": 0.0}
    delivered = batches = 0
    clock = time.process_time
    while True:
        t0 = clock()
        got = js.fetch_nowait(STREAM, name, batch, 0)
        if got is None:
            got = js.fetch(STREAM, name, batch, 0)
        t1 = clock()
        if not got:
            break
        send_deliveries(server, INBOX, got, prefix, False)  # type: ignore[arg-type]
        t2 = clock()
        seqs = [d.msg.seq for d in got]
        if js.ack_run_nowait(STREAM, name, seqs, "ack") is None:
            js.ack_run(STREAM, name, seqs, "ack")
        t3 = clock()
        batches += 1
        if batches % flush_every == 0:
            js.flush(fold_acks=False)
        t4 = clock()
        cpu["fetch"] += t1 - t0
        cpu["frame"] += t2 - t1
        cpu["ack"] += t3 - t2
        cpu["flush"] += t4 - t3
        delivered += len(got)
    info = js.consumer_info(STREAM, name)
    assert info["num_ack_pending"] == 0 and info["num_pending"] == 0, info
    cpu["delivered"] = delivered
    cpu["bytes"] = conn.sent
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--msgs", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="consumers, each reading the whole stream")
    parser.add_argument("--flush-every", type=int, default=60, help="batches between ack-table flushes")
    parser.add_argument("--profile", help="write a cProfile of the rounds here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="jl-fetch-"))
    try:
        js = JetStream(root / "warehouse", EngineOptions())
        js.open(start_flusher=False)
        try:
            load(js, args.msgs)
            gc.freeze()  # as the gateway runs (api/cli.py): the loaded state frozen, young collections rare
            gc.set_threshold(50_000, 50, 100)
            consume(js, args.batch, args.flush_every, "WARM")  # caches, imports, first reads
            profiler = cProfile.Profile() if args.profile else None
            results = []
            for r in range(args.rounds):
                if profiler:
                    profiler.enable()
                cpu = consume(js, args.batch, args.flush_every, f"C{r}")
                if profiler:
                    profiler.disable()
                n = cpu.pop("delivered")
                cpu.pop("bytes")
                per = {k: round(v / n * 1e6, 2) for k, v in cpu.items()}
                per["total"] = round(sum(per.values()), 2)
                results.append(per)
                print(json.dumps({"round": r, "msgs": n, "us_per_msg": per}), file=sys.stderr)
            if profiler:
                profiler.dump_stats(args.profile)
            best = {k: min(r[k] for r in results) for k in results[0]}
            print(json.dumps({"msgs": args.msgs, "batch": args.batch, "best_us_per_msg": best}))
        finally:
            js.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
