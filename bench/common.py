"""Helpers shared by the benchmarks in bench/ (process control, a raw keep-alive HTTP client, worker
processes released together, starting the gateway and nats-server).

Written for bench/consume.py after the patterns of bench/publish.py (which still carries its own copies).
Everything listens and connects on 127.0.0.1; every process started here is stopped by its PID.
"""

from __future__ import annotations

import asyncio
import http.client
import functools
import json
import math
import multiprocessing as mp
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"

try:  # faster JSON on the client side
    import orjson as _orjson

    loads = _orjson.loads
    dumps = _orjson.dumps
except Exception:  # pragma: no cover
    loads = json.loads

    def dumps(obj) -> bytes:  # type: ignore[misc]
        return json.dumps(obj, separators=(",", ":")).encode()


_T_START = time.monotonic()
_LOG_NAME = ["bench"]


def set_log_name(name: str) -> None:
    _LOG_NAME[0] = name


def log(msg: str) -> None:
    print(f"[{_LOG_NAME[0]} {time.monotonic() - _T_START:7.1f}s] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def pct_ms(sorted_ns: list[int], q: float) -> float | None:
    """Nearest-rank percentile of sorted nanosecond values, in ms."""
    if not sorted_ns:
        return None
    n = len(sorted_ns)
    idx = min(n - 1, max(0, math.ceil(q * n) - 1))
    return round(sorted_ns[idx] / 1e6, 3)


def rate(n: int, t0_ns: int, t1_ns: int) -> float | None:
    dt = (t1_ns - t0_ns) / 1e9
    return round(n / dt, 1) if dt > 0 and n > 0 else None


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def maybe_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except Exception:
        pass


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_s(pid: int | None) -> float | None:
    """user+system CPU seconds of a live process (Linux /proc), None if unknown."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def settle(pid: int | None, idle_share: float = 0.05, window: float = 0.5, limit: float = 60.0) -> float:
    """Waits until the process uses under `idle_share` of a core over `window` seconds (at most `limit`
    seconds): the background work a run left behind (a flush, a compaction) ends before the next run
    starts and is counted in this run's CPU. Returns the seconds waited."""
    started = time.monotonic()
    last = proc_cpu_s(pid)
    while last is not None and time.monotonic() - started < limit:
        time.sleep(window)
        now = proc_cpu_s(pid)
        if now is None or now - last < idle_share * window:
            break
        last = now
    return round(time.monotonic() - started, 2)


def stop_process(p: subprocess.Popen | None, name: str, grace: float = 15.0) -> None:
    """Terminate a process we started (by its PID), wait, kill if needed. It was started in its own
    session, so its process group id is its PID: while the exited leader is still unreaped (a zombie,
    so the id cannot be reused) the group gets a SIGKILL too, for any child it left behind."""
    if p is None or p.returncode is not None:
        return

    def exited(timeout: float) -> bool:
        end = time.monotonic() + timeout
        while True:
            try:
                if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                    return True
            except ChildProcessError:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.05)

    log(f"stopping {name} (pid {p.pid})")
    try:
        p.terminate()
    except ProcessLookupError:
        pass
    if not exited(grace):
        log(f"{name} (pid {p.pid}) did not stop in {grace:.0f}s: kill")
        try:
            p.kill()
        except ProcessLookupError:
            pass
        exited(10)
    try:
        os.killpg(p.pid, signal.SIGKILL)  # leftovers in the group we created
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        log(f"{name} (pid {p.pid}) still alive after SIGKILL")


# ----------------------------------------------------------------------------------------------
# minimal HTTP/1.1 keep-alive client (blocking raw socket)
# ----------------------------------------------------------------------------------------------


def build_request(method: str, path: str, port: int, body: bytes, ctype: str = "application/json",
                  headers: str = "") -> bytes:
    """A raw HTTP/1.1 request; `headers` are extra header lines, each ending in CRLF."""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nContent-Type: {ctype}\r\n"
        f"Content-Length: {len(body)}\r\n{headers}\r\n"
    ).encode()
    return head + body


def parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """-> (status, content_length or None, chunked, connection_close). `head` excludes the blank line."""
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    clen = None
    chunked = False
    close = False
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        k = k.strip().lower()
        if k == b"content-length":
            clen = int(v.strip())
        elif k == b"transfer-encoding" and b"chunked" in v.lower():
            chunked = True
        elif k == b"connection" and b"close" in v.lower():
            close = True
    return status, clen, chunked, close


