"""Lakehouse scale on one machine: many messages, many subjects, many streams, beside nats-server.

Three scenarios, each run against a JetLake gateway and against nats-server in the same run:
- `messages`: N messages of 100 B on 10 subjects (JetLake through the binary batch route, nats-server
  through its Go client `nats bench js pub async`): RSS during and after the load, restart time and
  RSS after it, get by sequence and by time p50/p99 at random positions, bytes on disk, and disk bytes
  before and after a retention run that halves the stream (`jetlake jobs run retention`).
- `subjects`: M messages of 100 B on M distinct subjects (and on 1,000 subjects, for contrast):
  publish msgs/s, files and bytes on disk after the flush, RSS after the load, once flushed and idle
  (`settled_rss_mb`) and after a restart,
  restart time, `last_by_subj` p50/p99 over random subjects (and the server's CPU per lookup), one
  `subjects_filter` page, and a Spark SQL `WHERE subject = …` with the files it read.
- `streams`: S streams with one durable consumer and a few messages each: RSS, log segments, threads
  and open files, restart time (wall, and the gateway's CPU) and RSS after it, and an account info
  after the restart (time, CPU, RSS: it counts idle streams from the catalog copy) (nats-server fed by
  nats-py).

Reads are measured over HTTP and again through JetLake's NATS door (`nats_door`) with the same
nats-py requests (`$JS.API.STREAM.MSG.GET`) that measure nats-server: the same client, the same protocol.

Prints one JSON line on stdout (progress on stderr). `--quick` shrinks every size. Everything binds to
127.0.0.1; every process started here is stopped by its PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    HOST,
    RawHTTP,
    build_request,
    find_nats_server,
    free_port,
    http_call,
    log,
    pct_ms,
    ratio,
    run_workers,
    set_log_name,
    start_gateway,
    start_nats,
    stop_process,
)

ROOT = Path(__file__).resolve().parent.parent
JETLAKE = Path(sys.prefix) / "bin" / "jetlake"
NATS_CLI = Path(sys.prefix) / "bin" / "nats"
BATCH = 1000
PAYLOAD = 100
SAMPLES = 2000


# -- process figures ---------------------------------------------------------------------------


def rss_mb(pid: int, field: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def settled_rss_mb(pid: int, window: float = 10.0) -> float | None:
    """RSS once a load is over, committed, and the process has given back what it gives back when idle
    (JetLake's flusher settles SETTLE_SECONDS after its last commit; Go's scavenger returns pages over
    time): the lowest of samples taken every half second for `window` seconds."""
    low, deadline = rss_mb(pid), time.monotonic() + window
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = rss_mb(pid)
        if now is not None and (low is None or now < low):
            low = now
    return low


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far (a wall time on a loaded machine says little)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_and_files(pid: int) -> dict:
    try:
        return {"threads": len(os.listdir(f"/proc/{pid}/task")), "open_files": len(os.listdir(f"/proc/{pid}/fd"))}
    except OSError:
        return {}


class Every:
    """Calls `tick` every `seconds` from a thread while a phase runs."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            self.tick()

    def tick(self) -> None:
        raise NotImplementedError


class PeakRSS(Every):
    """Samples a process's RSS every half second while a phase runs."""

    def __init__(self, pid: int) -> None:
        super().__init__(0.5)
        self.pid = pid
        self.peak = 0.0

    def tick(self) -> None:
        self.peak = max(self.peak, rss_mb(self.pid) or 0.0)


class Progress(Every):
    """Logs `count()` of `total` every 30 s while a long phase runs (creating 10,000 streams takes
    minutes on either server)."""

    def __init__(self, what: str, total: int, count) -> None:
        super().__init__(30.0)
        self.what, self.total, self.count = what, total, count

    def tick(self) -> None:
        log(f"{self.what}: {self.count():,} of {self.total:,}")


def disk_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def data_files(table: Path) -> dict:
    files = [p for p in table.rglob("*.parquet")] if table.is_dir() else []
    folders = {p.parent for p in files}
    return {"data_files": len(files), "partition_folders": len(folders), "bytes": sum(p.stat().st_size for p in files)}


# -- JetLake: publishing -------------------------------------------------------------------------


def _payloads() -> list[bytes]:
    rng = random.Random(7)
    return [bytes(rng.getrandbits(8) for _ in range(PAYLOAD)) for _ in range(64)]


