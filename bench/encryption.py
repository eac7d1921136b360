#!/usr/bin/env python3
"""Encryption at rest, on beside off: the gateway's publish, consume and KV figures in one run.

Run:  .venv/bin/python bench/encryption.py [--quick] [--rounds N] [--payloads distinct|repeated] [--no-shred]

Progress goes to stderr; at the end exactly one JSON line with every figure goes to stdout.

Each round starts two gateways in turn on fresh warehouses, one plain and one with
`--config` holding `jetstream { key, cipher: aes }` (every stream sealed, engine/store/sealed.py),
alternating which goes first, and measures on each (1 KiB payloads, the same ones for on and off):
  (warm-up)  200 single publishes first, unmeasured: the stream's first data key, imports, first-use costs;
  pub_a      one client, one message at a time (`POST /v1/publish/{subject}`, keep-alive): msgs/s, p50/p99;
  pub_b      one client, batches of 1,000 (`application/x-jetlake-batch`), a header on every message: msgs/s;
  flush_s    `POST /v1/flush` of what (a) and (b) published (the sealed batches are committed as they are);
             `table_mb`: the table's Parquet bytes then;
  restart_s  the gateway stopped and started again (the sealed table is read back, msg ids from sealed headers);
  consume    after the restart, so every read decrypts from the table: a pull consumer, batches of 500,
             one ack request per batch: msgs/s;
  kv_put / kv_get  one client, one KV operation at a time on a bucket of `kv` keys: ops/s;
  shred      a stream with `jetlake.key_tokens: 2`, `shred` messages under `users.42.*` flushed, then
             `POST /v1/erasures {"filter": "users.42.>"}`: the seconds until the answer (the messages are
             unreadable then; with the key on, its data key was destroyed); then `jetlake jobs run erase`
             beside the running gateway: `shred_gone_s` from the request until the erasure's receipt says
             done (the bytes rewritten away and vacuumed; a Spark process's start included).
`ratio_<phase>` = on / off of the best round (for rates: above 1 is faster with encryption).
`<phase>_cpu_us`: the gateway's CPU time (user + system, /proc/PID/stat) per message or operation of the
phase (its background flusher included: what a phase costs the machine); `cpu_ratio_<phase>` = off / on of
the best round, comparable to the throughput ratios and far less noisy on a shared machine (the wall
ratios move by ±30 % with other load; CPU time moves too, less). `loadavg` is the machine's at the end.

Payloads (`--payloads`): `distinct` (the default) gives every message its own JSON-like record (a
distinct id, random tokens and numbers, ~700 bytes of text cut at a random place from a few MB of random
words), as events are; `repeated` sends one 1 KiB value (`bytes(range(256)) * 4`) for every message,
what this bench used to do. Repeated values flatter "off": Parquet's dictionary keeps one copy of the
value per column chunk, while ciphertext is distinct per message and does not compress, so "on" flushes
~100x the bytes; with distinct payloads both sides write about the same bytes.
Every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ROOT,
    RawHTTP,
    build_request,
    dumps,
    http_call,
    loads,
    log,
    pct_ms,
    proc_cpu_s,
    rate,
    set_log_name,
    start_gateway,
    stop_process,
)

sys.path.insert(0, str(ROOT))
from api.http.binary_batch import MEDIA_TYPE, encode  # noqa: E402

JETLAKE = Path(sys.prefix) / "bin" / "jetlake"
KEY = "bench-encryption-key-0123456789abcdef"
PAYLOAD = bytes(range(256)) * 4  # 1 KiB, `--payloads repeated`
WARM_UP = 200  # messages published before pub_a, not measured (consumed with the rest)
SIZES = {
    "quick": {"pub_a": 1_000, "pub_b": 20_000, "kv": 500, "shred": 5_000},
    "moderate": {"pub_a": 5_000, "pub_b": 200_000, "kv": 2_000, "shred": 100_000},
}


class Payloads:
    """The messages' payloads: every one distinct (JSON-like records), or PAYLOAD for all (`repeated`).
    Seeded, so the runs with encryption on and off send the same bytes."""

    def __init__(self, kind: str, seed: int = 13) -> None:
        self.kind = kind
        self._random = random.Random(seed)
        words = [f"{self._random.choice('bcdfghklmnprstvz')}{self._random.choice('aeiou')}"
                 f"{self._random.choice('bcdfghklmnprstvz')}{self._random.choice('aeiouy')}"[: self._random.randint(2, 4)]
                 for _ in range(4_000)]
        self._text = " ".join(self._random.choices(words, k=800_000))  # ~3 MB of random words
        self._next_id = 0

    def take(self, n: int) -> list[bytes]:
        if self.kind == "repeated":
            return [PAYLOAD] * n
        out = []
        r = self._random
        for _ in range(n):
            self._next_id += 1
            at = r.randrange(len(self._text) - 800)
            record = (f'{{"id":{self._next_id},"user":"u{r.randrange(1_000_000)}","token":"{r.getrandbits(128):032x}",'
                      f'"amount":{r.random() * 1000:.2f},"count":{r.randrange(100)},"status":"{r.choice(_STATUSES)}",'
                      f'"note":"{self._text[at : at + 1024]}')
            out.append(record[:1022].encode() + b'"}')
        return out


_STATUSES = ("new", "paid", "shipped", "returned", "cancelled")


class CpuMeter:
    """The gateway's CPU seconds (user + system) over a phase, per message or operation in µs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start: float | None = None

    def __enter__(self) -> CpuMeter:
        self._start = proc_cpu_s(self.pid)
        return self

    def per_op_us(self, n: int) -> float | None:
        end = proc_cpu_s(self.pid)
        if self._start is None or end is None or not n:
            return None
        return round((end - self._start) * 1e6 / n, 1)

    def __exit__(self, *_: object) -> None:
        pass


