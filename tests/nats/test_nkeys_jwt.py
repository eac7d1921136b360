"""Nkey users and operator-mode JWT users: nonce signing with real keys, `.creds` with nats-py and the CLI.

Two configs, each run on a real gateway and on the real nats-server with the same assertions:
an account with an nkey user (`users: [{nkey: U…}]`), who logs in by signing INFO's nonce with
its seed and is refused with another seed; and an operator with a MEMORY resolver preloading a
system account and two accounts. There a user JWT signed by the account, one signed by the
account's signing key, and one by a scoped signing key (whose template's permissions apply, not the
user's own) log in from `.creds` files; a revoked user, a user of an account not preloaded and a
client without a JWT are refused; the two accounts' streams of one name are apart. The `nats` CLI
then uses `--creds` and `--nkey` against the gateway. A resolver JetLake does not support is refused
at load with a clear reason.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import nats
import pytest

from engine.accounts.config import ConfigError, loads
from tests.gateway import Gateway
from tests.nats.conftest import NatsServer
from tests.nats.jwts import JETSTREAM_LIMITS, NO_JETSTREAM_LIMITS, Key, creds, issue


async def _connect(url: str, errors: list[str] | None = None, **auth: Any) -> Any:
    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(url, max_reconnect_attempts=0, allow_reconnect=False, error_cb=on_error, **auth)


async def _refused(url: str, **auth: Any) -> None:
    errors: list[str] = []
    with pytest.raises(Exception):  # noqa: B017 - nats-py raises what it raises; the server's text is the point
        nc = await _connect(url, errors, **auth)
        await nc.close()
    assert any("authorization violation" in e.lower() for e in errors), errors


# -- nkey users -----------------------------------------------------------------------------------


def _nkey_config(tmp_path: Path, store: Path, user: Key) -> Path:
    path = tmp_path / "nkeys.conf"
    path.write_text(
        f'jetstream {{ store_dir: "{store}" }}\n'
        f'accounts {{ A {{ jetstream: enabled, users: [ {{ nkey: {user.public} }}, {{ user: pw, password: p }} ] }} }}\n'
    )
    return path


async def _nkey_scenario(url: str, user: Key) -> None:
    nc = await _connect(url, nkeys_seed_str=user.seed.decode())
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name="KEYED", subjects=["keyed.*"])
        assert (await js.publish("keyed.a", b"signed")).seq == 1
    finally:
        await nc.close()
    await _refused(url, nkeys_seed_str=Key.new("U").seed.decode())  # a key the config does not know
    other = await _connect(url, user="pw", password="p")  # a password user beside nkey users
    await other.close()


@pytest.mark.parametrize("target", ["jetlake", "nats-server"])
def test_nkey_user(tmp_path: Path, target: str) -> None:
    user = Key.new("U")
    if target == "jetlake":
        server: Any = Gateway(tmp_path / "warehouse", "--config", str(_nkey_config(tmp_path, tmp_path / "warehouse", user))).start(timeout=60)
        url = server.nats_url
    else:
        server = NatsServer(tmp_path / "ns", _nkey_config(tmp_path, tmp_path / "ns", user))
        url = server.url
    try:
        asyncio.run(asyncio.wait_for(_nkey_scenario(url, user), 60))
    finally:
        server.stop()


# -- operator mode ---------------------------------------------------------------------------------


class Operator:
    """An operator, its system account and two accounts with users, as `nsc` would set them up."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.operator, self.system, self.app, self.other = Key.new("O"), Key.new("A"), Key.new("A"), Key.new("A")
        self.signer, self.scoped = Key.new("A"), Key.new("A")
        self.users = {name: Key.new("U") for name in ("direct", "signed", "scoped", "revoked", "stranger", "other", "expiring")}
        now = int(time.time())
        scope = {"kind": "user_scope", "key": self.scoped.public, "role": "reader", "template": {
            "pub": {"allow": ["$JS.API.INFO", "$JS.API.STREAM.INFO.>"]}, "sub": {"allow": ["_INBOX.>"]},
        }}  # fmt: skip
        self.jwts = {
            self.system.public: issue(self.system.public, self.operator, "account", {"limits": NO_JETSTREAM_LIMITS}, "SYS"),
            self.app.public: issue(self.app.public, self.operator, "account", {
                "limits": JETSTREAM_LIMITS, "signing_keys": [self.signer.public, scope],
                "revocations": {self.users["revoked"].public: now + 3600},  # JWTs issued before then are revoked
            }, "APP"),
            self.other.public: issue(self.other.public, self.operator, "account", {"limits": JETSTREAM_LIMITS}, "OTHER"),
        }
        self.operator_jwt = issue(self.operator.public, self.operator, "operator", {"system_account": self.system.public}, "OP")

    def user_creds(self, name: str, account: Key, signer: Key | None = None, expires: int = 0, **nats: Any) -> str:
        user = self.users[name]
        claims: dict[str, Any] = {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, **nats}
        if signer is self.scoped:
            claims = dict(nats)  # a scoped key's user has the zero limits (jwt's SetScoped)
        if signer is not None:
            claims["issuer_account"] = account.public
        token = issue(user.public, signer or account, "user", claims, name, **({"exp": expires} if expires else {}))
        return str(creds(self.folder / f"{name}.creds", token, user))

    def config(self, store: Path, resolver: str = "MEMORY") -> Path:
        (self.folder / "op.jwt").write_text(self.operator_jwt)
        preload = "\n".join(f'  {key}: "{token}"' for key, token in self.jwts.items())
        path = self.folder / "operator.conf"
        path.write_text(
            f'operator: "{self.folder / "op.jwt"}"\nsystem_account: {self.system.public}\n'
            f"resolver: {resolver}\nresolver_preload: {{\n{preload}\n}}\n"
            f'jetstream {{ store_dir: "{store}" }}\n'
        )
        return path


