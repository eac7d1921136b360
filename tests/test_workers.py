"""`jetlake serve --workers 2` on a local warehouse: two gateway processes behind one port, each
owning a share of the streams; every request through the shared port is served whichever process
accepts it, and SIGTERM stops them all with nothing lost."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.gateway import JETLAKE, free_port, wait_for_workers

STREAMS = [f"W{i}" for i in range(6)]


def test_two_workers_share_one_port_and_one_warehouse(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "workers.log", "wb")
    proc = subprocess.Popen([str(JETLAKE), "serve", "--warehouse", str(tmp_path / "warehouse"), "--port", str(port),
                             "--workers", "2", "--no-scheduler"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for_workers(url, proc, 2)
        sent: dict[str, list[bytes]] = {s: [] for s in STREAMS}
        with httpx.Client(base_url=url, timeout=30.0) as c:
            gateways = c.get("/v1/cluster").json()["gateways"]
            assert len({g["http"] for g in gateways}) == 2
            for stream in STREAMS:
                made = c.post("/v1/streams", json={"name": stream, "subjects": [f"{stream.lower()}.>"]})
                assert made.status_code == 201, made.text
            for round_ in range(10):
                for stream in STREAMS:
                    with httpx.Client(base_url=url, timeout=30.0) as fresh:  # new connections: either worker
                        data = f"{stream}-{round_}".encode()
                        ack = fresh.post(f"/v1/publish/{stream.lower()}.x", content=data)
                        assert ack.status_code == 200 and ack.json()["seq"] == round_ + 1, ack.text
                        sent[stream].append(data)
        owners = set()
        for gateway in gateways:  # each worker's own port serves what it owns and forwards the rest
            with httpx.Client(base_url=gateway["http"], timeout=30.0) as c:
                for stream in STREAMS:
                    got = c.get(f"/v1/streams/{stream}/messages/10")
                    assert base64.b64decode(got.json()["message"]["data"]) == sent[stream][9]
        for stream in STREAMS:  # each stream is owned by one of the two workers
            lease = tmp_path / "warehouse" / "default" / "_system" / "leases" / "streams" / f"{stream}.json"
            owners.add(json.loads(lease.read_text())["owner"])
        assert owners <= {g["id"] for g in gateways}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    assert proc.returncode == 0
    restarted = subprocess.Popen([str(JETLAKE), "serve", "--warehouse", str(tmp_path / "warehouse"), "--port",
                                  str(port), "--no-scheduler"], stdout=open(tmp_path / "single.log", "wb"),
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and restarted.poll() is None
            time.sleep(0.1)
        for stream in STREAMS:  # a single gateway after a clean stop: everything was committed
            state = httpx.get(f"{url}/v1/streams/{stream}", timeout=30.0).json()["state"]
            assert (state["messages"], state["last_seq"]) == (10, 10)
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=60)


def test_the_nats_door_is_refused_with_several_gateways(tmp_path: Path) -> None:
    """The NATS door does not forward to the gateway owning a stream: asking for it with --cluster or
    --workers is refused at start with a clear error (exit 2), before anything is opened."""
    nats_port = str(free_port())
    for several in (["--cluster", "--wal", "object"], ["--workers", "2"]):
        answer = subprocess.run([str(JETLAKE), "serve", "--warehouse", str(tmp_path / "warehouse"), "--port",
                                 str(free_port()), "--nats-port", nats_port, *several],
                                capture_output=True, timeout=120)
        assert answer.returncode == 2, answer.stderr.decode()[-500:]
        assert b"--nats-port cannot be used with --cluster or --workers" in answer.stderr
        assert not (tmp_path / "warehouse").exists()
