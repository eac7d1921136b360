"""A real gateway with `jetstream { key, cipher }` in its --config (the server's block, and an account's own):
what it stores is sealed, what it answers is plaintext, and a wrong or missing key refuses to start."""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import httpx
import pytest

from engine.encryption import PROTECTED_SUBJECTS_KEY
from tests.gateway import JETLAKE, Gateway

MARKER = "Wq4-gateway-marker"
SERVER_KEY = "gateway-server-key-0123456789abcdef"
SHOP_KEY = "shop-account-key-0123456789abcdefgh"


def files(warehouse: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(warehouse.rglob("*")) if p.is_file()}


def publish_and_read(c: httpx.Client) -> None:
    assert c.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}).status_code == 201
    batch = [{"subject": f"orders.{i}", "text": f"{MARKER} payload {i}",
              "headers": {"X-Secret": [f"{MARKER} header {i}"], "Nats-Msg-Id": [f"m{i}"]}} for i in range(1, 4)]
    resp = c.post("/v1/publish", json={"messages": batch})
    assert resp.status_code == 200 and [a["seq"] for a in resp.json()["acks"]] == [1, 2, 3], resp.text
    assert_plaintext(c)


def assert_plaintext(c: httpx.Client) -> None:
    msg = c.get("/v1/streams/ORDERS/messages/2").json()["message"]
    assert base64.b64decode(msg["data"]) == f"{MARKER} payload 2".encode()
    assert msg["headers"]["X-Secret"] == [f"{MARKER} header 2"]


def test_server_key_seals_the_store_and_wrong_or_missing_keys_refuse(tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "server.conf"
    config.write_text(f'jetstream {{ key: "{SERVER_KEY}", cipher: aes }}\n')
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client() as c:
            publish_and_read(c)
            assert MARKER.encode() not in b"".join(files(warehouse).values())  # in the log only, sealed
            assert c.post("/v1/flush").json()["success"]
            assert_plaintext(c)
    finally:
        gateway.stop()
    assert MARKER.encode() not in b"".join(files(warehouse).values())

    before = files(warehouse)
    wrong = tmp_path / "wrong.conf"
    wrong.write_text('jetstream { key: "a-wrong-key-0123456789abcdefghijk", cipher: aes }\n')
    with pytest.raises(RuntimeError, match="exited with 2.*does not open the keyring.*nothing was changed"):
        Gateway(warehouse, "--config", str(wrong)).start()
    with pytest.raises(RuntimeError, match="exited with 2.*no key was given.*nothing was changed"):
        Gateway(warehouse).start()
    for command in (["jobs", "run", "compact"], ["sql", "SELECT 1", "--no-flush"]):  # refused before Spark starts
        done = subprocess.run([str(JETLAKE), *command, "--warehouse", str(warehouse), "--config", str(wrong)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "does not open the keyring" in done.stderr, (command, done.stderr[-2000:])
    assert files(warehouse) == before

    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client() as c:
            assert_plaintext(c)
    finally:
        gateway.stop()


def test_an_account_key_of_its_own(tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "accounts.conf"
    config.write_text(
        "accounts {\n"
        f'  SHOP {{ jetstream {{ key: "{SHOP_KEY}", cipher: chachapoly }}, users: [ {{ user: shop, password: pw }} ] }}\n'
        "  OPEN { jetstream: enabled, users: [ { user: open, password: pw } ] }\n"
        "}\n")
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client(auth=("shop", "pw")) as shop, gateway.client(auth=("open", "pw")) as plain:
            publish_and_read(shop)
            publish_and_read(plain)
            protected = {"name": "HIDDEN", "subjects": ["hidden.>"], "metadata": {PROTECTED_SUBJECTS_KEY: "true"}}
            refused = plain.post("/v1/streams", json=protected)  # an account without a key protects nothing
            assert refused.status_code == 400 and refused.json()["error"]["err_code"] == 10052, refused.text
            assert "no key" in refused.json()["error"]["description"]
            assert plain.get("/v1/streams/HIDDEN").status_code == 404
            assert shop.post("/v1/streams", json=protected).status_code == 201
            changed = shop.put("/v1/streams/HIDDEN", json={**protected, "metadata": {}})
            assert changed.status_code == 400 and changed.json()["error"]["err_code"] == 10052, changed.text
            resp = shop.post("/v1/publish", json={"messages": [{"subject": f"hidden.{MARKER}", "text": "h"}]})
            assert resp.status_code == 200, resp.text
            assert shop.post("/v1/flush").json()["success"] and plain.post("/v1/flush").json()["success"]
            found = shop.get("/v1/streams/HIDDEN/messages", params={"last_by_subj": f"hidden.{MARKER}"})
            assert found.json()["message"]["subject"] == f"hidden.{MARKER}", found.text
    finally:
        gateway.stop()
    assert MARKER.encode() not in b"".join(files(warehouse / "SHOP").values())
    assert MARKER.encode() in b"".join(files(warehouse / "OPEN").values())  # an account without a key is plain
    assert (warehouse / "SHOP" / "_system" / "keys" / "keyring.json").exists()
    assert not (warehouse / "OPEN" / "_system" / "keys").exists()
