"""Key rotation from a shell and from NATS: `jetlake keys rotate` (over HTTP, with a system-account user's
credentials) and `$SYS.REQ.ACCOUNT.<account>.KEY.ROTATE.<stream>` on the NATS door, on a real gateway.

Both reach `JetStream.rotate_key`, as the HTTP route does: each answers the new epoch, the values written
after it are sealed under a key of that epoch (read back from the flushed table and the keyring), every
message still reads back in plaintext, and refusals (another account's user, a plain stream, a missing
stream or account, no gateway) change nothing."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
from pathlib import Path

import httpx
import nats
import pytest
from deltalake import DeltaTable
from nats.errors import NoRespondersError

from engine.keys import Keyring, MasterKey, keyring_folder
from tests.gateway import JETLAKE, Gateway, free_port

KEY = "rotation-doors-key-0123456789abcdefgh"
MARKER = "Rd5-rotation-doors-marker"
APP, OPERATOR = ("app", "app-pw"), ("op", "op-pw")
CONFIG = (
    f'jetstream {{ key: "{KEY}", cipher: aes }}\nsystem_account: SYS\naccounts {{\n'
    f'  SYS {{ users: [ {{ user: {OPERATOR[0]}, password: {OPERATOR[1]} }} ] }}\n'
    f'  APP {{ jetstream: enabled, users: [ {{ user: {APP[0]}, password: {APP[1]} }} ] }}\n}}\n')


def rotate_cli(gateway_url: str, stream: str, user: tuple[str, str],
               account: str = "APP") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JETLAKE_PASSWORD": user[1]}
    return subprocess.run([str(JETLAKE), "keys", "rotate", "--account", account, "--stream", stream,
                           "--gateway", gateway_url, "--user", user[0]], capture_output=True, text=True, env=env,
                          timeout=60)


def publish(c: httpx.Client, first: int, count: int) -> None:
    batch = [{"subject": f"rot.{i}", "text": f"{MARKER} {i}"} for i in range(first, first + count)]
    assert c.post("/v1/publish", json={"messages": batch}).status_code == 200


def epochs_by_seq(warehouse: Path) -> dict[int, int]:
    """The key epoch of every flushed value of ROT: its key id (bytes 1..4) looked up in the keyring."""
    record = json.loads((warehouse / "APP" / "_system" / "streams" / "ROT.json").read_text())
    ring = Keyring.open(keyring_folder(warehouse / "APP"), "APP", MasterKey.from_config(KEY, "aes"))
    keys = ring.stream(record["stream_id"])
    rows = DeltaTable(str(warehouse / "APP" / "streams" / "ROT")).to_pyarrow_table(columns=["seq", "data"]).to_pylist()
    return {row["seq"]: keys.epoch_of(int.from_bytes(row["data"][1:5], "big")) for row in rows}


def test_rotation_by_the_cli_and_by_the_nats_door(tmp_path: Path, warehouse: Path) -> None:
    config = tmp_path / "server.conf"
    config.write_text(CONFIG)
    gateway = Gateway(warehouse, "--config", str(config)).start()
    try:
        with gateway.client(auth=APP) as c:
            assert c.post("/v1/streams", json={"name": "ROT", "subjects": ["rot.>"]}).status_code == 201
            memory = {"name": "MEM", "subjects": ["mem.>"], "storage": "memory"}
            assert c.post("/v1/streams", json=memory).status_code == 201
            publish(c, 0, 5)

            done = rotate_cli(gateway.url, "ROT", OPERATOR)
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout) == {"stream": "ROT", "epoch": 2}
            publish(c, 5, 5)

            async def over_nats() -> list[dict]:
                op = await nats.connect(gateway.nats_url, user=OPERATOR[0], password=OPERATOR[1],
                                        max_reconnect_attempts=0)
                app = await nats.connect(gateway.nats_url, user=APP[0], password=APP[1], max_reconnect_attempts=0)
                try:
                    with pytest.raises(NoRespondersError):  # not a system-account user: nobody answers
                        await app.request("$SYS.REQ.ACCOUNT.APP.KEY.ROTATE.ROT", b"", timeout=5)
                    answers = []
                    for subject in ("$SYS.REQ.ACCOUNT.APP.KEY.ROTATE.ROT", "$SYS.REQ.ACCOUNT.APP.KEY.ROTATE.NONE",
                                    "$SYS.REQ.ACCOUNT.APP.KEY.ROTATE.MEM", "$SYS.REQ.ACCOUNT.NOPE.KEY.ROTATE.ROT"):
                        answers.append(json.loads((await op.request(subject, b"", timeout=30)).data))
                    with pytest.raises(NoRespondersError):  # another `$SYS.REQ.` request: no responder here
                        await op.request("$SYS.REQ.ACCOUNT.APP.CONNZ", b"", timeout=5)
                    return answers
                finally:
                    await op.close()
                    await app.close()

            rotated, missing, plain, no_account = asyncio.run(over_nats())
            assert rotated == {"type": "io.nats.jetlake.api.v1.key_rotate_response", "stream": "ROT", "epoch": 3}
            assert (missing["error"]["code"], missing["error"]["err_code"]) == (404, 10059)
            assert (plain["error"]["code"], plain["error"]["err_code"]) == (400, 10003)
            assert "not encrypted" in plain["error"]["description"]
            assert no_account["error"]["code"] == 404 and "account not found" in no_account["error"]["description"]
            publish(c, 10, 5)

            refusals = (("ROT", APP, 1, "(403)"), ("MEM", OPERATOR, 1, "not encrypted"),
                        ("NONE", OPERATOR, 1, "stream not found"), ("ROT", ("op", "wrong"), 1, "(401)"))
            for stream, user, code, text in refusals:
                refused = rotate_cli(gateway.url, stream, user)
                assert refused.returncode == code and text in refused.stderr, (stream, refused.stderr)
            unreachable = rotate_cli(f"http://127.0.0.1:{free_port()}", "ROT", OPERATOR)
            assert unreachable.returncode == 2 and "no gateway" in unreachable.stderr

            assert c.post("/v1/flush").json()["success"]
            for seq in range(1, 16):
                message = c.get(f"/v1/streams/ROT/messages/{seq}").json()["message"]
                assert base64.b64decode(message["data"]) == f"{MARKER} {seq - 1}".encode()
        epochs = epochs_by_seq(warehouse)
        assert epochs == {seq: 1 if seq <= 5 else 2 if seq <= 10 else 3 for seq in range(1, 16)}
    finally:
        gateway.stop()
