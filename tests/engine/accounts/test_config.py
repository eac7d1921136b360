"""The keys of nats-server's config that JetLake reads: accounts, users, permissions, limits, TLS, JetStream."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.accounts.config import GLOBAL_ACCOUNT, ConfigError, ServerConfig, load, loads
from engine.accounts.limits import UNLIMITED_LIMITS, AccountLimits

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "jetlake.conf"

# nats-security.md §9: nats-server's structure and key names as pure JSON.
JSON_CONFIG = """{
  "listen": "127.0.0.1:4223",
  "system_account": "SYS",
  "accounts": {
    "SYS": { "users": [ { "user": "sys", "password": "sysp" } ] },
    "ORDERS": {
      "jetstream": { "max_mem": 268435456, "max_file": 10737418240, "max_streams": 10,
                     "max_consumers": 50, "max_ack_pending": 10000,
                     "max_bytes_required": true, "store_max_stream_bytes": 1073741824 },
      "limits": { "max_connections": 200, "max_subscriptions": 10000 },
      "default_permissions": { "publish": { "deny": ">" }, "subscribe": { "deny": ">" } },
      "users": [
        { "user": "orders_admin", "password": "adminp", "permissions": { "publish": ">", "subscribe": ">" } },
        { "user": "producer", "password": "$2a$11$yBIPIfim4WItt6jENep.jeoFy4/mESOdTDAa2UzuPLK7gO9LDbrSO",
          "permissions": { "publish": { "allow": ["orders.>"] }, "subscribe": { "allow": ["_INBOX.>"] } } },
        { "user": "parked", "password": "parkedp" }
      ],
      "exports": [ { "stream": "orders.events.>", "accounts": ["ANALYTICS"] } ]
    },
    "ANALYTICS": { "jetstream": "enabled", "users": [ { "user": "analyst", "password": "analystp" } ] }
  }
}"""


def test_the_example_config_loads() -> None:
    config = load(EXAMPLE, {"SALES_ADMIN_PASSWORD": "admin-secret"})
    assert config.system_account == "SYS" and config.auth_required
    assert config.jetstream_accounts() == ["ANALYTICS", "SALES"]
    assert config.accounts["SALES"].jetstream == AccountLimits(
        max_memory=256 * 2**20, max_storage=10 * 2**30, max_streams=20, max_consumers=50, max_ack_pending=10000
    )
    assert config.accounts["ANALYTICS"].jetstream == UNLIMITED_LIMITS
    assert config.accounts[GLOBAL_ACCOUNT].jetstream is None  # other accounts exist: $G has no JetStream
    users = {u.name: u for u in config.users}
    assert users["sales_admin"].password == "admin-secret" and users["producer"].token.startswith("$2a$10$")
    reader = users["reader"].permissions
    assert reader is not None and reader.can_publish("$JS.ACK.ORDERS.reader.1.2.3.4.5") and not reader.can_publish("orders.eu")
    assert users["analyst"].permissions is None and users["operator"].account == "SYS"


def test_json_with_nats_servers_structure_loads() -> None:
    config = loads(JSON_CONFIG)
    limits = config.accounts["ORDERS"].jetstream
    assert limits is not None and limits.max_bytes_required and limits.storage_max_stream_bytes == 2**30
    parked = config.user("parked")
    assert parked is not None and parked.permissions is not None and not parked.permissions.can_publish("orders.eu")
    assert any("'exports'" in w for w in config.warnings)


def test_no_config_is_one_open_account() -> None:
    config = ServerConfig.open()
    assert not config.auth_required and config.jetstream_accounts() == [GLOBAL_ACCOUNT]


def test_authorization_users_join_the_global_account_which_then_has_jetstream() -> None:
    config = loads("authorization { users: [ {user: a, password: b} ], default_permissions: { publish: orders.> } }")
    assert config.jetstream_accounts() == [GLOBAL_ACCOUNT]
    user = config.user("a")
    assert user is not None and user.account == GLOBAL_ACCOUNT
    assert user.permissions is not None and user.permissions.can_publish("orders.x") and not user.permissions.can_publish("x")


def test_keys_are_case_insensitive_and_account_names_are_not() -> None:
    config = loads("ACCOUNTS { Sales { JetStream: Enabled, USERS: [ {USER: a, PASSWORD: b} ] } }")
    assert config.jetstream_accounts() == ["Sales"]


def test_allow_responses_turns_the_blanket_publish_allow_off() -> None:
    user = loads("authorization { users: [ {user: a, permissions: { allow_responses: {max: 2, expires: '1m'} } } ] }").user("a")
    assert user is not None and user.permissions is not None
    assert not user.permissions.can_publish("anything") and user.permissions.response is not None
    assert (user.permissions.response.max_msgs, user.permissions.response.expires) == (2, 60.0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: 4222\nbogus: 1\n", r"<config>:2:1: unknown field 'bogus'"),
        ("accounts { A { users: [ {user: a, passwd: x} ] } }", r"unknown field 'passwd' parsing a user entry"),
        ("accounts { A { jetstream { max_file: '10G' } } }", r"expected a parseable size for 'max_file', got a string"),
        ("accounts { A { jetstream { R1: {} } } }", r"unknown field 'r1'"),
        ("accounts { A { jetstream: maybe } }", r"Expected 'enabled' or 'disabled'"),
        ("accounts { A { users: [ {user: a, permissions: { publish: 'a b' } } ] } }", r"'a b' is not a valid subject"),
        ("accounts { A { users: [ {user: a, permissions: { publish: { allowed: x } } } ] } }", r"only 'allow' or 'deny'"),
        ("authorization { users: [ {user: a, token: 12345} ] }", r"'token' must be a string, got an integer"),
        ("authorization { user: a, password: b, token: c }", r"single user/pass and a token"),
        ("authorization { token: '' }", r"'token' is empty"),
        ("authorization { token: c }\naccounts { A { users: [ {user: a} ] } }", r"token and accounts"),
        ("accounts { A { users: [ {user: a} ] }, B { users: [ {user: a} ] } }", r"Duplicate user 'a'"),
        ("accounts { A { users: [ {password: a} ] } }", r"User entry requires a user"),
        ("no_auth_user: ghost\naccounts { A { users: [ {user: a} ] } }", r"no_auth_user: 'ghost' not present"),
        ("system_account: S\naccounts { S { jetstream: enabled } }", r"jetstream can not be enabled on the system account"),
        ("system_account: NOPE", r"system account 'NOPE' is not defined"),
        ('accounts { "$G" { } }', r'"\$G" is a Reserved Account'),
        ('accounts { "a/b" { } }', r"cannot name a warehouse folder"),
        ("accounts { abc { }, ABC { } }", r"differ only in case"),
        ("tls { cert_file: a.pem }", r"missing 'cert_file' or 'key_file'"),
        ("tls { cert_file: a, key_file: b, verfiy: true }", r"unknown field 'verfiy' parsing tls"),
        ("jetstream { max_file_store: '20GB' }", r"must be digits ending in K, M, G, T"),
        ("jetstream: disabled", r"cannot disable"),
        ("operator: './op.jwt'", r"error parsing operator JWT: .*No such file"),
        ("resolver: MEMORY", r"resolver without an operator"),
        ("authorization { users: [ {user: a, allowed_connection_types: [TELNET]} ] }", r"unknown connection type 'TELNET'"),
    ],
)
def test_a_bad_config_names_the_place_and_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        loads(text)


def test_a_bad_file_names_its_path_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.conf"
    path.write_text("accounts {\n  A {\n    jetstream: enabled\n    userz: []\n  }\n}\n")
    with pytest.raises(ConfigError, match=rf"{path}:4:5: unknown field 'userz'"):
        load(path)


def test_unused_variables_are_unknown_keys_and_used_ones_are_not() -> None:
    assert loads("PW: secret\nauthorization { users: [ {user: a, password: $PW} ] }").user("a").password == "secret"  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="unknown field 'UNUSED'"):
        loads("UNUSED: 1\nauthorization { users: [ {user: a} ] }")


def test_the_server_jetstream_block_keeps_the_warehouse_and_the_key() -> None:
    config = loads("jetstream { store_dir: /data/lake, max_file_store: '20G', max_mem: 1GiB, cipher: aes, key: $K, sync: always }", {"K": "'s3cret'"})
    js = config.jetstream
    assert (js.store_dir, js.max_file_store, js.max_memory_store, js.cipher, js.key, js.sync_always) == (
        "/data/lake", 20 * 2**30, 2**30, "aes", "s3cret", True,
    )
    assert "s3cret" not in repr(config)
