"""How the gateway is served: TLS with and without client certificates, users named by their
certificate, SIGHUP reloads without dropping connections, and no anonymous access off loopback."""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.cli import _exposure_refusal
from api.http.tls import settings as tls_settings
from engine.accounts.config import TlsConfig
from tests.api.certs import Authority
from tests.api.security_setup import basic
from tests.gateway import JETLAKE, Gateway, free_port


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("pki")
    ca, other = Authority(folder), Authority(folder, "Another CA")
    return {
        "ca": ca.path, "server": ca.server(),
        "alice": ca.client("alice", CN="alice", O="Acme"),
        "bob": ca.client("bob", ("bob@example.com",), CN="bob"),
        "carol": ca.client("carol", CN="carol"),
        "mallory": other.client("mallory", CN="alice", O="Acme"),
    }


def _gateway(tmp_path: Path, pki: dict[str, object], *args: str, client: str | None = None) -> Gateway:
    (tmp_path / "warehouse").mkdir(exist_ok=True)
    cert, key = pki["server"]  # type: ignore[misc]
    return Gateway(tmp_path / "warehouse", "--tls-cert", cert, "--tls-key", key, *args, ca=pki["ca"],  # type: ignore[arg-type]
                   client_cert=pki[client] if client else None)  # type: ignore[arg-type]


def test_https_without_client_certificates(tmp_path: Path, pki: dict[str, object]) -> None:
    gw = _gateway(tmp_path, pki).start()
    try:
        assert gw.url.startswith("https://")
        with gw.client() as c:
            assert c.post("/v1/streams", json={"name": "S", "subjects": ["s.>"]}).status_code == 201
            assert c.post("/v1/publish/s.x", content=b"over TLS").json()["seq"] == 1
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{gw.port}/healthz", timeout=5)  # plain HTTP gets nothing
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{gw.url}/healthz", timeout=5)  # a client that does not trust the test CA
    finally:
        gw.stop()


def test_client_certificates_required(tmp_path: Path, pki: dict[str, object]) -> None:
    gw = _gateway(tmp_path, pki, "--tls-ca", str(pki["ca"]), "--tls-verify", client="alice").start()
    try:
        with gw.client() as c:
            assert c.get("/v1/streams").status_code == 200
        without = Gateway(gw.warehouse, ca=pki["ca"])  # type: ignore[arg-type]
        without.tls, without.url = True, gw.url
        for cert in (None, pki["mallory"]):
            without.client_cert = cert  # type: ignore[assignment]
            with pytest.raises(httpx.HTTPError), without.client() as c:
                c.get("/v1/streams")
    finally:
        gw.stop()


MAPPED = """
tls { verify_and_map: true }
accounts {
  A {
    jetstream: enabled
    users: [
      { user: "CN=alice,O=Acme", permissions: { publish: { allow: ["$JS.API.>", "orders.>"] } } }
      { user: "bob@example.com", permissions: { publish: { allow: ["$JS.API.STREAM.INFO.ORDERS"] } } }
    ]
  }
}
"""


def test_certificates_name_the_users(tmp_path: Path, pki: dict[str, object]) -> None:
    (tmp_path / "mapped.conf").write_text(MAPPED)
    gw = _gateway(tmp_path, pki, "--config", str(tmp_path / "mapped.conf"), "--tls-ca", str(pki["ca"]), client="alice").start()
    try:
        with gw.client() as alice:
            assert alice.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}).status_code == 201
            assert alice.post("/v1/publish/orders.eu", content=b"x").status_code == 200
            # The certificate names the user: credentials in the request do not change who it is.
            assert alice.post("/v1/publish/orders.eu", content=b"x", headers=basic("bob@example.com", "")).status_code == 200
        gw.client_cert = pki["bob"]  # type: ignore[assignment]
        with gw.client() as bob:
            assert bob.get("/v1/streams/ORDERS").status_code == 200
            denied = bob.post("/v1/publish/orders.eu", content=b"x")
            assert denied.status_code == 403 and denied.json()["error"]["description"] == 'Permissions Violation for Publish to "orders.eu"'
        gw.client_cert = pki["carol"]  # type: ignore[assignment]
        with gw.client() as carol:
            assert carol.get("/v1/streams/ORDERS").status_code == 401
    finally:
        gw.stop()