async def _operator_scenario(url: str, op: Operator) -> None:
    direct = await _connect(url, user_credentials=op.user_creds("direct", op.app))
    signed = await _connect(url, user_credentials=op.user_creds("signed", op.app, op.signer))
    other = await _connect(url, user_credentials=op.user_creds("other", op.other))
    scoped_errors: list[str] = []
    scoped = await _connect(url, scoped_errors, user_credentials=op.user_creds("scoped", op.app, op.scoped))
    try:
        js = direct.jetstream(timeout=10)
        await js.add_stream(name="ORDERS", subjects=["orders.*"])
        await other.jetstream(timeout=10).add_stream(name="ORDERS", subjects=["orders.*"])
        for i in range(3):
            await js.publish("orders.us", b"#%d" % i)
        assert (await signed.jetstream(timeout=10).stream_info("ORDERS")).state.messages == 3, "same account, signing key"
        assert (await other.jetstream(timeout=10).stream_info("ORDERS")).state.messages == 0, "another account"
        jscoped = scoped.jetstream(timeout=10)
        assert (await jscoped.stream_info("ORDERS")).state.messages == 3
        denied = asyncio.ensure_future(jscoped.add_stream(name="NOPE", subjects=["nope"]))
        deadline = asyncio.get_running_loop().time() + 10
        while not scoped_errors and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        denied.cancel()
        assert any('publish to "$js.api.stream.create.nope"' in e.lower() for e in scoped_errors), "the scope's template applies"
    finally:
        for nc in (direct, signed, other, scoped):
            await nc.close()
    await _refused(url, user_credentials=op.user_creds("revoked", op.app))
    await _refused(url, user_credentials=op.user_creds("stranger", Key.new("A")))  # an account nobody preloaded
    await _refused(url, nkeys_seed_str=op.users["direct"].seed.decode())  # an nkey without its JWT
    # a user JWT's exp ends its connection when it comes
    expiring_errors: list[str] = []
    expiring = await _connect(url, expiring_errors, user_credentials=op.user_creds("expiring", op.app, expires=int(time.time()) + 2))
    try:
        deadline = asyncio.get_running_loop().time() + 15
        while not expiring.is_closed and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        reason = " ".join(expiring_errors + [str(expiring.last_error)]).lower()
        assert expiring.is_closed and "user authentication expired" in reason, reason
    finally:
        await expiring.close()
    # a scoped key's users take the template's permissions: a JWT with its own is refused (jwt ValidateScopedSigner)
    await _refused(url, user_credentials=op.user_creds("scoped", op.app, op.scoped, pub={"allow": [">"]}))


