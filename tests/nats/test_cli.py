"""The `nats` CLI (natscli v0.5.0) against a real gateway: the seeds' running example, KV and objects.

Each command runs as a user would type it, against `--server nats://127.0.0.1:<port>` with HOME in
the test's folder, and its output or effect is checked (through the CLI itself and through HTTP).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import httpx

from tests.gateway import Gateway


class Cli:
    def __init__(self, exe: str, env: dict[str, str], gateway: Gateway) -> None:
        self.exe, self.env, self.gateway = exe, env, gateway

    def __call__(self, *args: str, ok: bool = True, timeout: float = 60) -> str:
        done = subprocess.run(
            [self.exe, "--server", self.gateway.nats_url, *args], env=self.env, capture_output=True, text=True,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )
        if ok:
            assert done.returncode == 0, f"nats {' '.join(args)}: {done.stdout}\n{done.stderr}"
        return done.stdout + done.stderr

    def json(self, *args: str) -> dict:
        return json.loads(self(*args, "--json"))


def test_the_running_example(gateway: Gateway, nats_cli: tuple[str, dict[str, str]]) -> None:
    nats = Cli(*nats_cli, gateway)
    out = nats("stream", "add", "ORDERS", "--subjects", "orders.*", "--defaults")
    assert "Stream ORDERS was created" in out
    out = nats("pub", "orders.us", "--count=10", "US Order #{{Count}}")
    assert out.count('Published') == 10
    info = nats.json("stream", "info", "ORDERS")
    assert (info["config"]["subjects"], info["state"]["messages"], info["state"]["last_seq"]) == (["orders.*"], 10, 10)
    assert httpx.get(f"{gateway.url}/v1/streams/ORDERS/messages/3").json()["message"]["data"] == "VVMgT3JkZXIgIzM="

    out = nats("consumer", "add", "ORDERS", "NEW", "--pull", "--deliver", "all", "--ack", "explicit", "--defaults")
    assert "Information for Consumer ORDERS > NEW" in out
    out = nats("consumer", "next", "ORDERS", "NEW", "--count", "3")
    assert [line.strip() for line in out.splitlines() if line.strip().startswith("US Order")] == [
        "US Order #1", "US Order #2", "US Order #3"
    ]
    assert out.count("Acknowledged message") == 3
    consumer = nats.json("consumer", "info", "ORDERS", "NEW")
    assert (consumer["num_pending"], consumer["ack_floor"]["stream_seq"], consumer["num_ack_pending"]) == (7, 3, 0)
    row = next(line for line in nats("consumer", "ls", "ORDERS").splitlines() if "NEW" in line)
    cells = [cell.strip() for cell in row.split("│")]
    assert (cells[1], cells[4], cells[5]) == ("NEW", "0", "7")  # name, ack pending, unprocessed
    names = nats("consumer", "ls", "ORDERS", "--names").split()
    assert names == ["NEW"]
    nats("consumer", "rm", "ORDERS", "NEW", "-f")
    assert nats("consumer", "ls", "ORDERS", "--names").split() == []

    assert "ORDERS" in nats("stream", "ls")
    assert nats("stream", "ls", "--names").split() == ["ORDERS"]
    nats("stream", "rm", "ORDERS", "-f")
    assert nats("stream", "ls", "--names").split() == []
    assert httpx.get(f"{gateway.url}/v1/streams/ORDERS").status_code == 404


def test_kv_add_put_get_history_watch_del(gateway: Gateway, nats_cli: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    nats = Cli(*nats_cli, gateway)
    nats("kv", "add", "CONFIG", "--history", "5")
    nats("kv", "put", "CONFIG", "app.timeout", "30s")
    nats("kv", "put", "CONFIG", "app.timeout", "45s")
    assert nats("kv", "get", "CONFIG", "app.timeout", "--raw").strip() == "45s"
    history = nats("kv", "history", "CONFIG", "app.timeout")
    rows = [[cell.strip() for cell in line.split("│")] for line in history.splitlines() if "│ app.timeout" in line]
    assert [(r[2], r[3], r[6]) for r in rows] == [("1", "PUT", "30s"), ("2", "PUT", "45s")]  # revision, op, value

    log = tmp_path / "watch.out"
    with log.open("w") as out:
        watch = subprocess.Popen([nats.exe, "--server", gateway.nats_url, "kv", "watch", "CONFIG"], env=nats.env,
                                 stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        _wait_for(lambda: "app.timeout: 45s" in log.read_text(), "the watch's initial value")
        nats("kv", "put", "CONFIG", "app.retries", "3")
        _wait_for(lambda: "PUT CONFIG > app.retries: 3" in log.read_text(), "the watched put")
        nats("kv", "del", "CONFIG", "app.timeout", "-f")
        _wait_for(lambda: "DELETE CONFIG > app.timeout" in log.read_text(), "the watched delete")
    finally:
        watch.terminate()
        watch.wait(timeout=10)
    assert "key not found" in nats("kv", "get", "CONFIG", "app.timeout", ok=False)
    assert nats("kv", "get", "CONFIG", "app.retries", "--raw").strip() == "3"


def test_object_add_put_get_ls(gateway: Gateway, nats_cli: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    nats = Cli(*nats_cli, gateway)
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * 5000)  # 1.2 MB: 10 chunks
    nats("object", "add", "MEDIA")
    out = nats("object", "put", "MEDIA", str(source), "--name", "big.bin")
    assert "Chunks: 10" in out
    copy = tmp_path / "copy.bin"
    nats("object", "get", "MEDIA", "big.bin", "--output", str(copy))
    assert copy.read_bytes() == source.read_bytes()
    listing = nats("object", "ls", "MEDIA")
    assert "big.bin" in listing


def _wait_for(condition: object, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