def binary_batch(subjects: list[str], payloads: list[bytes], offset: int) -> bytes:
    parts = [b"JLB1"]
    for i, subject in enumerate(subjects):
        s = subject.encode()
        p = payloads[(offset + i) % len(payloads)]
        parts.append(struct.pack(">III", len(s), 0, len(p)) + s + p)
    return b"".join(parts)


def publish_worker(port, first, count, subject_of, *, ready, go):
    """Publishes messages first..first+count-1 in binary batches on one keep-alive connection."""
    payloads = _payloads()
    client = RawHTTP(port)
    ready()
    go.wait(600)
    errors, sample = 0, None
    t0 = time.perf_counter()
    for start in range(first, first + count, BATCH):
        n = min(BATCH, first + count - start)
        body = binary_batch([subject_of(start + k) for k in range(n)], payloads, start)
        status, answer = client.request(build_request("POST", "/v1/publish", port, body, "application/x-jetlake-batch"))
        if status != 200 or b'"error"' in answer:
            errors += n
            sample = sample or answer[:300]
    elapsed = time.perf_counter() - t0
    client.close()
    return {"n": count, "errors": errors, "sample": sample, "s": elapsed}


def subject_ten(i: int) -> str:
    return f"cap.s{i % 10}"


def subject_distinct(i: int) -> str:
    return f"cap.k{i}"


def subject_thousand(i: int) -> str:
    return f"cap.k{i % 1000}"


SUBJECTS = {"ten": subject_ten, "distinct": subject_distinct, "thousand": subject_thousand}


