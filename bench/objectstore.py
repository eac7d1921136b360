#!/usr/bin/env python3
"""Storage-interface benchmark: the warehouse's conditional writes on a local folder and on the S3
server of the tests (versitygw on loopback), the figures the object-storage design is costed on.

Run:  .venv/bin/python bench/objectstore.py [--quick]

Progress goes to stderr; one JSON line with every figure goes to stdout. For each backend, one
client, sequential calls on 200-byte objects (the size of a lease record), p50/p99 in milliseconds:
  create    put-if-absent of a fresh key (`If-None-Match: *`)
  replace   compare-and-swap at the version just written (`If-Match: <etag>`)
  get       read of one object with its version
  renew     a lease renewal (engine/store/leases.py: one conditional replace)
  acquire   acquire + release of a free lease (a read and two conditional writes)
Plus `s3_server_start_s`: from spawning scripts/s3-server.sh to the first HTTP answer.
Every loop has a fixed count; nothing runs past it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.clock import SystemClock  # noqa: E402
from engine.store.leases import Lease  # noqa: E402
from engine.store.objectstore import ObjectStore, WarehouseLocation  # noqa: E402
from tests.s3 import S3Server, versitygw_binary  # noqa: E402

PAYLOAD = b"x" * 200


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_ms": round(ordered[len(ordered) // 2] * 1e3, 3),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1e3, 3)}


def _timed(count: int, call: Callable[[int], object]) -> dict[str, float]:
    samples = []
    for i in range(count):
        began = time.perf_counter()
        call(i)
        samples.append(time.perf_counter() - began)
    return _ms(samples)


def measure(store: ObjectStore, count: int) -> dict[str, dict[str, float]]:
    figures = {"create": _timed(count, lambda i: store.create(f"bench/create/{i}", PAYLOAD))}
    version = [store.create("bench/cas", PAYLOAD).version]

    def swap(i: int) -> None:
        version[0] = store.replace("bench/cas", PAYLOAD + str(i).encode(), version[0]).version

    figures["replace"] = _timed(count, swap)
    figures["get"] = _timed(count, lambda i: store.get("bench/cas"))
    lease = Lease(store, "bench/lease.json", "bench", 60_000_000_000, clock=SystemClock())
    lease.acquire(timeout=5)
    figures["renew"] = _timed(count, lambda i: lease.renew())
    lease.release()
    figures["acquire"] = _timed(count // 4, lambda i: (lease.acquire(timeout=5), lease.release()))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 calls a figure instead of 1,000")
    count = 100 if parser.parse_args().quick else 1000
    result: dict[str, object] = {"calls": count}
    with tempfile.TemporaryDirectory() as tmp:
        print("local folder ...", file=sys.stderr)
        result["local"] = measure(WarehouseLocation.parse(Path(tmp) / "local").open(), count)
        binary = versitygw_binary()
        if binary is None:
            print("versitygw not installed: no S3 figures (scripts/setup.sh builds it with Go)", file=sys.stderr)
        else:
            print("S3 server (versitygw on loopback) ...", file=sys.stderr)
            (Path(tmp) / "s3").mkdir()
            server = S3Server(Path(tmp) / "s3" / "data", binary).start()
            try:
                result["s3_server_start_s"] = round(server.started_in, 3)
                result["s3"] = measure(server.location("bench").open(), count)
            finally:
                server.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
