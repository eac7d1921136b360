"""A real S3-compatible server for tests: versitygw through `scripts/s3-server.sh`, on a free loopback
port, storing in a temporary folder; started and stopped by its PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from engine.store.objectstore import WarehouseLocation
from tests.gateway import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "s3-server.sh"
BINARY_ENV = "JETLAKE_VERSITYGW"
ACCESS_KEY = "jetlake"
SECRET_KEY = "jetlake-secret"
BUCKET = "jetlake"


def versitygw_binary() -> Path | None:
    """The server binary: `$JETLAKE_VERSITYGW` if set (only it), else the repo's .venv, the running
    venv, then PATH."""
    override = os.environ.get(BINARY_ENV)
    if override:
        candidates = [Path(override)]
    else:
        on_path = shutil.which("versitygw")
        candidates = [ROOT / ".venv" / "bin" / "versitygw", Path(sys.prefix) / "bin" / "versitygw"]
        candidates += [Path(on_path)] if on_path else []
    return next((path for path in candidates if path.is_file() and os.access(path, os.X_OK)), None)


class S3Server:
    """One versitygw process; `env` holds the AWS variables that reach it."""

    def __init__(self, data_dir: Path, binary: Path) -> None:
        self.data_dir = data_dir
        self.binary = binary
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"s3-server-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }
        self.started_in = 0.0

    def start(self, timeout: float = 30.0) -> S3Server:
        began = time.monotonic()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                ["bash", str(SCRIPT), str(self.data_dir), str(self.port)],
                stdout=out, stderr=subprocess.STDOUT, env={**os.environ, BINARY_ENV: str(self.binary)},
            )
        deadline = began + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"S3 server exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            if _answers(self.port):
                self.started_in = time.monotonic() - began
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"S3 server did not answer on port {self.port}: {self.log.read_text()[-2000:]}")

    def warehouse(self, prefix: str | None = None) -> str:
        """A fresh `s3://` warehouse URI on this server (its own prefix in the shared test bucket)."""
        return f"s3://{BUCKET}/{prefix or uuid.uuid4().hex[:12]}"

    def location(self, prefix: str | None = None) -> WarehouseLocation:
        return WarehouseLocation.parse(self.warehouse(prefix), self.env)

    def stop(self) -> int | None:
        """SIGTERM to the server's PID; returns its exit status."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        os.kill(proc.pid, signal.SIGTERM)
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            raise


def _answers(port: int) -> bool:
    """True once the server answers HTTP (any status: an unsigned request is refused with 403)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return sock.recv(12).startswith(b"HTTP/1.")
    except OSError:
        return False