@pytest.mark.parametrize("target", ["jetlake", "nats-server"])
def test_operator_mode_jwt_users(tmp_path: Path, target: str) -> None:
    op = Operator(tmp_path)
    if target == "jetlake":
        server: Any = Gateway(tmp_path / "warehouse", "--config", str(op.config(tmp_path / "warehouse"))).start(timeout=60)
        url = server.nats_url
    else:
        server = NatsServer(tmp_path / "ns", op.config(tmp_path / "ns"))
        url = server.url
    try:
        asyncio.run(asyncio.wait_for(_operator_scenario(url, op), 90))
    finally:
        server.stop()


def test_cli_with_creds_and_nkey(tmp_path: Path, nats_cli: tuple[str, dict[str, str]]) -> None:
    exe, env = nats_cli
    op = Operator(tmp_path)
    gateway = Gateway(tmp_path / "warehouse", "--config", str(op.config(tmp_path / "warehouse"))).start(timeout=60)
    try:
        user = ["--server", gateway.nats_url, "--creds", op.user_creds("direct", op.app)]

        def nats_cmd(*args: str) -> str:
            done = subprocess.run([exe, *user, *args], env=env, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr
            return done.stdout

        nats_cmd("stream", "add", "ORDERS", "--subjects", "orders.*", "--defaults")
        nats_cmd("pub", "orders.us", "--count=5", "US Order #{{Count}}")
        assert json.loads(nats_cmd("stream", "info", "ORDERS", "--json"))["state"]["messages"] == 5
        scoped = ["--server", gateway.nats_url, "--creds", op.user_creds("scoped", op.app, op.scoped)]
        refused = subprocess.run([exe, *scoped, "stream", "add", "X", "--subjects", "x", "--defaults"], env=env,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
    finally:
        gateway.stop()
    user_key = Key.new("U")
    seed_file = tmp_path / "user.nk"
    seed_file.write_bytes(user_key.seed)
    gateway = Gateway(tmp_path / "warehouse2", "--config", str(_nkey_config(tmp_path, tmp_path / "warehouse2", user_key))).start(timeout=60)
    try:
        done = subprocess.run([exe, "--server", gateway.nats_url, "--nkey", str(seed_file), "stream", "add", "K",
                               "--subjects", "k.*", "--defaults"], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    finally:
        gateway.stop()


def test_unsupported_operator_settings_are_refused(tmp_path: Path) -> None:
    op = Operator(tmp_path)
    with pytest.raises(ConfigError, match="only the MEMORY resolver"):
        loads(op.config(tmp_path / "s", resolver='URL("http://127.0.0.1:9090/jwt/v1/accounts/")').read_text())
    text = op.config(tmp_path / "s").read_text()
    with pytest.raises(ConfigError, match="operators do not allow 'accounts'"):
        loads(text + "accounts { X { users: [ {user: x, password: y} ] } }\n")
    with_import = issue(op.app.public, op.operator, "account", {"limits": JETSTREAM_LIMITS, "imports": [{"subject": "x", "account": op.other.public, "type": "stream"}]})
    with pytest.raises(ConfigError, match="imports are not supported"):
        loads(text.replace(op.jwts[op.app.public], with_import))
    config = loads(text)
    app = config.jwt_accounts[op.app.public]
    assert config.operator_mode and config.auth_required and app.jetstream is not None
    assert config.accounts[op.system.public].jetstream is None and config.system_account == op.system.public
