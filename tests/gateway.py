"""A real gateway for API tests: `jetlake serve` in its own process on a free loopback port.

`Gateway(warehouse, "--config", path, ...)` runs it with accounts and users; with `--tls-cert` it
serves HTTPS, checked against `ca` (and presenting `client_cert`, a (cert, key) pair, when given).
"""

from __future__ import annotations

import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx

JETLAKE = Path(sys.prefix) / "bin" / "jetlake"


class PortTaken(RuntimeError):
    """Another process bound the gateway's port between `free_port` and the gateway's bind."""


_PICK = random.SystemRandom()  # not the `random` module's state, which a test may seed


def _ephemeral_range() -> range:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)  # Linux's default


def free_port() -> int:
    """A loopback port nothing listens on, outside the kernel's ephemeral range.

    A port that bind(0) hands out is one the kernel also gives to outgoing connections: between this
    check and the gateway's own bind, a client socket of a test group running in parallel could take
    it (CI saw `address already in use`). Ports below that range are only taken by listeners, and
    picking one at random makes two parallel picks of the same port unlikely; `Gateway.start` retries
    on a new port if it still happens.
    """
    ephemeral = _ephemeral_range()
    candidates = range(20000, ephemeral.start) if ephemeral.start > 21000 else range(ephemeral.stop, 65536)
    for _ in range(200):
        port = _PICK.choice(candidates)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {candidates}")


class Gateway:
    """Starts, kills and restarts one gateway process; stopped by its PID only."""

    def __init__(
        self, warehouse: Path | str, *args: str, env: dict[str, str] | None = None, ca: Path | None = None,
        client_cert: tuple[str, str] | None = None, log_dir: Path | None = None,
    ) -> None:
        self.warehouse = warehouse
        self.args = list(args)
        self.env = env or {}  # added to this process's environment, e.g. JETLAKE_FAILPOINTS
        self.port = free_port()
        self.tls = "--tls-cert" in self.args
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        self.ca = ca
        self.client_cert = client_cert
        own_door = "--nats-port" in self.args or "--cluster" in self.args  # a cluster gateway has no NATS door
        self.nats_port = 0 if own_door else free_port()
        self.nats_url = f"nats://127.0.0.1:{self.nats_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        # the log beside a local warehouse; `log_dir` for one on S3
        self.log = (log_dir or Path(warehouse).parent) / f"gateway-{self.port}.log"

    def start(self, timeout: float = 60.0) -> Gateway:
        for _ in range(3):
            try:
                return self._start(timeout)
            except PortTaken:
                self._new_ports()
        return self._start(timeout)

    def _new_ports(self) -> None:
        self.port = free_port()
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        if self.nats_port:
            self.nats_port = free_port()
            self.nats_url = f"nats://127.0.0.1:{self.nats_port}"

    def _start(self, timeout: float) -> Gateway:
        cmd = [str(JETLAKE), "serve", "--warehouse", str(self.warehouse), "--port", str(self.port), *self.args]
        if "--scheduler" not in self.args:
            cmd.append("--no-scheduler")  # no JVM beside every test gateway; a scheduler test asks for one
        if self.nats_port:
            cmd += ["--nats-port", str(self.nats_port)]  # never the default 4222: parallel gateways must not collide
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text()[-2000:]
                if "address already in use" in tail:
                    self.proc = None
                    raise PortTaken(tail)
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {tail}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=0.5, **self._tls_options()).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"gateway did not become healthy: {self.log.read_text()[-2000:]}")

    def _tls_options(self) -> dict[str, object]:
        if not self.tls:
            return {}
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.client_cert is not None:
            context.load_cert_chain(*self.client_cert)
        return {"verify": context}

    def client(self, **options: object) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30.0, **{**self._tls_options(), **options})  # type: ignore[arg-type]

    def hup(self) -> None:
        """SIGHUP: the gateway reloads its config."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGHUP)

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None

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


def wait_for_workers(url: str, proc: subprocess.Popen[bytes], members: int, timeout: float = 120.0) -> dict[str, str]:
    """Waits until `jetlake serve --workers` (process `proc`) at `url` lists `members` gateways: their http by id."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the supervisor exited with {proc.returncode}"
        try:
            answer = httpx.get(f"{url}/v1/cluster", timeout=1.0)
            if answer.status_code == 200 and len(answer.json()["gateways"]) == members:
                return {g["id"]: g["http"] for g in answer.json()["gateways"]}
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{members} workers did not come up")
