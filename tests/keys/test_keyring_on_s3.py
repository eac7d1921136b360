"""The keyring of an s3:// warehouse is objects of the bucket (versitygw on loopback), not files of one gateway.

A second gateway on the same bucket, with a local state folder of its own, opens the encrypted account
the first one wrote and reads it in plaintext; a wrong key changes nothing in the bucket; a keyring
an earlier version left on a gateway's disk moves into the bucket at the next start; and deleting an
account on S3 destroys its keyring objects first, then every object of its prefix and its local logs,
with no marker left in any object of the bucket.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from engine import EngineOptions, InboundMessage, JetStream, ManualClock
from engine.keys import MasterKey, keyring_folder
from engine.keys.keyfile import HEADER_NAME, STREAM_SUFFIX
from engine.store.objectstore import WarehouseLocation
from tests.gateway import Gateway
from tests.keys.test_account_deletion import (
    APP,
    KEEP,
    KEY,
    MARKER,
    OPERATOR,
    assert_app_unreachable,
    assert_keep_intact,
    config_text,
    fill_app,
    fill_keep,
    reload_without_app,
)
from tests.s3 import S3Server


def bucket(location: WarehouseLocation) -> dict[str, tuple[str, bytes]]:
    """Every object of the warehouse: its version and bytes."""
    store = location.open()
    return {meta.key: (meta.version, store.get(meta.key).data) for meta in store.list()}


def gateway(s3: S3Server, warehouse: str, tmp_path: Path, state: str, config: Path,
            flush: str = "0.2") -> Gateway:
    return Gateway(warehouse, "--wal-dir", str(tmp_path / state), "--config", str(config), "--flush-interval", flush,
                   env=s3.env, log_dir=tmp_path)


def test_a_second_gateway_on_the_bucket_finds_the_keyring(s3_server: S3Server, tmp_path: Path) -> None:
    warehouse = s3_server.warehouse()
    location = WarehouseLocation.parse(warehouse, s3_server.env)
    config = tmp_path / "accounts.conf"
    config.write_text(config_text("APP", "KEEP"))
    first = gateway(s3_server, warehouse, tmp_path, "state-a", config).start()
    try:
        with first.client(auth=APP) as app:
            fill_app(app)
    finally:
        first.stop()
    objects = bucket(location)
    keys = [k for k in objects if k.startswith("APP/_system/keys/")]
    assert "APP/_system/keys/keyring.json" in keys and any(k.endswith(STREAM_SUFFIX) for k in keys), keys
    assert not any(MARKER.encode() in data for _, data in objects.values())
    assert not keyring_folder(tmp_path / "state-a" / "APP").exists(), "no keyring on the first gateway's disk"

    wrong = tmp_path / "wrong.conf"
    wrong.write_text(config_text("APP", "KEEP").replace(KEY, "a-wrong-key-0123456789abcdefghijkl"))
    with pytest.raises(RuntimeError, match="exited with 2.*does not open the keyring.*nothing was changed"):
        gateway(s3_server, warehouse, tmp_path, "state-c", wrong).start()
    assert bucket(location) == objects

    second = gateway(s3_server, warehouse, tmp_path, "state-b", config).start()  # nothing of the first's disk
    try:
        with second.client(auth=APP) as app, second.client(auth=OPERATOR) as op:
            msg = app.get("/v1/streams/ORDERS/messages/3").json()["message"]
            assert base64.b64decode(msg["data"]) == f"{MARKER} 2".encode()
            assert app.get("/v1/streams/ORDERS/messages/21").json()["message"]["subject"] == "orders.late"
            assert app.get("/v1/kv/cfg/entries/secret").content == f"{MARKER} kv".encode()
            assert op.post("/v1/accounts/APP/streams/ORDERS/rotate-key").json() == {"stream": "ORDERS", "epoch": 2}
            new = {"messages": [{"subject": "orders.new", "text": "new"}]}
            assert app.post("/v1/publish", json=new).status_code == 200
            assert base64.b64decode(app.get("/v1/streams/ORDERS/messages/22").json()["message"]["data"]) == b"new"
    finally:
        second.stop()
    assert not keyring_folder(tmp_path / "state-b" / "APP").exists()


def test_a_keyring_left_on_a_gateways_disk_moves_into_the_bucket(s3_server: S3Server, tmp_path: Path,
                                                                 clock: ManualClock) -> None:
    location = s3_server.location()
    master = MasterKey.from_config(KEY, "aes")
    options = EngineOptions(wal_dir=str(tmp_path / "state"), key=master)
    js = JetStream(location, options, clock=clock)
    js.open(start_flusher=False)
    js.add_stream({"name": "OLD", "subjects": ["old.>"]})
    js.publish([InboundMessage("old.a", f"{MARKER} before the move".encode())])
    js.flush()
    js.close()
    store = location.open()
    legacy = keyring_folder(tmp_path / "state" / "default")  # where an earlier version kept it
    legacy.mkdir(parents=True)
    for meta in list(store.list("default/_system/keys")):
        name = meta.key.rsplit("/", 1)[1]
        if name != ".lock":
            (legacy / name).write_bytes(store.get(meta.key).data)
        store.delete(meta.key)
    assert (legacy / HEADER_NAME).exists() and not list(store.list("default/_system/keys"))

    again = JetStream(location, options, clock=clock)
    again.open(start_flusher=False)
    try:
        assert again.get_message("OLD", 1).data == f"{MARKER} before the move".encode()
        assert store.head(f"default/_system/keys/{HEADER_NAME}").size > 0
        assert not legacy.exists(), "the local copy is zeroed and removed once in the bucket"
    finally:
        again.close()


def test_deleting_an_account_on_s3(s3_server: S3Server, tmp_path: Path) -> None:
    warehouse = s3_server.warehouse()
    location = WarehouseLocation.parse(warehouse, s3_server.env)
    config = tmp_path / "accounts.conf"
    config.write_text(config_text("APP", "KEEP"))
    gw = gateway(s3_server, warehouse, tmp_path, "state", config, flush="600").start()  # last values stay in the log
    try:
        with gw.client(auth=APP) as app, gw.client(auth=KEEP) as keep, gw.client(auth=OPERATOR) as op:
            fill_app(app)
            fill_keep(keep)
            assert (tmp_path / "state" / "APP" / "_wal").is_dir()
            reload_without_app(gw, config)
            answer = op.delete("/v1/accounts/APP")
            assert answer.status_code == 200, answer.text
            receipt = answer.json()["receipt"]
            assert receipt["keyring_destroyed"] is not None and receipt["keyring_files"] >= 2
            assert receipt["objects_deleted"] > 0 and receipt["log_files_deleted"] > 0
            assert_app_unreachable(gw)
            assert_keep_intact(keep)
        objects = bucket(location)
        assert not [k for k in objects if k.startswith("APP/")], "an object of the deleted account is left"
        assert any(k.startswith("KEEP/") for k in objects)
        assert not any(MARKER.encode() in data for _, data in objects.values())
        assert not (tmp_path / "state" / "APP").exists()
    finally:
        gw.stop()
    gw = gateway(s3_server, warehouse, tmp_path, "state", config).start()  # a restart does not bring APP back
    try:
        with gw.client(auth=KEEP) as keep:
            assert_keep_intact(keep)
        assert not [k for k in bucket(location) if k.startswith("APP/")]
    finally:
        gw.stop()