def publish_one_at_a_time(port: int, n: int, payloads: Payloads) -> dict:
    c = RawHTTP(port)
    requests = [build_request("POST", f"/v1/publish/bench.{i % 16}", port, payload, "application/octet-stream")
                for i, payload in enumerate(payloads.take(n))]
    times: list[int] = []
    t0 = time.perf_counter_ns()
    for req in requests:
        s = time.perf_counter_ns()
        status, body = c.request(req)
        times.append(time.perf_counter_ns() - s)
        if status != 200:
            raise RuntimeError(f"publish -> {status} {body[:200]!r}")
    t1 = time.perf_counter_ns()
    c.close()
    times.sort()
    return {"pub_a_msgs_s": rate(n, t0, t1), "pub_a_p50_ms": pct_ms(times, 0.5), "pub_a_p99_ms": pct_ms(times, 0.99)}


def publish_batches(port: int, n: int, payloads: Payloads, subject: str = "bench.b.{i}", batch: int = 1_000) -> dict:
    c = RawHTTP(port)
    bodies = []
    for k in range(0, n, batch):
        values = payloads.take(batch)
        bodies.append(encode([(subject.format(i=(k + j) % 64), values[j], {"X-Trace": [f"t{k + j}"]})
                              for j in range(batch)]))
    requests = [build_request("POST", "/v1/publish", port, body, MEDIA_TYPE) for body in bodies]
    t0 = time.perf_counter_ns()
    for req in requests:
        status, body = c.request(req)
        if status != 200 or b'"error"' in body:
            raise RuntimeError(f"batch publish -> {status} {body[:200]!r}")
    t1 = time.perf_counter_ns()
    c.close()
    return {"pub_b_msgs_s": rate(len(bodies) * batch, t0, t1)}


def consume(port: int, total: int) -> dict:
    base = "/v1/streams/BENCH/consumers/C"
    status, body = http_call(port, "POST", "/v1/streams/BENCH/consumers", {"durable_name": "C", "ack_policy": "explicit"})
    if status not in (200, 201):
        raise RuntimeError(f"consumer -> {status} {body}")
    c = RawHTTP(port)
    next_req = build_request("POST", base + "/next", port, dumps({"batch": 500, "expires": 1_000_000_000}))
    got = 0
    t0 = time.perf_counter_ns()
    while got < total:
        status, raw = c.request(next_req)
        seqs = [m["seq"] for m in loads(raw)["messages"]] if status == 200 else []
        if not seqs:
            raise RuntimeError(f"pull -> {status} {raw[:200]!r} after {got} messages")
        ack = dumps({"acks": [{"seqs": seqs}]})
        c.request(build_request("POST", base + "/ack", port, ack))
        got += len(seqs)
    t1 = time.perf_counter_ns()
    c.close()
    return {"consume_msgs_s": rate(got, t0, t1)}


