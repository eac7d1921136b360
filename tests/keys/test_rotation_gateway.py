"""Key rotation as an operator reaches it: `POST /v1/accounts/{account}/streams/{stream}/rotate-key` on a
real gateway under publish load, and kill -9 of the gateway in the middle of rotations (after the new
epoch is durable and before the answer; with values of the new epoch still only in the log). After
each restart nothing acknowledged is lost, reads answer plaintext, and the compaction job then
re-encrypts the older values and destroys the older keys while the gateway serves."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pyspark.sql import SparkSession

from engine import encryption
from engine.keys import MasterKey
from engine.store.layout import Layout
from jobs import compact
from tests.gateway import Gateway

pytestmark = pytest.mark.spark

KEY = "rotation-gateway-key-0123456789abcdef"
MARKER = "Rg3-rotation-marker"
ROTATE = "/v1/accounts/APP/streams/ROT/rotate-key"
APP, OPERATOR = ("app", "app-pw"), ("op", "op-pw")
CONFIG = (
    f'jetstream {{ key: "{KEY}", cipher: aes }}\nsystem_account: SYS\naccounts {{\n'
    f'  SYS {{ users: [ {{ user: {OPERATOR[0]}, password: {OPERATOR[1]} }} ] }}\n'
    f'  APP {{ jetstream: enabled, users: [ {{ user: {APP[0]}, password: {APP[1]} }} ] }}\n}}\n')


class Publisher:
    """Publishes batches of five in a thread until stopped or the gateway goes away; keeps what was acked."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.acked: dict[int, bytes] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._n = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Publisher:
        self._thread.start()
        return self

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30.0, auth=APP) as c:
            while not self._stop.is_set() and self._n < 50_000:
                batch = [f"{MARKER} {self._n + i}" for i in range(5)]
                messages = [{"subject": f"rot.{(self._n + i) % 3}", "text": text, "headers": {"X-N": [text]}}
                            for i, text in enumerate(batch)]
                try:
                    resp = c.post("/v1/publish", json={"messages": messages})
                except httpx.HTTPError:
                    return  # the gateway was killed: what it did not answer was not acknowledged
                if resp.status_code != 200:
                    self.errors.append(resp.text[:300])
                    return
                for ack, text in zip(resp.json()["acks"], batch, strict=True):
                    if "seq" in ack:
                        self.acked[ack["seq"]] = text.encode()
                self._n += len(batch)

    def wait_for(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.acked) < count:
            assert self._thread.is_alive() and not self.errors, self.errors
            assert time.monotonic() < deadline, f"only {len(self.acked)} acks"
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive() and not self.errors, self.errors


def read_all(c: httpx.Client, seqs: list[int]) -> dict[int, bytes]:
    out = {}
    for seq in seqs:
        resp = c.get(f"/v1/streams/ROT/messages/{seq}")
        assert resp.status_code == 200, (seq, resp.text)
        message = resp.json()["message"]
        out[seq] = base64.b64decode(message["data"])
        assert message["headers"]["X-N"] == [out[seq].decode()]
    return out


def until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def test_rotation_by_route_and_kill9_mid_rotation_under_load(spark: SparkSession, tmp_path: Path,
                                                            warehouse: Path) -> None:
    config = tmp_path / "server.conf"
    config.write_text(CONFIG)
    layout = Layout(warehouse, "APP")
    acked: dict[int, bytes] = {}
    gateway = Gateway(warehouse, "--config", str(config), "--flush-interval", "0.3",
                      env={"JETLAKE_FAILPOINTS": "keys.rotate=kill_after@2"}).start()
    try:
        with gateway.client(auth=APP) as c, gateway.client(auth=OPERATOR) as op:
            assert c.post("/v1/streams", json={"name": "ROT", "subjects": ["rot.>"]}).status_code == 201
            memory_stream = {"name": "MEM", "subjects": ["mem.>"], "storage": "memory"}
            assert c.post("/v1/streams", json=memory_stream).status_code == 201
            load = Publisher(gateway.url).start()
            load.wait_for(300)
            assert c.post(ROTATE).status_code == 403  # the operator's route, not the account's
            resp = op.post(ROTATE)
            assert resp.status_code == 200 and resp.json() == {"stream": "ROT", "epoch": 2}, resp.text
            for path, status, err_code in (("/v1/accounts/APP/streams/NONE/rotate-key", 404, 10059),
                                           ("/v1/accounts/APP/streams/MEM/rotate-key", 400, 10003)):
                error = op.post(path).json()["error"]
                assert (error["code"], error["err_code"]) == (status, err_code), error
            load.wait_for(len(load.acked) + 300)
            with pytest.raises(httpx.HTTPError):  # the second rotation's epoch is durable, then kill -9
                op.post(ROTATE)
        assert gateway.proc is not None
        gateway.proc.wait(timeout=30)
        gateway.proc = None
        load.stop()
        acked.update(load.acked)

        gateway.env = {}
        gateway.start()
        with gateway.client(auth=APP) as c, gateway.client(auth=OPERATOR) as op:
            assert read_all(c, sorted(acked)) == acked
            load = Publisher(gateway.url).start()
            load.wait_for(300)
            assert op.post(ROTATE).json()["epoch"] == 4  # epoch 3 was durable before the kill
            load.wait_for(len(load.acked) + 300)  # values of epoch 4, in the log, unflushed or not
        gateway.kill9()
        load.stop()
        acked.update(load.acked)

        gateway.start()
        with gateway.client(auth=APP) as c:
            assert read_all(c, sorted(acked)) == acked
            assert c.post("/v1/flush").json()["success"]
            keyring = encryption.existing_keyring(layout, MasterKey.from_config(KEY, "aes"))
            assert keyring is not None
            figures = compact.run(spark, layout, keyring=keyring)
            assert figures["streams_rekeyed"] == 1 and figures["rekey_errors"] == 0, figures
            assert figures["keys_retired"] >= 3, figures  # the data keys of epochs 1 to 3
            assert read_all(c, sorted(acked)) == acked
            resp = c.post("/v1/publish/rot.after", content=b"after the rotations")
            assert resp.status_code == 200, resp.text
    finally:
        gateway.stop()
    assert MARKER.encode() not in b"".join(p.read_bytes() for p in warehouse.rglob("*") if p.is_file())
