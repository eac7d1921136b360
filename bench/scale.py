#!/usr/bin/env python3
"""Scale-out benchmark, first cut: one gateway on an S3 warehouse (versitygw on loopback), with the
log on local disk (`--wal local`) and in the bucket (`--wal object`).

Run:  .venv/bin/python bench/scale.py [--quick]

Progress goes to stderr; one JSON line with every figure goes to stdout. For each log mode:
  ack_latency       p50/p99 ms of single publishes, one client, sequential (the PubAck follows the
                    log write: a local write, or the object PUT)
  publish           messages/s of batches of 100 from one client, and the gateway's CPU seconds per
                    1,000 messages (per-process CPU, so the figure reads on a shared 2-core machine)
  consume           messages/s of pulls of 100 each acknowledged
  log_puts_per_1000 object PUTs of the log per 1,000 messages published in batches of 100
                    (`--wal object`: one per group commit), counted from the objects in the bucket
  failover_s        `--wal object`: kill -9 of the gateway under no load, then a second gateway on an
                    empty disk: seconds from its start to its first PubAck (includes process start)
Beside them `published`: Bufstream p50 260 ms / p99 500 ms, WarpStream p99 ~400 ms (their docs).
Not yet measured: two gateway processes (several gateways on one warehouse are not built yet), and
the table flush's own requests (delta-rs's are not counted from here). Every loop has a fixed count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.store.objectstore import WarehouseLocation  # noqa: E402
from tests.gateway import Gateway  # noqa: E402
from tests.s3 import S3Server, versitygw_binary  # noqa: E402

PUBLISHED = {"bufstream": {"p50_ms": 260, "p99_ms": 500}, "warpstream": {"p99_ms": 400}}
STREAM = "BENCH"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(ordered[len(ordered) // 2] * 1e3, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3)}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _gateway(s3: S3Server, warehouse: str, wal: str, state: Path) -> Gateway:
    state.mkdir(parents=True, exist_ok=True)
    return Gateway(warehouse, "--wal", wal, "--wal-dir", str(state), "--flush-interval", "600",
                   "--nats-port", "0", env=s3.env, log_dir=state)


def _measure(s3: S3Server, wal: str, root: Path, singles: int, batches: int) -> dict[str, object]:
    warehouse = s3.warehouse(f"bench-{wal}-{int(time.time())}")
    location = WarehouseLocation.parse(warehouse, s3.env)
    gw = _gateway(s3, warehouse, wal, root / wal / "one").start(timeout=120)
    figures: dict[str, object] = {}
    try:
        assert gw.proc is not None
        with httpx.Client(base_url=gw.url, timeout=30.0) as c:
            c.post("/v1/streams", json={"name": STREAM, "subjects": ["bench.>"]}).raise_for_status()
            consumer = {"durable_name": "C", "ack_policy": "explicit"}
            c.post(f"/v1/streams/{STREAM}/consumers", json=consumer).raise_for_status()
            samples = []
            for i in range(singles):
                began = time.perf_counter()
                c.post("/v1/publish/bench.one", content=b"x" * 100).raise_for_status()
                samples.append(time.perf_counter() - began)
            figures["ack_latency"] = _percentiles(samples)
            _say(f"{wal}: ack latency {figures['ack_latency']}")
            c.post("/v1/flush").raise_for_status()  # the single publishes leave the log
            body = {"messages": [{"subject": f"bench.{i % 4}", "text": "y" * 100} for i in range(100)]}
            cpu, began = _cpu_seconds(gw.proc.pid), time.perf_counter()
            for _ in range(batches):
                c.post("/v1/publish", json=body).raise_for_status()
            seconds, used = time.perf_counter() - began, _cpu_seconds(gw.proc.pid) - cpu
            messages = 100 * batches
            figures["publish"] = {"msgs_per_s": round(messages / seconds),
                                  "gateway_cpu_s_per_1000": round(used / messages * 1000, 4)}
            puts = sum(1 for m in location.open().list(f"default/_log/{STREAM}") if m.key.endswith(".wal"))
            figures["log_puts_per_1000"] = round(puts / messages * 1000, 2) if wal == "object" else 0
            _say(f"{wal}: publish {figures['publish']}, log PUTs per 1000: {figures['log_puts_per_1000']}")
            began, got = time.perf_counter(), 0
            while got < messages:
                pull = {"batch": 100, "no_wait": True}
                msgs = c.post(f"/v1/streams/{STREAM}/consumers/C/next", json=pull).json()["messages"]
                if not msgs:
                    break
                c.post(f"/v1/streams/{STREAM}/consumers/C/ack", json={"acks": [{"token": m["ack"]} for m in msgs]})
                got += len(msgs)
            figures["consume"] = {"msgs_per_s": round(got / (time.perf_counter() - began)), "messages": got}
            _say(f"{wal}: consume {figures['consume']}")
        if wal == "object":
            gw.kill9()
            second = _gateway(s3, warehouse, wal, root / wal / "two")
            began = time.perf_counter()
            second.start(timeout=120)
            try:
                with httpx.Client(base_url=second.url, timeout=30.0) as c:
                    c.post("/v1/publish/bench.after", content=b"z").raise_for_status()
                figures["failover_s"] = round(time.perf_counter() - began, 2)
            finally:
                second.stop()
            _say(f"{wal}: failover {figures['failover_s']} s")
    finally:
        gw.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: few messages")
    args = parser.parse_args()
    binary = versitygw_binary()
    if binary is None:
        sys.exit("the S3 server (versitygw) is not installed: run scripts/setup.sh")
    singles, batches = (50, 20) if args.quick else (500, 200)
    with tempfile.TemporaryDirectory(prefix="jetlake-scale-") as tmp:
        root = Path(tmp)
        (root / "s3").mkdir()
        s3 = S3Server(root / "s3", binary).start()
        try:
            result = {"bench": "scale", "gateways": 1, "published": PUBLISHED,
                      **{wal: _measure(s3, wal, root, singles, batches) for wal in ("local", "object")}}
        finally:
            s3.stop()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