def kv_ops(port: int, n: int, payloads: Payloads, pid: int) -> dict:
    status, body = http_call(port, "POST", "/v1/kv", {"bucket": "bench"})
    if status not in (200, 201):
        raise RuntimeError(f"kv create -> {status} {body}")
    c = RawHTTP(port)
    puts = [build_request("PUT", f"/v1/kv/bench/entries/k{i}", port, payload, "application/octet-stream")
            for i, payload in enumerate(payloads.take(n))]
    gets = [f"GET /v1/kv/bench/entries/k{i} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode() for i in range(n)]
    figures = {}
    for name, requests in (("kv_put", puts), ("kv_get", gets)):
        with CpuMeter(pid) as cpu:
            t0 = time.perf_counter_ns()
            for req in requests:
                status, raw = c.request(req)
                if status != 200:
                    raise RuntimeError(f"{name} -> {status} {raw[:200]!r}")
            figures[f"{name}_ops_s"] = rate(n, t0, time.perf_counter_ns())
            figures[f"{name}_cpu_us"] = cpu.per_op_us(n)
    c.close()
    return figures


def shred(port: int, n: int, warehouse: Path, config: Path | None, payloads: Payloads) -> dict:
    body = {"name": "USERS", "subjects": ["users.>"], "metadata": {"jetlake.key_tokens": "2"}}
    status, answer = http_call(port, "POST", "/v1/streams", body)
    if status != 201:
        raise RuntimeError(f"stream -> {status} {answer}")
    publish_batches(port, n, payloads, subject="users.42.{i}")
    publish_batches(port, 1_000, payloads, subject="users.7.{i}")
    http_call(port, "POST", "/v1/flush", {}, timeout=600)
    t0 = time.perf_counter()
    status, answer = http_call(port, "POST", "/v1/erasures", {"stream": "USERS", "filter": "users.42.>"}, timeout=600)
    seconds = time.perf_counter() - t0
    if status != 202 or answer.get("messages") != n:
        raise RuntimeError(f"erasure -> {status} {answer}")
    status, _ = http_call(port, "GET", "/v1/streams/USERS/messages/1")
    if status != 404:
        raise RuntimeError(f"an erased message answered {status}")
    gone_s, receipt = physically_gone(port, answer["id"], warehouse, config, t0)
    return {"shred_msgs": n, "shred_unreadable_s": round(seconds, 3), "shred_key_destroyed": "key_destroyed" in answer,
            "shred_gone_s": gone_s, "shred_gone_receipt": receipt}


def physically_gone(port: int, erasure: str, warehouse: Path, config: Path | None, t0: float) -> tuple[float, dict]:
    """The erase job (`jetlake jobs run erase`, a Spark process of its own, beside the running gateway)
    removes the bytes: seconds from the erasure request until its receipt says done, and the receipt."""
    command = [str(JETLAKE), "jobs", "run", "erase", "--warehouse", str(warehouse), "--vacuum-window", "0"]
    if config is not None:
        command += ["--config", str(config)]
    job = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    if job.returncode != 0:
        raise RuntimeError(f"erase job -> {job.returncode}: {job.stderr[-3000:]}")
    status, answer = http_call(port, "GET", f"/v1/erasures/{erasure}")
    if status != 200 or answer.get("status") != "done":
        raise RuntimeError(f"the erasure is not done after the erase job: {status} {answer}")
    return round(time.perf_counter() - t0, 3), answer.get("receipt", {})


def run_mode(work: Path, encrypted: bool, sizes: dict, payload_kind: str, with_shred: bool) -> dict:
    name = "on" if encrypted else "off"
    warehouse = work / f"wh-{name}"
    warehouse.mkdir()
    extra = ["--nats-port", "0"]  # the HTTP door only (no clash on 4222 with another gateway)
    config = work / "encrypted.conf"
    if encrypted:
        config.write_text(f'jetstream {{ key: "{KEY}", cipher: aes }}\n')
        extra += ["--config", str(config)]
    figures: dict = {}
    payloads = Payloads(payload_kind)
    proc, port, _ = start_gateway(JETLAKE, warehouse, work / f"gateway-{name}.log", extra)
    try:
        http_call(port, "POST", "/v1/streams", {"name": "BENCH", "subjects": ["bench.>"]})
        publish_one_at_a_time(port, WARM_UP, payloads)  # first-use costs (the stream's data key, imports) unmeasured
        log(f"{name}: publish one at a time ({sizes['pub_a']})")
        with CpuMeter(proc.pid) as cpu:
            figures.update(publish_one_at_a_time(port, sizes["pub_a"], payloads))
            figures["pub_a_cpu_us"] = cpu.per_op_us(sizes["pub_a"])
        log(f"{name}: publish in batches ({sizes['pub_b']})")
        with CpuMeter(proc.pid) as cpu:
            figures.update(publish_batches(port, sizes["pub_b"], payloads))
            figures["pub_b_cpu_us"] = cpu.per_op_us(sizes["pub_b"])
        t0 = time.perf_counter()
        with CpuMeter(proc.pid) as cpu:
            http_call(port, "POST", "/v1/flush", {}, timeout=600)
            figures["flush_s"] = round(time.perf_counter() - t0, 3)
            figures["flush_cpu_us"] = cpu.per_op_us(sizes["pub_a"] + sizes["pub_b"])
        figures["table_mb"] = round(sum(f.stat().st_size for f in (warehouse).rglob("*.parquet")) / 1e6, 2)
    finally:
        stop_process(proc, f"gateway {name}")
    t0 = time.perf_counter()
    proc, port, _ = start_gateway(JETLAKE, warehouse, work / f"gateway-{name}-2.log", extra, start_timeout=300)
    figures["restart_s"] = round(time.perf_counter() - t0, 3)
    try:
        log(f"{name}: consume after the restart")
        with CpuMeter(proc.pid) as cpu:
            figures.update(consume(port, WARM_UP + sizes["pub_a"] + sizes["pub_b"]))
            figures["consume_cpu_us"] = cpu.per_op_us(WARM_UP + sizes["pub_a"] + sizes["pub_b"])
        log(f"{name}: KV ({sizes['kv']})")
        figures.update(kv_ops(port, sizes["kv"], payloads, proc.pid))
        if with_shred:
            log(f"{name}: erasure of a subject prefix ({sizes['shred']})")
            figures.update(shred(port, sizes["shred"], warehouse, config if encrypted else None, payloads))
    finally:
        stop_process(proc, f"gateway {name}")
    return figures


def best(rounds: list[dict]) -> dict:
    """Per figure, the best round: the highest rate, the lowest time."""
    out: dict = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]
        if not values:
            out[key] = rounds[0][key]
        elif key.endswith(("_s", "_ms", "_us")) and not key.endswith(("msgs_s", "ops_s")):
            out[key] = min(values)
        else:
            out[key] = max(values)
    return out


