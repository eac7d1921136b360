"""`jetlake serve --workers N`: N gateway processes on one machine, behind one public port.

One process runs one event loop on one core; a machine with more cores runs more gateways. The
supervisor starts N `jetlake serve --cluster --wal object` children, each with an internal port of its
own (what it advertises to the others, for forwarding) and the public port bound with SO_REUSEPORT,
so the kernel spreads incoming connections over them. They share the warehouse exactly as gateways on
several machines do (engine/cluster/): each owns its share of the streams, forwards the rest. A
child that dies is started again (its streams are served meanwhile by the others, once its leases
go); SIGTERM or SIGINT stops every child cleanly (each hands its streams over).
With workers the NATS door is off (its listener does not share a port yet).
Counterpart: uvicorn's and gunicorn's worker supervisors; nats-server runs one process per server.
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time
from types import FrameType

log = logging.getLogger(__name__)

RESTART_PAUSE = 1.0


def child_argv(argv: list[str], internal_port: int, index: int = 0) -> list[str]:
    """The serve arguments of worker `index`: the supervisor's, without `--workers`, in cluster mode;
    only the first runs the maintenance scheduler."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    extra = ["--internal-port", str(internal_port), "--nats-port", "0"]
    if index > 0 and "--no-scheduler" not in out:
        extra.append("--no-scheduler")
    if "--cluster" not in out:
        extra.append("--cluster")
    if not any(a == "--wal" or a.startswith("--wal=") for a in out):
        extra += ["--wal", "object"]
    return [*out, *extra]


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """The public listening socket, shared by the workers (each binds it with SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def supervise(serve_argv: list[str], workers: int, host: str) -> int:
    """Runs `workers` gateway processes until SIGTERM/SIGINT; returns the exit code."""
    stopping = False

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    children: list[subprocess.Popen[bytes] | None] = [None] * workers
    started_at = [0.0] * workers

    def start(i: int) -> None:
        cmd = [sys.executable, "-m", "api.cli", "serve", *child_argv(serve_argv, _free_port(host), i)]
        children[i] = subprocess.Popen(cmd)
        started_at[i] = time.monotonic()
        log.info("worker %d started (pid %d)", i, children[i].pid)  # type: ignore[union-attr]

    for i in range(workers):
        start(i)
    try:
        while not stopping:
            time.sleep(0.2)
            for i, child in enumerate(children):
                if child is not None and child.poll() is not None and not stopping:
                    log.error("worker %d (pid %d) exited with %s; starting it again", i, child.pid, child.returncode)
                    time.sleep(max(0.0, RESTART_PAUSE - (time.monotonic() - started_at[i])))
                    start(i)
    finally:
        for child in children:
            if child is not None and child.poll() is None:
                child.terminate()
        for child in children:
            if child is not None:
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
    log.info("every worker stopped")
    return 0
