"""The test harness's gateway survives a port taken between choosing it and binding it (a CI failure)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.gateway import Gateway, free_port


def test_free_ports_stay_out_of_the_range_the_kernel_gives_clients() -> None:
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert all(not low <= free_port() <= high for _ in range(50))


def test_a_gateway_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    gateway = Gateway(tmp_path / "warehouse")
    taken = gateway.port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        gateway.start()
        try:
            assert gateway.port != taken
            with gateway.client() as client:
                assert client.get("/healthz").status_code == 200
        finally:
            gateway.stop()