class RawHTTP:
    def __init__(self, port: int, timeout: float = 120.0):
        self.port = port
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = bytearray()
        self._connect()

    def _connect(self) -> None:
        if self.sock is not None:
            self.sock.close()
        self.sock = socket.create_connection((HOST, self.port), timeout=self.timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _read_exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def _read_line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return out
            self._fill()

    def request(self, req: bytes) -> tuple[int, bytes]:
        self.sock.sendall(req)
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i >= 0:
                break
            self._fill()
        head = bytes(self.buf[:i])
        del self.buf[: i + 4]
        status, clen, chunked, close = parse_head(head)
        if chunked:
            parts = []
            while True:
                size = int(self._read_line().split(b";")[0], 16)
                if size == 0:
                    while self._read_line():  # trailers
                        pass
                    break
                parts.append(self._read_exact(size))
                self._read_exact(2)
            body = b"".join(parts)
        else:
            body = self._read_exact(clen or 0)
        if close:
            self._connect()
        return status, body

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def http_call(port: int, method: str, path: str, body: dict | None = None, timeout: float = 30.0,
              headers: dict[str, str] | None = None):
    """One-off JSON call with http.client -> (status, parsed body or text)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        headers = {**({"Content-Type": "application/json"} if data is not None else {}), **(headers or {})}
        conn.request(method, path, body=data, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw[:500].decode(errors="replace")
        return r.status, parsed
    finally:
        conn.close()


# ----------------------------------------------------------------------------------------------
# worker processes: each reports "ready" after connecting and warming up, waits for "go", runs its
# share and sends back a dict. The parent measures the server's CPU while they run.
# ----------------------------------------------------------------------------------------------

MP = mp.get_context("fork")


def _worker_main(fn, args, ready_q, go, result_q, idx):
    try:
        res = fn(*args, ready=lambda: ready_q.put(idx), go=go)
        res["idx"] = idx
    except BaseException:  # report, never hang the parent
        res = {"idx": idx, "error": traceback.format_exc(limit=8)}
        ready_q.put(idx)  # unblock the parent if we died before being ready
    result_q.put(res)


def run_workers(fn, args_list: list[tuple], ready_timeout: float, run_timeout: float,
                server_pid: int | None = None, on_start=None) -> tuple[list[dict], dict]:
    """Start one process per args tuple (fn may dispatch on its arguments), wait until all are ready,
    release them together, collect. Returns (results, {"server_cpu_s", "wall_s", "error"?}).
    `on_start(pids)` is called once they are released (e.g. to sample `top`)."""
    ready_q, result_q = MP.Queue(), MP.Queue()
    go = MP.Event()
    procs = []
    for i, args in enumerate(args_list):
        p = MP.Process(target=_worker_main, args=(fn, args, ready_q, go, result_q, i), daemon=True)
        p.start()
        procs.append(p)
    results: list[dict] = []
    meta: dict = {}
    try:
        deadline = time.monotonic() + ready_timeout
        for _ in procs:
            ready_q.get(timeout=max(0.1, deadline - time.monotonic()))
        cpu0 = proc_cpu_s(server_pid)
        w0 = time.monotonic()
        go.set()
        if on_start is not None:
            try:
                on_start([p.pid for p in procs])
            except Exception as e:  # noqa: BLE001
                log(f"on_start failed: {e!r}")
        deadline = time.monotonic() + run_timeout
        for _ in procs:
            results.append(result_q.get(timeout=max(0.1, deadline - time.monotonic())))
        cpu1 = proc_cpu_s(server_pid)
        meta["wall_s"] = round(time.monotonic() - w0, 2)
        meta["server_cpu_s"] = round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 is not None else None
    except Exception as e:  # queue.Empty on timeout
        meta["error"] = f"workers timed out or failed: {e!r}"
    finally:
        go.set()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()  # by its PID
                p.join(timeout=5)
    errs = [r["error"] for r in results if "error" in r]
    if errs and "error" not in meta:
        meta["error"] = "worker failed: " + errs[0]
    results.sort(key=lambda r: r.get("idx", 0))
    return results, meta


# ----------------------------------------------------------------------------------------------
# servers
# ----------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4)
def serve_help(jetlake: Path) -> str:
    try:
        r = subprocess.run([str(jetlake), "serve", "--help"], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        return r.stdout + r.stderr
    except Exception as e:  # noqa: BLE001
        return f"<serve --help failed: {e!r}>"


def start_gateway(jetlake: Path, warehouse: Path, log_path: Path, extra: list[str] | None = None,
                  start_timeout: float = 30.0) -> tuple[subprocess.Popen, int, float]:
    """`jetlake serve` on a free port of 127.0.0.1; waits for /healthz 200. -> (process, port, startup s).
    On failure the process is stopped and the exception carries the log tail."""
    port = free_port()
    cmd = [str(jetlake), "serve", "--warehouse", str(warehouse), "--host", HOST, "--port", str(port)] + (extra or [])
    if "--scheduler" not in cmd and "--no-scheduler" not in cmd and "--no-scheduler" in serve_help(jetlake):
        cmd.append("--no-scheduler")  # measured without Spark jobs running beside it, unless a benchmark asks
    log(f"starting gateway: {' '.join(cmd)}")
    logf = open(log_path, "wb")
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         cwd=str(warehouse.parent), start_new_session=True)
    logf.close()
    try:
        deadline = time.monotonic() + start_timeout
        last = None
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"gateway exited with {p.returncode} before ready; log tail:\n{tail(log_path)}")
            try:
                st, body = http_call(port, "GET", "/healthz", timeout=2)
                last = (st, body)
                if st == 200:
                    startup = round(time.monotonic() - t0, 2)
                    log(f"gateway healthy on port {port} after {startup}s (pid {p.pid})")
                    return p, port, startup
            except OSError as e:
                last = repr(e)
            time.sleep(0.05)
        raise RuntimeError(f"gateway not healthy within {start_timeout}s (last: {last}); log tail:\n{tail(log_path)}")
    except BaseException:
        stop_process(p, "gateway")
        raise


def find_nats_server(explicit: str | None = None) -> str | None:
    cands = []
    if explicit:
        cands.append(Path(explicit))
    cands += [Path(sys.prefix) / "bin" / "nats-server", Path(sys.executable).parent / "nats-server",
              ROOT / ".venv" / "bin" / "nats-server"]
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return shutil.which("nats-server")


def start_nats(exe: str, store: Path, log_path: Path, timeout: float = 20.0,
               sync_always: bool = False) -> tuple[subprocess.Popen, int]:
    """nats-server -js with file storage in `store`, on a free port of 127.0.0.1. -> (process, port).
    `sync_always`: fsync every write (`sync_interval: always`, which only a config file can set; it is
    written beside `store` as `<store name>.conf`)."""
    port = free_port()
    store.mkdir(parents=True, exist_ok=True)
    if sync_always:
        conf = store.parent / f"{store.name}.conf"
        conf.write_text(f'listen: {HOST}:{port}\njetstream {{\n  store_dir: "{store}"\n  sync_interval: always\n}}\n')
        cmd = [exe, "-c", str(conf)]
    else:
        cmd = [exe, "-a", HOST, "-p", str(port), "-js", "-sd", str(store)]
    log(f"starting nats-server: {' '.join(cmd)}")
    logf = open(log_path, "wb")
    p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         cwd=str(store.parent), start_new_session=True)
    logf.close()
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError(f"nats-server exited with {p.returncode}; log tail:\n{tail(log_path)}")
            try:
                with socket.create_connection((HOST, port), timeout=1) as s:
                    if s.recv(4096).startswith(b"INFO"):
                        log(f"nats-server ready on port {port} (pid {p.pid})")
                        return p, port
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"nats-server not ready within {timeout}s; log tail:\n{tail(log_path)}")
    except BaseException:
        stop_process(p, "nats-server")
        raise


def count_table(table: Path) -> dict:
    """Commits and data files of a Delta table folder."""
    log_dir = table / "_delta_log"
    commits = len(list(log_dir.glob("*.json"))) if log_dir.is_dir() else 0
    files = [p for p in table.rglob("*.parquet") if "_delta_log" not in p.relative_to(table).parts] \
        if table.is_dir() else []
    return {"commits": commits, "data_files": len(files), "data_bytes": sum(p.stat().st_size for p in files)}


def top_snapshot(pids: dict[str, int], delay: float = 0.0) -> dict:
    """CPU % of the named processes (and the whole machine's idle %) from one `top -b -n1`-like
    measurement: /proc over a 1 s window, cheaper and parseable."""
    if delay:
        time.sleep(delay)

    def total_idle():
        f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        vals = [int(x) for x in f]
        return sum(vals), vals[3] + (vals[4] if len(vals) > 4 else 0)

    c0 = {k: proc_cpu_s(v) for k, v in pids.items()}
    t0, i0 = total_idle()
    w0 = time.monotonic()
    time.sleep(1.0)
    c1 = {k: proc_cpu_s(v) for k, v in pids.items()}
    t1, i1 = total_idle()
    dt = time.monotonic() - w0
    out = {k: round(100 * (c1[k] - c0[k]) / dt, 0) for k in pids if c0[k] is not None and c1[k] is not None}
    out["machine_idle_pct"] = round(100 * (i1 - i0) / max(1, t1 - t0), 0)
    return out