def test_tls_settings_that_cannot_work_stop_the_start(tmp_path: Path, pki: dict[str, object]) -> None:
    cert, key = pki["server"]  # type: ignore[misc]
    for args, message in [
        ((None, None, None, True, False), "client certificates need TLS"),
        ((cert, None, None, False, False), "both a certificate and its key"),
        ((cert, key, None, True, False), "needs the CA"),
        ((cert, key, None, False, True), "needs the CA"),
    ]:
        with pytest.raises(ValueError, match=message):
            tls_settings(None, *args)
    mapped = tls_settings(TlsConfig(cert, key, str(pki["ca"]), verify_and_map=True), None, None, None, False, False)
    assert mapped is not None and mapped.verify and mapped.cert_reqs == ssl.CERT_REQUIRED
    done = subprocess.run([str(JETLAKE), "serve", "--warehouse", str(tmp_path), "--port", str(free_port()), "--tls-verify"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "client certificates need TLS" in done.stderr, done.stderr


# -- SIGHUP -------------------------------------------------------------------------------------

V1 = "accounts { A { jetstream: enabled, users: [ {user: u1, password: p1} ] } }"
V2 = """accounts {
  A { jetstream { max_streams: 2 }, users: [ {user: u2, password: p2} ] }
  NEW { jetstream: enabled, users: [ {user: n1, password: pn} ] }
}"""


@pytest.fixture
def reloading(tmp_path: Path) -> Iterator[tuple[Gateway, Path]]:
    (tmp_path / "warehouse").mkdir()
    conf = tmp_path / "gateway.conf"
    conf.write_text(V1)
    gw = Gateway(tmp_path / "warehouse", "--config", str(conf)).start()
    yield gw, conf
    gw.stop()


def _until(check: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise TimeoutError("the condition did not hold in time")


def test_sighup_reloads_users_accounts_and_limits_without_dropping_connections(reloading: tuple[Gateway, Path]) -> None:
    gw, conf = reloading
    u1, u2, n1 = basic("u1", "p1"), basic("u2", "p2"), basic("n1", "pn")
    with gw.client() as c:
        c.post("/v1/streams", json={"name": "S", "subjects": ["s.>"]}, headers=u1).raise_for_status()
        c.post("/v1/streams/S/consumers", json={"durable_name": "w", "ack_policy": "explicit"}, headers=u1).raise_for_status()
        pulled: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: pulled.append(
            c.post("/v1/streams/S/consumers/w/next", json={"expires": 20_000_000_000}, headers=u1, timeout=40)))
        waiting.start()
        _until(lambda: c.get("/v1/streams/S/consumers/w", headers=u1).json()["num_waiting"] == 1)
        conf.write_text(V2)
        gw.hup()
        _until(lambda: c.get("/v1/streams/S", headers=u2).status_code == 200)
        assert c.get("/v1/streams/S", headers=u1).status_code == 401  # removed: refused from the next request
        assert c.post("/v1/streams", json={"name": "N", "subjects": ["n.>"]}, headers=n1).status_code == 201
        c.post("/v1/publish/s.x", content=b"after the reload", headers=u2).raise_for_status()
        waiting.join(timeout=30)
        assert pulled and pulled[0].status_code == 200 and len(pulled[0].json()["messages"]) == 1  # the pull lived on
        assert c.post("/v1/streams", json={"name": "T", "subjects": ["t.>"]}, headers=u2).status_code == 201
        refused = c.post("/v1/streams", json={"name": "U", "subjects": ["u.>"]}, headers=u2)
        assert refused.status_code == 400 and refused.json()["error"]["err_code"] == 10027  # the new limit applies


def test_a_bad_config_on_sighup_keeps_the_running_one(reloading: tuple[Gateway, Path]) -> None:
    gw, conf = reloading
    conf.write_text("accounts { A { jetstream: enabled, users: [ {user: u1, password: p1} ] } \nbroken = [,]\n")
    gw.hup()
    _until(lambda: "not reloaded" in gw.log.read_text())
    assert "gateway.conf:2" in gw.log.read_text()
    with gw.client() as c:
        assert c.get("/v1/streams", headers=basic("u1", "p1")).status_code == 200


# -- exposure ------------------------------------------------------------------------------------


def test_no_anonymous_gateway_off_loopback(tmp_path: Path) -> None:
    done = subprocess.run([str(JETLAKE), "serve", "--warehouse", str(tmp_path), "--host", "0.0.0.0", "--port", str(free_port())],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0 without authentication" in done.stderr and "--config" in done.stderr
    assert not (tmp_path / "default").exists()  # refused before opening anything
    assert _exposure_refusal("::", False, False) and _exposure_refusal("192.0.2.1", False, False)
    assert _exposure_refusal("0.0.0.0", True, False) is None and _exposure_refusal("0.0.0.0", False, True) is None
    assert all(_exposure_refusal(h, False, False) is None for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))


def test_a_bad_config_stops_the_start_naming_its_line(tmp_path: Path) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("accounts {\n  A { jetstream: enabled }\n  B { users: [ { user: b, pasword: x } ] }\n}\n")
    done = subprocess.run([str(JETLAKE), "serve", "--warehouse", str(tmp_path), "--port", str(free_port()), "--config", str(conf)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"{conf}:3:" in done.stderr and "unknown field 'pasword'" in done.stderr