def main() -> int:
    set_log_name("encryption")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of off and on (default 1 quick, 2 otherwise)")
    parser.add_argument("--payloads", choices=("distinct", "repeated"), default="distinct",
                        help="distinct JSON-like records (default), or one repeated 1 KiB value (the old figures)")
    parser.add_argument("--no-shred", action="store_true", help="skip the erasure phase (a Spark job per round)")
    args = parser.parse_args()
    sizes = SIZES["quick" if args.quick else "moderate"]
    rounds = args.rounds or (1 if args.quick else 2)
    results: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="jetlake-bench-enc-") as tmp:
        for r in range(rounds):
            for encrypted in ((False, True) if r % 2 == 0 else (True, False)):
                work = Path(tmp) / f"round{r}-{'on' if encrypted else 'off'}"
                work.mkdir()
                results["on" if encrypted else "off"].append(
                    run_mode(work, encrypted, sizes, args.payloads, not args.no_shred))
    off, on = best(results["off"]), best(results["on"])
    ratios = {f"ratio_{k}": round(on[k] / off[k], 3) for k in off
              if isinstance(off[k], (int, float)) and not isinstance(off[k], bool) and off[k] and on.get(k)
              and not k.endswith("_cpu_us")}
    ratios.update({f"cpu_ratio_{k.removesuffix('_cpu_us')}": round(off[k] / on[k], 3) for k in off
                   if k.endswith("_cpu_us") and off[k] and on.get(k)})
    spread = {k: [r[k] for r in results["on"]] for k in ("pub_a_msgs_s", "pub_b_msgs_s", "consume_msgs_s")}
    log(f"rounds with encryption on: {spread}")
    print(json.dumps({"bench": "encryption", "quick": args.quick, "rounds": rounds, "sizes": sizes,
                      "payloads": args.payloads, "loadavg": os.getloadavg(),
                      "off": off, "on": on, **ratios,
                      "pub_b_on_median": statistics.median(spread["pub_b_msgs_s"])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