def jetlake_publish(port: int, pid: int, total: int, kind: str, clients: int) -> dict:
    share = -(-total // clients)
    share = -(-share // BATCH) * BATCH
    args = [(port, 1 + i * share, max(0, min(share, total - i * share)), SUBJECTS[kind]) for i in range(clients)]
    args = [a for a in args if a[2] > 0]
    t0 = time.perf_counter()
    with PeakRSS(pid) as peak:
        results, meta = run_workers(publish_worker, args, ready_timeout=60, run_timeout=24 * 3600, server_pid=pid)
    wall = time.perf_counter() - t0
    errors = sum(r.get("errors", 0) for r in results)
    out = {"msgs": total, "errors": errors, "s": round(wall, 2), "msgs_s": round(total / wall, 1),
           "server_cpu_s": meta.get("server_cpu_s"), "rss_peak_mb": peak.peak}
    if errors:
        out["error_sample"] = next((str(r["sample"]) for r in results if r.get("sample")), None)
    if "error" in meta:
        out["worker_error"] = meta["error"][:500]
    return out


# -- JetLake: reads --------------------------------------------------------------------------------


def timed_gets(port: int, paths: list[str], pid: int | None = None) -> dict:
    """Wall p50/p99 of GETs one at a time; with `pid`, the server's CPU per request too (a wall time on a
    loaded machine says little)."""
    client = RawHTTP(port)
    lat: list[int] = []
    errors = 0
    cpu = cpu_seconds(pid) if pid else 0.0
    for path in paths:
        t = time.perf_counter_ns()
        status, _ = client.request(build_request("GET", path, port, b""))
        lat.append(time.perf_counter_ns() - t)
        errors += status != 200
    client.close()
    lat.sort()
    out = {"n": len(paths), "errors": errors, "p50_ms": pct_ms(lat, 0.5), "p99_ms": pct_ms(lat, 0.99)}
    if pid and paths:
        out["server_cpu_ms"] = round((cpu_seconds(pid) - cpu) / len(paths) * 1000, 3)
    return out


def rfc3339(ns: int) -> str:
    seconds, frac = divmod(ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{frac:09d}Z"


def restart_gateway(proc, port_holder: dict, warehouse: Path, workdir: Path, name: str, extra: list[str]) -> tuple:
    stop_process(proc, "gateway")
    t0 = time.monotonic()
    proc, port, _ = start_gateway(JETLAKE, warehouse, workdir / f"{name}-restart.log", extra=extra, start_timeout=600)
    return proc, port, round(time.monotonic() - t0, 2)


# -- nats-server -----------------------------------------------------------------------------------


def nats_bench(url: str, args: list[str], timeout: float) -> tuple[float | None, str]:
    """Runs `nats bench …` (the Go client) and returns its publish rate in msgs/s. A load that outlasts
    `timeout` is stopped (not an exception: the run goes on with the messages the server holds then),
    and the rate is None: the caller states it from the stream's state (`capped_rate`)."""
    cmd = [str(NATS_CLI), "--server", url, "bench", *args, "--no-progress"]
    log("running " + " ".join(cmd))
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        log(f"nats bench stopped at its cap of {timeout:.0f}s")
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
        return None, f"stopped at the cap of {timeout:.0f}s\n" + out[-1500:]
    text = run.stdout + run.stderr
    rates = re.findall(r"aggregated stats: ([\d,]+) msgs/sec", text) or re.findall(r"([\d,]+) msgs/sec", text)
    return (float(rates[0].replace(",", "")) if rates else None), text[-1500:]


def capped_rate(out: dict, seconds: float) -> None:
    """A peer's load without a rate of its own (stopped at its cap, or no summary printed): its rate is
    stated from the messages its stream holds after `seconds`, and `capped_at` says how many."""
    held = (out.get("state") or {}).get("messages")
    if out.get("publish_msgs_s") is None and held:
        out["publish_msgs_s"] = round(held / seconds, 1)
        out["capped_at"] = held


def nats_max_bytes(total: int) -> str:
    """The stream's max_bytes for `nats bench --create`: room for the messages, not more than the disk
    has (nats-server refuses a stream whose max_bytes exceeds its storage with 10047)."""
    return f"{max(1, math.ceil(total * PAYLOAD * 4 / 1e9))}GB"


async def _nats_reads(url: str, stream: str, seqs: list[int], times: list[int], subjects: list[str],
                      pid: int | None = None) -> dict:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream(timeout=60)  # a page of 100,000 subjects takes seconds on a loaded machine (5 s default)
    out: dict = {}

    async def measure(name: str, requests: list[bytes], subject: str) -> None:
        lat: list[int] = []
        errors = 0
        cpu = cpu_seconds(pid) if pid else 0.0
        for body in requests:
            t = time.perf_counter_ns()
            reply = await nc.request(subject, body, timeout=10)
            lat.append(time.perf_counter_ns() - t)
            errors += b'"error"' in reply.data
        lat.sort()
        out[name] = {"n": len(requests), "errors": errors, "p50_ms": pct_ms(lat, 0.5), "p99_ms": pct_ms(lat, 0.99)}
        if pid and requests:
            out[name]["server_cpu_ms"] = round((cpu_seconds(pid) - cpu) / len(requests) * 1000, 3)

    get = f"$JS.API.STREAM.MSG.GET.{stream}"
    if seqs:
        await measure("get_by_seq", [json.dumps({"seq": s}).encode() for s in seqs], get)
    if times:
        await measure("get_by_time", [json.dumps({"start_time": rfc3339(t)}).encode() for t in times], get)
    if subjects:
        await measure("last_by_subj", [json.dumps({"last_by_subj": s}).encode() for s in subjects], get)
        t = time.perf_counter()
        try:
            info = await js.stream_info(stream, subjects_filter="cap.*")
            out["subjects_filter_page_s"] = round(time.perf_counter() - t, 3)
            out["subjects_filter_page_len"] = len(info.state.subjects or {})
        except Exception as exc:  # noqa: BLE001 - the lookups measured above are kept
            out["subjects_filter_page_error"] = repr(exc)[:200]
    await nc.close()
    return out


def nats_reads(url: str, stream: str, seqs: list[int], times: list[int], subjects: list[str],
               pid: int | None = None) -> dict:
    try:
        return asyncio.run(_nats_reads(url, stream, seqs, times, subjects, pid))
    except Exception as exc:  # noqa: BLE001 - a peer figure that cannot be measured is reported, not fatal
        return {"error": repr(exc)[:300]}


async def _nats_wait_stream(url: str, stream: str, timeout: float) -> dict:
    """The stream's state once the restarted server answers STREAM.INFO (raw JSON: nats-py's
    StreamState has no `num_subjects`)."""
    import nats

    deadline = time.monotonic() + timeout
    while True:
        try:
            nc = await nats.connect(url, connect_timeout=1, max_reconnect_attempts=0)
            try:
                reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=30)
            finally:
                await nc.close()
            info = json.loads(reply.data)
            if "error" in info:
                if info["error"].get("err_code") == 10059:
                    return {"error": f"stream {stream} not found after the restart"}
                raise RuntimeError(info["error"])
            state = info["state"]
            return {k: state.get(k) for k in ("messages", "first_seq", "last_seq", "num_subjects")}
        except Exception as exc:
            if time.monotonic() > deadline:
                raise
            log(f"waiting for nats-server's stream {stream}: {exc!r}")
            await asyncio.sleep(0.2)


def nats_restart(proc, store: Path, workdir: Path, stream: str) -> tuple:
    stop_process(proc, "nats-server")
    t0 = time.monotonic()
    proc, port = start_nats(find_nats_server(), store, workdir / "nats-restart.log", timeout=600)  # 10,000 streams: minutes under load
    state = asyncio.run(_nats_wait_stream(f"nats://{HOST}:{port}", stream, 600))
    return proc, port, round(time.monotonic() - t0, 2), state


# -- scenarios -------------------------------------------------------------------------------------


def scenario_messages(args: argparse.Namespace, workdir: Path) -> dict:
    total = args.messages
    out: dict = {"messages": total, "subjects": 10, "payload": PAYLOAD}
    warehouse = workdir / "wh-messages"
    warehouse.mkdir()
    nats_port = free_port()  # reads are measured through both doors; the NATS one with nats-server's client
    extra = ["--flush-interval", "1", "--nats-port", str(nats_port)]
    proc, port, startup = start_gateway(JETLAKE, warehouse, workdir / "messages.log", extra=extra)
    jl: dict = {"startup_s": startup}
    try:
        status, _ = http_call(port, "POST", "/v1/streams", {"name": "CAP", "subjects": ["cap.>"]})
        assert status in (200, 201), status
        jl["publish"] = jetlake_publish(port, proc.pid, total, "ten", args.clients)
        jl["rss_after_load_mb"] = rss_mb(proc.pid)
        http_call(port, "POST", "/v1/flush", {}, timeout=3600)
        jl["rss_after_flush_mb"] = rss_mb(proc.pid)
        jl["rss_settled_mb"] = settled_rss_mb(proc.pid)
        _, info = http_call(port, "GET", "/v1/streams/CAP")
        jl["state"] = {k: info["state"][k] for k in ("messages", "first_seq", "last_seq")}
        jl["disk_bytes"] = disk_bytes(warehouse)
        jl["table"] = data_files(warehouse / "default" / "streams" / "CAP")
        proc, port, jl["restart_s"] = restart_gateway(proc, {}, warehouse, workdir, "messages", extra)
        jl["rss_after_restart_mb"] = rss_mb(proc.pid)
        rng = random.Random(1)
        seqs = [rng.randint(1, total) for _ in range(SAMPLES)]
        jl["get_by_seq"] = timed_gets(port, [f"/v1/streams/CAP/messages/{s}" for s in seqs])
        _, first = http_call(port, "GET", "/v1/streams/CAP/messages/1")
        _, last = http_call(port, "GET", f"/v1/streams/CAP/messages/{total}")
        t_first, t_last = _parse_time(first["message"]["time"]), _parse_time(last["message"]["time"])
        times = [rng.randint(t_first, t_last) for _ in range(SAMPLES // 4)]
        jl["get_by_time"] = timed_gets(port, [f"/v1/streams/CAP/messages?start_time={rfc3339(t)}" for t in times])
        jl["nats_door"] = nats_reads(f"nats://{HOST}:{nats_port}", "CAP", seqs, times, [])
        jl["rss_after_reads_mb"] = rss_mb(proc.pid)
        jl["index_bytes"] = _index_bytes(port, "CAP")
        if not args.skip_retention:
            jl["retention"] = _retention_halves(port, warehouse, total)
    finally:
        stop_process(proc, "gateway")
    out["jetlake"] = jl
    if not args.skip_nats:
        out["nats"] = _nats_messages(args, workdir, total, seqs, times, (t_first, t_last))
    out["ratios"] = {
        "rss_after_restart": ratio(jl.get("rss_after_restart_mb"), out.get("nats", {}).get("rss_after_restart_mb")),
        "restart_s": ratio(jl.get("restart_s"), out.get("nats", {}).get("restart_s")),
        "disk_bytes": ratio(jl.get("disk_bytes"), out.get("nats", {}).get("disk_bytes")),
    }
    return out


def _index_bytes(port: int, stream: str) -> int | None:
    client = RawHTTP(port)  # the whole text: http_call keeps 500 characters of a non-JSON answer
    status, raw = client.request(build_request("GET", "/metrics", port, b""))
    client.close()
    body = bytes(raw).decode(errors="replace")
    if status != 200:
        return None
    match = re.search(rf'jetlake_stream_index_bytes{{stream="{stream}"}} (\d+)', body)
    return int(match.group(1)) if match else None


def _parse_time(text: str) -> int:
    base, _, frac = text.rstrip("Z").partition(".")
    seconds = int(time.mktime(time.strptime(base, "%Y-%m-%dT%H:%M:%S")) - time.timezone)
    return seconds * 1_000_000_000 + int((frac + "000000000")[:9])


def _retention_halves(port: int, warehouse: Path, total: int) -> dict:
    """Lowers `max_msgs` to half the stream, runs the retention job, and measures the table's bytes."""
    table = warehouse / "default" / "streams" / "CAP"
    before = data_files(table)
    _, info = http_call(port, "GET", "/v1/streams/CAP")
    config = info["config"]
    config["max_msgs"] = total // 2
    status, _ = http_call(port, "PUT", "/v1/streams/CAP", config)
    http_call(port, "POST", "/v1/flush", {}, timeout=3600)
    t0 = time.monotonic()
    # A vacuum window of 0: the replaced files go at once, so the bytes after are what the table keeps
    # (the default window keeps them an hour for readers of older snapshots).
    run = subprocess.run([str(JETLAKE), "jobs", "run", "retention", "--warehouse", str(warehouse), "--vacuum-window", "0"],
                         capture_output=True, text=True, timeout=7200, stdin=subprocess.DEVNULL)
    figures = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    after = data_files(table)
    return {"update_status": status, "job_s": round(time.monotonic() - t0, 1), "job_exit": run.returncode,
            "bytes_before": before["bytes"], "bytes_after": after["bytes"],
            "files_before": before["data_files"], "files_after": after["data_files"],
            "job": figures[-1] if figures else run.stderr[-500:]}


def _nats_messages(args: argparse.Namespace, workdir: Path, total: int, seqs: list[int], times: list[int],
                   jl_span: tuple[int, int]) -> dict:
    store = workdir / "nats-messages"
    proc, port = start_nats(find_nats_server(), store, workdir / "nats-messages.log")
    url = f"nats://{HOST}:{port}"
    out: dict = {}
    try:
        started = time.monotonic()
        with PeakRSS(proc.pid) as peak:
            out["publish_msgs_s"], text = nats_bench(url, [
                "js", "pub", "async", "cap", "--msgs", str(total), "--size", f"{PAYLOAD}B", "--batch", str(BATCH),
                "--clients", str(args.clients), "--create", "--storage", "file", "--stream", "CAP",
                "--multisubject", "--multisubjectmax", "10", "--maxbytes", nats_max_bytes(total),
            ], timeout=args.nats_seconds)
        load_s = time.monotonic() - started
        out["rss_peak_mb"] = peak.peak
        out["rss_after_load_mb"] = rss_mb(proc.pid)
        out["rss_settled_mb"] = settled_rss_mb(proc.pid)
        if out["publish_msgs_s"] is None:
            out["bench_output"] = text
        out["disk_bytes"] = disk_bytes(store)
        proc, port, out["restart_s"], out["state"] = nats_restart(proc, store, workdir, "CAP")
        capped_rate(out, load_s)
        out["rss_after_restart_mb"] = rss_mb(proc.pid)
        last = out["state"].get("last_seq") or total  # below `total` when the load was stopped at its cap
        seqs = [1 + (s - 1) * last // total for s in seqs]  # the same fractions of a capped load's span
        out.update(nats_reads(f"nats://{HOST}:{port}", "CAP", seqs, _onto_span(times, jl_span, _nats_span(port, last)), []))
        out["rss_after_reads_mb"] = rss_mb(proc.pid)
    finally:
        stop_process(proc, "nats-server")
    return out


def _nats_span(port: int, last: int) -> tuple[int, int] | None:
    """The times of nats-server's first and last message (ns): its load ran after JetLake's, so JetLake's
    times fall before all of its messages and every read by time would answer the first one."""
    async def span() -> tuple[int, int]:
        import nats

        nc = await nats.connect(f"nats://{HOST}:{port}")
        try:
            ends = []
            for seq in (1, last):
                reply = await nc.request("$JS.API.STREAM.MSG.GET.CAP", json.dumps({"seq": seq}).encode(), timeout=10)
                ends.append(_parse_time(json.loads(reply.data)["message"]["time"]))
            return ends[0], ends[1]
        finally:
            await nc.close()

    try:
        return asyncio.run(span())
    except Exception as exc:  # noqa: BLE001 - reads by time then use JetLake's times, and say so
        log(f"nats-server's first and last message times not read: {exc!r}")
        return None


def _onto_span(times: list[int], jl_span: tuple[int, int], span: tuple[int, int] | None) -> list[int]:
    """JetLake's random times (within `jl_span`) moved onto nats-server's span, each at the same fraction."""
    if span is None or not times:
        return times
    lo, hi = jl_span
    if hi == lo:
        return [span[0]] * len(times)
    return [span[0] + (t - lo) * (span[1] - span[0]) // (hi - lo) for t in times]


def scenario_subjects(args: argparse.Namespace, workdir: Path, kind: str) -> dict:
    total = args.subject_messages
    out: dict = {"messages": total, "subjects": total if kind == "distinct" else 1000, "payload": PAYLOAD}
    warehouse = workdir / f"wh-subjects-{kind}"
    warehouse.mkdir()
    nats_port = free_port()
    extra = ["--flush-interval", "1", "--nats-port", str(nats_port)]
    proc, port, _ = start_gateway(JETLAKE, warehouse, workdir / f"subjects-{kind}.log", extra=extra)
    jl: dict = {}
    rng = random.Random(2)
    picks = [rng.randint(1, total - 1) for _ in range(SAMPLES)]
    subjects = [SUBJECTS[kind](i) for i in picks]
    try:
        status, _ = http_call(port, "POST", "/v1/streams", {"name": "CAP", "subjects": ["cap.>"]})
        assert status in (200, 201), status
        jl["publish"] = jetlake_publish(port, proc.pid, total, kind, args.clients)
        jl["rss_after_load_mb"] = rss_mb(proc.pid)
        t0 = time.monotonic()
        http_call(port, "POST", "/v1/flush", {}, timeout=3600)
        jl["flush_s"] = round(time.monotonic() - t0, 2)
        jl["rss_settled_mb"] = settled_rss_mb(proc.pid)
        jl["table"] = data_files(warehouse / "default" / "streams" / "CAP")
        jl["disk_bytes"] = disk_bytes(warehouse)
        proc, port, jl["restart_s"] = restart_gateway(proc, {}, warehouse, workdir, f"subjects-{kind}", extra)
        jl["rss_after_restart_mb"] = rss_mb(proc.pid)
        paths = [f"/v1/streams/CAP/messages?last_by_subj={s}" for s in subjects]
        jl["last_by_subj"] = timed_gets(port, paths, proc.pid)
        jl["nats_door"] = nats_reads(f"nats://{HOST}:{nats_port}", "CAP", [], [], subjects, proc.pid)
        t0 = time.monotonic()
        status, info = http_call(port, "GET", "/v1/streams/CAP?subjects_filter=cap.*")
        jl["subjects_filter_page_s"] = round(time.monotonic() - t0, 3)
        jl["subjects_filter_page_len"] = len((info or {}).get("state", {}).get("subjects") or {}) if status == 200 else status
        jl["num_subjects"] = (info or {}).get("state", {}).get("num_subjects") if status == 200 else None
        jl["rss_after_reads_mb"] = rss_mb(proc.pid)
        jl["index_bytes"] = _index_bytes(port, "CAP")
    finally:
        stop_process(proc, "gateway")
    if not args.skip_sql:
        jl["sql"] = _sql_by_subject(warehouse, subjects[0])
    out["jetlake"] = jl
    if not args.skip_nats:
        out["nats"] = _nats_subjects(args, workdir, total, kind, picks)
    nats = out.get("nats", {})
    out["ratios"] = {
        "publish_msgs_s": ratio(jl["publish"]["msgs_s"], nats.get("publish_msgs_s")),
        "rss_after_load": ratio(jl.get("rss_after_load_mb"), nats.get("rss_after_load_mb")),
        "rss_settled": ratio(jl.get("rss_settled_mb"), nats.get("rss_settled_mb")),
        "rss_after_restart": ratio(jl.get("rss_after_restart_mb"), nats.get("rss_after_restart_mb")),
        "restart_s": ratio(jl.get("restart_s"), nats.get("restart_s")),
        "disk_bytes": ratio(jl.get("disk_bytes"), nats.get("disk_bytes")),
        "last_by_subj_p50_same_client": ratio(jl.get("nats_door", {}).get("last_by_subj", {}).get("p50_ms"),
                                              nats.get("last_by_subj", {}).get("p50_ms")),
    }
    return out


def _sql_by_subject(warehouse: Path, subject: str) -> dict:
    """Spark SQL on the stream's view by one subject, in a subprocess (a fresh JVM): time, rows, files read."""
    code = (
        "import json,sys,time\n"
        "from jobs.spark import spark_session\nfrom jobs.sql import register_views\n"
        "spark=spark_session(app_name='capacity-sql')\nregister_views(spark, sys.argv[1])\n"
        "q=f\"SELECT seq, subject FROM CAP WHERE subject = '{sys.argv[2]}'\"\n"
        "t=time.time(); df=spark.sql(q); rows=df.collect(); s=time.time()-t\n"
        "raw=spark.read.format('delta').load(sys.argv[1]+'/default/streams/CAP')\n"
        "files=len(raw.where(raw.subject==sys.argv[2]).inputFiles())\n"
        "print(json.dumps({'s': round(s,2), 'rows': len(rows), 'files_read': files, 'files': len(raw.inputFiles())}))\n"
        "spark.stop()\n"
    )
    run = subprocess.run([sys.executable, "-c", code, str(warehouse), subject], capture_output=True, text=True,
                         timeout=3600, cwd=str(ROOT), stdin=subprocess.DEVNULL)
    lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": run.stderr[-500:]}


def _nats_subjects(args: argparse.Namespace, workdir: Path, total: int, kind: str, picks: list[int]) -> dict:
    store = workdir / f"nats-subjects-{kind}"
    proc, port = start_nats(find_nats_server(), store, workdir / f"nats-subjects-{kind}.log")
    url = f"nats://{HOST}:{port}"
    out: dict = {}
    try:
        out["publish_msgs_s"], text = nats_bench(url, [
            "js", "pub", "async", "cap", "--msgs", str(total), "--size", f"{PAYLOAD}B", "--batch", str(BATCH),
            "--clients", str(args.clients), "--create", "--storage", "file", "--stream", "CAP",
            "--multisubject", "--multisubjectmax", str(total if kind == "distinct" else 1000),
            "--maxbytes", nats_max_bytes(total),
        ], timeout=24 * 3600)
        if out["publish_msgs_s"] is None:
            out["bench_output"] = text
        out["rss_after_load_mb"] = rss_mb(proc.pid)
        out["rss_settled_mb"] = settled_rss_mb(proc.pid)
        out["disk_bytes"] = disk_bytes(store)
        proc, port, out["restart_s"], out["state"] = nats_restart(proc, store, workdir, "CAP")
        out["rss_after_restart_mb"] = rss_mb(proc.pid)
        # nats bench names its subjects <subject>.<n>, n zero-padded to the digits of --multisubjectmax
        most = total if kind == "distinct" else 1000
        names = [f"cap.{i % most:0{len(str(most))}d}" for i in picks]
        out.update(nats_reads(f"nats://{HOST}:{port}", "CAP", [], [], names, proc.pid))
        out["rss_after_reads_mb"] = rss_mb(proc.pid)
    finally:
        stop_process(proc, "nats-server")
    return out


def _stream_worker(port, names, *, ready, go):
    client = RawHTTP(port)
    ready()
    go.wait(600)
    errors = 0
    for name in names:
        for method, path, body in (
            ("POST", "/v1/streams", {"name": name, "subjects": [f"{name.lower()}.>"]}),
            ("POST", f"/v1/streams/{name}/consumers", {"durable_name": "C", "ack_policy": "explicit"}),
            ("POST", "/v1/publish", {"messages": [{"subject": f"{name.lower()}.x", "text": f"m{k}"} for k in range(3)]}),
        ):
            status, _ = client.request(build_request(method, path, port, json.dumps(body).encode()))
            errors += status not in (200, 201)
    client.close()
    return {"n": len(names), "errors": errors}


def scenario_streams(args: argparse.Namespace, workdir: Path) -> dict:
    count = args.streams
    warehouse = workdir / "wh-streams"
    warehouse.mkdir()
    extra = ["--flush-interval", "1", "--nats-port", "0"]  # no NATS door: 4222 may be taken
    proc, port, startup = start_gateway(JETLAKE, warehouse, workdir / "streams.log", extra=extra)
    names = [f"S{i:05d}" for i in range(count)]
    jl: dict = {"streams": count, "startup_empty_s": startup}  # the gateway's own start: imports, no stream
    try:
        clients = min(args.clients, 4)
        t0 = time.monotonic()
        created = warehouse / "default" / "streams"
        with Progress("JetLake streams created", count, lambda: len(os.listdir(created)) if created.is_dir() else 0):
            results, meta = run_workers(_stream_worker, [(port, names[i::clients]) for i in range(clients)],
                                        ready_timeout=60, run_timeout=24 * 3600, server_pid=proc.pid)
        jl["create_s"] = round(time.monotonic() - t0, 1)
        jl["errors"] = sum(r.get("errors", 0) for r in results)
        http_call(port, "POST", "/v1/flush", {}, timeout=3600)
        time.sleep(2)  # let the flusher go idle: what stays open between flushes is what is measured
        jl["rss_mb"] = rss_mb(proc.pid)
        jl.update(threads_and_files(proc.pid))
        jl["log_segments"] = sum(1 for _ in (warehouse / "default" / "_wal").rglob("*.wal"))
        proc, port, jl["restart_s"] = restart_gateway(proc, {}, warehouse, workdir, "streams", extra)
        jl["restart_cpu_s"] = cpu_seconds(proc.pid)  # the gateway's CPU from its start to healthy
        jl["rss_after_restart_mb"] = rss_mb(proc.pid)
        jl["after_restart"] = threads_and_files(proc.pid)
        t0, cpu0 = time.monotonic(), cpu_seconds(proc.pid)
        _, info = http_call(port, "GET", "/v1/info", timeout=3600)  # counted from the catalog copy
        jl["account_info_s"], jl["account_info_cpu_s"] = round(time.monotonic() - t0, 2), round(cpu_seconds(proc.pid) - cpu0, 2)
        jl["info"] = {k: info.get(k) for k in ("streams", "consumers", "storage")}
        jl["rss_after_account_info_mb"] = rss_mb(proc.pid)
    finally:
        stop_process(proc, "gateway")
    out = {"jetlake": jl}
    if not args.skip_nats:
        out["nats"] = _nats_streams(workdir, names)
        out["ratios"] = {"rss": ratio(jl.get("rss_mb"), out["nats"].get("rss_mb")),
                         "restart_s": ratio(jl.get("restart_s"), out["nats"].get("restart_s"))}
    return out


async def _nats_create_streams(url: str, names: list[str], done: list[int]) -> None:
    import nats

    nc = await nats.connect(url)
    js = nc.jetstream()
    for done[0], name in enumerate(names):
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"])
        await js.add_consumer(name, durable_name="C", ack_policy="explicit")
        for k in range(3):
            await js.publish(f"{name.lower()}.x", f"m{k}".encode())
    await nc.close()


def _nats_streams(workdir: Path, names: list[str]) -> dict:
    store = workdir / "nats-streams"
    proc, port = start_nats(find_nats_server(), store, workdir / "nats-streams.log")
    out: dict = {}
    try:
        t0, done = time.monotonic(), [0]
        with Progress("nats-server streams created", len(names), lambda: done[0]):
            asyncio.run(_nats_create_streams(f"nats://{HOST}:{port}", names, done))
        out["create_s"] = round(time.monotonic() - t0, 1)
        out["rss_mb"] = rss_mb(proc.pid)
        proc, port, out["restart_s"], out["last_stream"] = nats_restart(proc, store, workdir, names[-1])
        out["rss_after_restart_mb"] = rss_mb(proc.pid)
    finally:
        stop_process(proc, "nats-server")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--only", default="messages,subjects,streams", help="scenarios to run, comma-separated")
    parser.add_argument("--messages", type=int, default=None, help="messages scenario size (default 100,000,000)")
    parser.add_argument("--subject-messages", type=int, default=None,
                        help="subjects scenario size, one subject per message (default 1,000,000)")
    parser.add_argument("--streams", type=int, default=None, help="streams scenario size (default 10,000)")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--skip-nats", action="store_true")
    parser.add_argument("--skip-sql", action="store_true")
    parser.add_argument("--skip-retention", action="store_true")
    parser.add_argument("--nats-seconds", type=float, default=24 * 3600,
                        help="cap on nats-server's load in seconds; a stopped load's figures are stated at the "
                             "messages it holds (`capped_at`)")
    parser.add_argument("--workdir", default=None, help="keep the warehouses here (default: a temporary folder)")
    args = parser.parse_args()
    sizes = (1_000_000, 100_000, 300) if args.quick else (100_000_000, 1_000_000, 10_000)
    args.messages = args.messages or sizes[0]
    args.subject_messages = args.subject_messages or sizes[1]
    args.streams = args.streams or sizes[2]
    set_log_name("capacity")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="jetlake-capacity-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result: dict = {"bench": "capacity", "quick": args.quick, "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()}
    try:
        only = set(args.only.split(","))
        if "messages" in only:
            result["messages"] = scenario_messages(args, workdir)
        if "subjects" in only:
            result["subjects_distinct"] = scenario_subjects(args, workdir, "distinct")
            result["subjects_thousand"] = scenario_subjects(args, workdir, "thousand")
        if "streams" in only:
            result["streams"] = scenario_streams(args, workdir)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    result["duration_s"] = round(time.monotonic() - started, 1)
    result["loadavg_end"] = os.getloadavg()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
