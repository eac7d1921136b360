"""Deleting an account destroys its master key's wrapped data keys, then its data: on a real gateway.

An encrypted account APP (streams, a KV bucket, a durable consumer with acks, values flushed and
values still in the log) and a plain account KEEP beside it. The system account's operator deletes
APP once a reload dropped it from the config: by `DELETE /v1/accounts/APP` (HTTP), by
`$JS.API.ACCOUNT.PURGE.APP` (NATS), and by `jetlake accounts delete` on a stopped gateway. After each:
nothing of the account answers through either door, KEEP is untouched, a restart does not bring it
back, and a scan of the whole warehouse finds no marker in clear and no keyring file of the account.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
from pathlib import Path

import httpx
import nats
import nats.errors
import pytest
from nats.errors import NoRespondersError

from engine.keys import keyring_folder
from engine.keys.keyfile import HEADER_NAME, STREAM_SUFFIX, decode_header
from tests.gateway import JETLAKE, Gateway
from tests.residue import find_residue, needles_for

KEY = "account-deletion-key-0123456789abcdef"
MARKER = "Dq7-deleted-account-marker"
KEEP_MARKER = "Kp2-kept-account-text"
OPERATOR, APP, KEEP = ("op", "op-pw"), ("app", "app-pw"), ("keep", "keep-pw")


def config_text(*accounts: str) -> str:
    users = {"APP": APP, "KEEP": KEEP}
    lines = [f'jetstream {{ key: "{KEY}", cipher: aes }}', "system_account: SYS", "accounts {",
             f"  SYS {{ users: [ {{ user: {OPERATOR[0]}, password: {OPERATOR[1]} }} ] }}"]
    for name in accounts:
        user, password = users[name]
        lines.append(f"  {name} {{ jetstream: enabled, users: [ {{ user: {user}, password: {password} }} ] }}")
    return "\n".join([*lines, "}", ""])


def fill_app(c: httpx.Client) -> None:
    """Streams, a KV bucket and a durable consumer with acks; some values flushed, some only in the log."""
    assert c.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}).status_code == 201
    batch = [{"subject": f"orders.{i}", "text": f"{MARKER} {i}", "headers": {"X-M": [f"{MARKER} h{i}"]}}
             for i in range(20)]
    assert c.post("/v1/publish", json={"messages": batch}).status_code == 200
    consumer = {"durable_name": "C", "ack_policy": "explicit"}
    assert c.post("/v1/streams/ORDERS/consumers", json=consumer).status_code in (200, 201)
    msgs = c.post("/v1/streams/ORDERS/consumers/C/next", json={"batch": 5, "no_wait": True}).json()["messages"]
    assert len(msgs) == 5
    acks = {"acks": [{"token": m["ack"]} for m in msgs]}
    assert c.post("/v1/streams/ORDERS/consumers/C/ack", json=acks).status_code == 200
    assert c.post("/v1/kv", json={"bucket": "cfg"}).status_code in (200, 201)
    assert c.put("/v1/kv/cfg/entries/secret", content=f"{MARKER} kv".encode()).status_code == 200
    assert c.post("/v1/flush").json()["success"]
    late = [{"subject": "orders.late", "text": f"{MARKER} unflushed"}]
    assert c.post("/v1/publish", json={"messages": late}).status_code == 200


def fill_keep(c: httpx.Client) -> None:
    assert c.post("/v1/streams", json={"name": "ORDERS", "subjects": ["orders.>"]}).status_code == 201
    batch = [{"subject": f"orders.{i}", "text": f"{KEEP_MARKER} {i}"} for i in range(10)]
    assert c.post("/v1/publish", json={"messages": batch}).status_code == 200


def assert_keep_intact(c: httpx.Client) -> None:
    assert c.get("/v1/streams/ORDERS").json()["state"]["messages"] == 10
    msg = c.get("/v1/streams/ORDERS/messages/4").json()["message"]
    assert base64.b64decode(msg["data"]) == f"{KEEP_MARKER} 3".encode()


def reload_without_app(gateway: Gateway, config: Path) -> None:
    config.write_text(config_text("KEEP"))
    gateway.hup()
    deadline = time.monotonic() + 30
    with gateway.client(auth=OPERATOR) as op:
        while "APP" in [a["name"] for a in op.get("/v1/accounts").json()["accounts"]]:
            assert time.monotonic() < deadline, "the reload was not applied"
            time.sleep(0.05)


def assert_nothing_left(warehouse: Path) -> None:
    """No folder of APP, no marker anywhere in any encoding, no keyring file that names APP."""
    assert not (warehouse / "APP").exists()
    assert find_residue(warehouse, needles_for(MARKER)) == []
    for path in warehouse.rglob(HEADER_NAME):
        assert decode_header(path)[0].account != "APP", path
    keep_keys = keyring_folder(warehouse / "KEEP")
    stream_keys = list(warehouse.rglob(f"*{STREAM_SUFFIX}"))
    assert all(p.parent == keep_keys for p in stream_keys), stream_keys


def assert_app_unreachable(gateway: Gateway) -> None:
    with gateway.client(auth=APP) as c:
        assert c.get("/v1/streams/ORDERS").status_code == 401
    with gateway.client(auth=OPERATOR) as op:
        assert op.get("/v1/accounts/APP").status_code == 404
        assert op.post("/v1/accounts/APP/streams/ORDERS/rotate-key").status_code == 404
        again = op.delete("/v1/accounts/APP")  # nothing left to delete
        assert again.status_code == 404 and "no data" in again.json()["error"]["description"]

    async def app_login() -> None:
        with pytest.raises(Exception, match="(?i)authorization"):
            await nats.connect(gateway.nats_url, user=APP[0], password=APP[1], max_reconnect_attempts=0,
                               allow_reconnect=False, connect_timeout=5)

    asyncio.run(app_login())


def test_deleting_an_account_over_http_destroys_its_keys_then_its_data(tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "accounts.conf"
    config.write_text(config_text("APP", "KEEP"))
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client(auth=APP) as app, gateway.client(auth=KEEP) as keep, gateway.client(auth=OPERATOR) as op:
            fill_app(app)
            fill_keep(keep)
            assert (keyring_folder(warehouse / "APP") / HEADER_NAME).exists()
            refused = op.delete("/v1/accounts/APP")  # still in the config: refused, nothing changes
            assert refused.status_code == 409 and "in the config" in refused.json()["error"]["description"]
            assert app.get("/v1/streams/ORDERS").json()["state"]["messages"] == 21
            assert app.delete("/v1/accounts/KEEP").status_code == 403  # only the system account deletes

            async def open_app_client() -> nats.NATS:
                return await nats.connect(gateway.nats_url, user=APP[0], password=APP[1], max_reconnect_attempts=0,
                                          allow_reconnect=False)

            loop = asyncio.new_event_loop()
            app_nats = loop.run_until_complete(open_app_client())  # connected before the reload drops APP
            reload_without_app(gateway, config)
            answer = op.delete("/v1/accounts/APP")
            assert answer.status_code == 200, answer.text
            receipt = answer.json()["receipt"]
            assert answer.json()["initiated"] is True
            assert receipt["account"] == "APP" and receipt["keyring_files"] >= 2  # header and stream key files
            assert receipt["requested"] <= receipt["keyring_destroyed"] <= receipt["completed"]
            assert {"ORDERS", "KV_cfg"} <= set(receipt["streams"]) and receipt["objects_deleted"] > 0

            async def closed_soon() -> None:
                deadline = time.monotonic() + 10
                while not app_nats.is_closed:
                    assert time.monotonic() < deadline, "the deleted account's NATS client stayed connected"
                    await asyncio.sleep(0.05)

            loop.run_until_complete(closed_soon())
            loop.close()
            assert_app_unreachable(gateway)
            assert_keep_intact(keep)
        assert_nothing_left(warehouse)
    finally:
        gateway.stop()
    assert_nothing_left(warehouse)

    gateway = Gateway(warehouse, "--config", str(config)).start()  # a restart does not bring APP back
    try:
        with gateway.client(auth=OPERATOR) as op, gateway.client(auth=KEEP) as keep:
            assert "APP" not in [a["name"] for a in op.get("/v1/accounts").json()["accounts"]]
            assert_keep_intact(keep)
    finally:
        gateway.stop()
    config.write_text(config_text("APP", "KEEP"))  # the name again: a new, empty account
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client(auth=APP) as app:
            assert app.get("/v1/streams").json()["total"] == 0
            assert app.get("/v1/kv/cfg").status_code == 404
    finally:
        gateway.stop()


def test_deleting_an_account_over_nats(tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "accounts.conf"
    config.write_text(config_text("APP", "KEEP"))
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client(auth=APP) as app, gateway.client(auth=KEEP) as keep:
            fill_app(app)
            fill_keep(keep)

        async def purge() -> list[dict]:
            nc = await nats.connect(gateway.nats_url, user=OPERATOR[0], password=OPERATOR[1], max_reconnect_attempts=0)
            keeper = await nats.connect(gateway.nats_url, user=KEEP[0], password=KEEP[1], max_reconnect_attempts=0)
            try:
                answers = [json.loads((await nc.request("$JS.API.ACCOUNT.PURGE.APP", b"", timeout=30)).data)]
                # a user outside the system account: its own JetStream API does not answer it (nats-server's neither)
                with pytest.raises(nats.errors.TimeoutError):
                    await keeper.request("$JS.API.ACCOUNT.PURGE.APP", b"", timeout=2)
                with pytest.raises(NoRespondersError):  # and no `$SYS.REQ.` subject has a responder there
                    await keeper.request("$SYS.REQ.ACCOUNT.APP.KEY.ROTATE.ORDERS", b"", timeout=5)
                reload_without_app(gateway, config)
                answers.append(json.loads((await nc.request("$JS.API.ACCOUNT.PURGE.APP", b"", timeout=60)).data))
                answers.append(json.loads((await nc.request("$JS.API.ACCOUNT.PURGE.APP", b"", timeout=30)).data))
                js = keeper.jetstream(timeout=10)
                assert (await js.stream_info("ORDERS")).state.messages == 10
                return answers
            finally:
                await nc.close()
                await keeper.close()

        refused, done, again = asyncio.run(purge())
        assert refused["type"] == "io.nats.jetstream.api.v1.account_purge_response"
        assert refused["error"]["code"] == 409 and "in the config" in refused["error"]["description"]
        assert done["type"] == "io.nats.jetstream.api.v1.account_purge_response" and done["initiated"] is True
        assert done["receipt"]["keyring_destroyed"] is not None and "ORDERS" in done["receipt"]["streams"]
        assert again["error"]["code"] == 404
        assert_app_unreachable(gateway)
        with gateway.client(auth=KEEP) as keep:
            assert_keep_intact(keep)
    finally:
        gateway.stop()
    assert_nothing_left(warehouse)


def test_deleting_an_account_of_a_stopped_gateway_with_the_cli(tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "accounts.conf"
    config.write_text(config_text("APP", "KEEP"))
    gateway = Gateway(warehouse, "--config", str(config)).start()

    def delete() -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(JETLAKE), "accounts", "delete", "APP", "--config", str(config),
                               "--warehouse", str(warehouse)], capture_output=True, text=True, timeout=120)

    try:
        with gateway.client(auth=APP) as app, gateway.client(auth=KEEP) as keep:
            fill_app(app)
            fill_keep(keep)
        refused = delete()
        assert refused.returncode == 2 and "is in the config" in refused.stderr, refused.stderr
        config.write_text(config_text("KEEP"))  # the running gateway still serves APP (no reload): its lease
        held = delete()
        assert held.returncode == 2 and "cannot be deleted now" in held.stderr, held.stderr
        assert (keyring_folder(warehouse / "APP") / HEADER_NAME).exists()
    finally:
        gateway.stop()
    done = delete()
    assert done.returncode == 0, done.stderr
    receipt = json.loads(done.stdout)
    assert receipt["account"] == "APP" and receipt["keyring_destroyed"] is not None
    assert receipt["log_files_deleted"] == 0  # the logs were in the warehouse's tree
    assert_nothing_left(warehouse)
    missing = delete()
    assert missing.returncode == 1 and "no data" in missing.stderr
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client(auth=KEEP) as keep:
            assert_keep_intact(keep)
        assert_app_unreachable(gateway)
    finally:
        gateway.stop()


def test_a_deletion_killed_after_the_keyring_went_is_finished_by_deleting_again(tmp_path: Path,
                                                                               warehouse: Path) -> None:
    config = tmp_path / "accounts.conf"
    config.write_text(config_text("APP", "KEEP"))
    gateway = Gateway(warehouse, "--config", str(config),
                      env={"JETLAKE_FAILPOINTS": "accounts.delete_keys=kill_after"}).start()
    with gateway.client(auth=APP) as app, gateway.client(auth=KEEP) as keep:
        fill_app(app)
        fill_keep(keep)
        assert keep.post("/v1/flush").json()["success"]
    reload_without_app(gateway, config)
    with gateway.client(auth=OPERATOR) as op, pytest.raises(httpx.HTTPError):
        op.delete("/v1/accounts/APP")  # the keyring is destroyed, then kill -9
    assert gateway.proc is not None
    gateway.proc.wait(timeout=30)
    gateway.proc = None
    assert not (keyring_folder(warehouse / "APP") / HEADER_NAME).exists()
    assert (warehouse / "APP" / "streams" / "ORDERS").is_dir(), "the tree was not reached"
    assert find_residue(warehouse, needles_for(MARKER)) == []

    gateway.env = {}
    gateway.start()
    try:
        with gateway.client(auth=OPERATOR) as op, gateway.client(auth=KEEP) as keep:
            answer = op.delete("/v1/accounts/APP")
            assert answer.status_code == 200, answer.text
            receipt = answer.json()["receipt"]
            assert receipt["keyring_destroyed"] is None and receipt["keyring_files"] == 0  # gone already
            assert "ORDERS" in receipt["streams"] and receipt["objects_deleted"] > 0
            assert_keep_intact(keep)
        assert_app_unreachable(gateway)
    finally:
        gateway.stop()
    assert_nothing_left(warehouse)
