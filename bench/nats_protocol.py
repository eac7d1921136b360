"""The NATS door against nats-server with the real `nats bench` (natscli v0.5.0), in one run.

Both servers get the same stream (`benchstream` on `benchsubject`: file storage, limits, discard new,
1 GB, direct gets) created over the protocol, then the same `nats bench` runs, one after the other:

    js pub sync                      1 KiB messages, one at a time: P50 latency
    js pub async --batch 1000        1 KiB messages, 1 client and 4 clients: messages per second
    js fetch --batch 500             the messages published above, durable consumer, explicit acks
    kv put / kv get                  128 B values, sync: P50 latency and rate

Each run ends when its server is idle again (`settle_s`): the background work a run leaves behind
(JetLake's flush of what it stored) is counted in that run's server CPU, not in the next run's time.
Prints one JSON line: each figure for nats-server and JetLake and their ratio (JetLake / nats-server;
for latencies a ratio above 1 means JetLake is slower). `--profile` runs the JetLake gateway under
py-spy (if installed) and writes a flame graph per run beside the logs. Everything listens on
127.0.0.1 and every process is stopped by its PID.

    .venv/bin/python bench/nats_protocol.py [--msgs 100000] [--quick] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST, find_nats_server, free_port, log, proc_cpu_s, ratio, set_log_name, settle, start_gateway, start_nats,
    stop_process,
)

ROOT = Path(__file__).resolve().parent.parent
STREAM, SUBJECT = "benchstream", "benchsubject"


def find_nats_cli() -> str | None:
    for candidate in (Path(sys.prefix) / "bin" / "nats", ROOT / ".venv" / "bin" / "nats"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("nats")


async def _create_stream(url: str) -> None:
    import nats
    from nats.js.api import DiscardPolicy, StorageType, StreamConfig

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(
            name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE, discard=DiscardPolicy.NEW,
            max_bytes=1 << 30, allow_direct=True,
        ))
    finally:
        await nc.close()


def run_bench(cli: str, url: str, home: Path, args: list[str], csv_path: Path, timeout: float) -> dict[str, float]:
    """One `nats bench` run; its aggregate CSV row (the first one) as numbers."""
    cmd = [cli, "--server", url, "bench", *args, "--no-progress", "--csv", str(csv_path)]
    log("running: " + " ".join(cmd[1:]))
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "HOME": str(home)},
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not csv_path.exists():
        raise RuntimeError(f"nats bench {' '.join(args)} failed ({done.returncode}): {done.stderr[-1500:]}")
    with csv_path.open() as f:
        rows = [r for r in csv.DictReader(line.lstrip("#") for line in f)]
    csv_path.unlink()
    # One row per client, no total: the clients run at once, so their rates add up; latencies are the
    # worst client's.
    return {
        "msgs_per_sec": round(sum(float(r["MsgsPerSec"]) for r in rows)),
        "p50_ms": round(max(float(r["P50LatencyMicroSecs"]) for r in rows) / 1000, 4),
        "p99_ms": round(max(float(r["P99LatencyMicroSecs"]) for r in rows) / 1000, 4),
        "clients": len(rows),
        "seconds": round(time.monotonic() - started, 2),
    }


# A run that reads what another run writes: `nats bench kv get` reads the keys `kv put` wrote (the bucket is
# made by the put), `js fetch` the messages the publish runs stored.
NEEDS = {"kv_get": "kv_put", "js_fetch": "js_pub_async_1"}


def suite(msgs: int, sync_msgs: int, kv_msgs: int) -> list[tuple[str, list[str]]]:
    size = ["--size", "1KiB", "--stream", STREAM]
    return [
        ("js_pub_sync", ["js", "pub", "sync", *size, "--msgs", str(sync_msgs), SUBJECT]),
        ("js_pub_async_1", ["js", "pub", "async", *size, "--batch", "1000", "--clients", "1", "--msgs", str(msgs), SUBJECT]),
        ("js_pub_async_4", ["js", "pub", "async", *size, "--batch", "1000", "--clients", "4", "--msgs", str(msgs), SUBJECT]),
        ("js_fetch", ["js", "fetch", "--stream", STREAM, "--batch", "500", "--msgs", str(msgs), "--size", "1KiB"]),
        ("kv_put", ["kv", "put", "--size", "128", "--msgs", str(kv_msgs)]),
        ("kv_get", ["kv", "get", "--size", "128", "--msgs", str(kv_msgs)]),
    ]


def measure(
    name: str, cli: str, url: str, work: Path, runs: list[tuple[str, list[str]]], timeout: float, pid: int
) -> dict[str, dict[str, float]]:
    """Each run's figures, plus the server's CPU time per message (user + system, from /proc): what the
    server itself spent, whatever else the machine was doing, including the background work the run
    left behind (JetLake's flush of what it stored, nats-server's block writes): each run ends when
    its server is idle again (`settle_s`), so no run pays for the one before."""
    asyncio.run(_create_stream(url))
    home = work / f"home-{name}"
    home.mkdir(exist_ok=True)
    out = {}
    for label, args in runs:
        before = proc_cpu_s(pid)
        out[label] = run_bench(cli, url, home, args, work / f"{name}-{label}.csv", timeout)
        out[label]["settle_s"] = settle(pid)
        after = proc_cpu_s(pid)
        count = int(args[args.index("--msgs") + 1])
        if before is not None and after is not None:
            out[label]["server_cpu_us_per_msg"] = round((after - before) / count * 1e6, 1)
        log(f"{name} {label}: {out[label]}")
    return out


def profile(pid: int, seconds: float, svg: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.prefix) / "bin" / "py-spy")
    if not os.access(spy, os.X_OK):
        log("py-spy not installed: no profile")
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--output", str(svg),
                             "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--msgs", type=int, default=100_000, help="messages per throughput run")
    parser.add_argument("--sync-msgs", type=int, default=10_000, help="messages of the sync publish run")
    parser.add_argument("--kv-msgs", type=int, default=10_000, help="puts and gets of the KV runs")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 5,000 messages, 1,000 sync")
    parser.add_argument("--only", default="", help="comma-separated run labels (default: all)")
    parser.add_argument("--keep", default=None, help="keep logs and data in this folder")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per nats bench run")
    parser.add_argument("--profile", action="store_true", help="py-spy the JetLake runs (flame graphs in --keep)")
    args = parser.parse_args()
    set_log_name("nats-bench")
    if args.quick:
        args.msgs, args.sync_msgs, args.kv_msgs = 5_000, 1_000, 1_000
    cli, server = find_nats_cli(), find_nats_server()
    if cli is None or server is None:
        print(json.dumps({"error": "needs the nats CLI (scripts/setup.sh builds it with Go) and nats-server in .venv/bin"}))
        return 2
    runs = suite(args.msgs, args.sync_msgs, args.kv_msgs)
    if args.only:
        wanted = set(args.only.split(","))
        wanted |= {NEEDS[label] for label in wanted if label in NEEDS}
        runs = [r for r in runs if r[0] in wanted]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="jetlake-nats-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, dict[str, float]]] = {}
    nats_proc = gateway = None
    try:
        nats_proc, nats_port = start_nats(server, work / "nats-store", work / "nats-server.log")
        results["nats_server"] = measure("nats", cli, f"nats://{HOST}:{nats_port}", work, runs, args.timeout, nats_proc.pid)
        stop_process(nats_proc, "nats-server")
        nats_proc = None
        (work / "warehouse").mkdir(exist_ok=True)
        nats_port = free_port()
        jetlake = Path(sys.prefix) / "bin" / "jetlake"
        gateway, _, _ = start_gateway(jetlake, work / "warehouse", work / "gateway.log", ["--nats-port", str(nats_port)])
        spy = profile(gateway.pid, 3600, work / "jetlake-profile.svg") if args.profile else None
        results["jetlake"] = measure("jetlake", cli, f"nats://{HOST}:{nats_port}", work, runs, args.timeout, gateway.pid)
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its flame graph on an interrupt, not on SIGTERM
            spy.wait(timeout=60)
    finally:
        stop_process(nats_proc, "nats-server")
        stop_process(gateway, "gateway")
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    line: dict[str, object] = {"bench": "nats_protocol", "msgs": args.msgs, "message_bytes": 1024, "value_bytes": 128,
                               "load_average": os.getloadavg()[0]}
    for label, _ in runs:
        a, b = results["nats_server"][label], results["jetlake"][label]
        line[label] = {
            "nats_server": a, "jetlake": b,
            "rate_ratio": ratio(b["msgs_per_sec"], a["msgs_per_sec"]),
            "p50_ratio": ratio(b["p50_ms"], a["p50_ms"]),
        }
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
