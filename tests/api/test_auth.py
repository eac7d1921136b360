"""Authentication as nats-server's auth.go: users, tokens, bcrypt, no_auth_user, certificates, reload."""

from __future__ import annotations

import bcrypt
import pytest

from api.auth import AuthError, Authenticator, CertIdentity, parse_dn
from engine.accounts.config import GLOBAL_ACCOUNT, ServerConfig, loads


def hashed(secret: str) -> str:
    return bcrypt.hashpw(secret.encode(), bcrypt.gensalt(4, prefix=b"2a")).decode()


CONFIG = f"""
system_account: SYS
no_auth_user: guest
accounts {{
  SYS {{ users: [ {{ user: op, password: op-pw }} ] }}
  A {{
    jetstream: enabled
    users: [
      {{ user: alice, password: alice-pw }}
      {{ user: hashed, password: "{hashed('hashed-pw')}" }}
      {{ user: ci, token: ci-token }}
      {{ user: ci2, token: "{hashed('ci2-token')}" }}
      {{ user: both, password: both-pw, token: both-token }}
      {{ user: guest, permissions: {{ publish: {{ deny: ">" }} }} }}
      {{ user: natsonly, password: n, allowed_connection_types: [STANDARD] }}
      {{ user: httponly, password: h, allowed_connection_types: [HTTP] }}
    ]
  }}
}}
"""


@pytest.fixture
def auth() -> Authenticator:
    return Authenticator(loads(CONFIG))


def test_no_config_lets_everyone_into_the_default_account_with_every_right() -> None:
    auth = Authenticator(ServerConfig.open())
    principal = auth.authenticate(user="whoever", password="whatever")
    assert not auth.required and principal.account == GLOBAL_ACCOUNT and principal.user is None
    assert principal.permissions is None and principal.system and principal.can_publish("$JS.API.STREAM.DELETE.X")


def test_users_and_passwords_plain_and_bcrypt(auth: Authenticator) -> None:
    assert auth.authenticate(user="alice", password="alice-pw").account == "A"
    assert auth.authenticate(user="hashed", password="hashed-pw").user == "hashed"
    assert auth.authenticate(user="op", password="op-pw").system
    for user, password in [("alice", "wrong"), ("alice", None), ("nobody", "alice-pw"), ("hashed", hashed("hashed-pw"))]:
        with pytest.raises(AuthError):
            auth.authenticate(user=user, password=password)


def test_tokens_find_their_user(auth: Authenticator) -> None:
    assert auth.authenticate(token="ci-token").user == "ci"
    assert auth.authenticate(token="ci2-token").user == "ci2"
    assert auth.authenticate(token="both-token").user == "both"
    assert auth.authenticate(user="both", password="both-pw").user == "both"
    for kwargs in ({"token": "nope"}, {"user": "ci"}, {"user": "ci", "password": ""}, {"user": "both", "token": "ci-token"}):
        with pytest.raises(AuthError):
            auth.authenticate(**kwargs)  # type: ignore[arg-type]


def test_an_empty_request_is_the_no_auth_user(auth: Authenticator) -> None:
    guest = auth.authenticate()
    assert guest.user == "guest" and not guest.can_publish("orders.x")


def test_a_bcrypt_no_auth_user_never_authenticates() -> None:
    config = loads(f"no_auth_user: g\naccounts {{ A {{ users: [ {{user: g, password: \"{hashed('x')}\"}} ] }} }}")
    with pytest.raises(AuthError):
        Authenticator(config).authenticate()


def test_connection_types(auth: Authenticator) -> None:
    assert auth.authenticate(user="natsonly", password="n").user == "natsonly"
    with pytest.raises(AuthError):
        auth.authenticate(user="natsonly", password="n", connection_type="HTTP")
    assert auth.authenticate(user="httponly", password="h", connection_type="HTTP").user == "httponly"
    with pytest.raises(AuthError):
        auth.authenticate(user="httponly", password="h")


def test_the_single_token_of_authorization() -> None:
    auth = Authenticator(loads("authorization { token: s3cret }"))
    assert auth.authenticate(token="s3cret").account == GLOBAL_ACCOUNT
    with pytest.raises(AuthError):
        auth.authenticate(token="s3cre")


def test_reload_refuses_a_removed_user_at_once(auth: Authenticator) -> None:
    assert auth.authenticate(user="alice", password="alice-pw").user == "alice"
    auth.reload(loads(CONFIG.replace("{ user: alice, password: alice-pw }", "")))
    with pytest.raises(AuthError):
        auth.authenticate(user="alice", password="alice-pw")


MAPPED = """
tls { cert_file: s.pem, key_file: s.key, ca_file: ca.pem, verify_and_map: true }
accounts { A { jetstream: enabled, users: [
  { user: "O=Acme,CN=alice" }
  { user: "bob@example.com" }
  { user: "CN=carol", password: carol-pw }
  { user: "svc.example.com" }
] } }
"""


def test_certificates_name_users_by_san_then_by_dn_in_any_order() -> None:
    auth = Authenticator(loads(MAPPED))
    alice = CertIdentity(rdns=((("CN", "alice"),), (("O", "Acme"),)))
    assert auth.authenticate(tls_identity=alice).user == "O=Acme,CN=alice"
    reordered = CertIdentity(rdns=((("O", "Acme"),), (("CN", "alice"),)))
    assert auth.authenticate(tls_identity=reordered).user == "O=Acme,CN=alice"
    assert auth.authenticate(tls_identity=CertIdentity(emails=("bob@example.com",), rdns=((("CN", "bob"),),))).user == "bob@example.com"
    assert auth.authenticate(tls_identity=CertIdentity(dns_names=("svc.example.com",))).user == "svc.example.com"
    assert auth.authenticate(tls_subject="CN=alice,O=Acme").user == "O=Acme,CN=alice"
    with pytest.raises(AuthError):
        auth.authenticate(tls_identity=CertIdentity(rdns=((("CN", "mallory"),),)))
    with pytest.raises(AuthError):
        auth.authenticate(user="O=Acme,CN=alice")  # the certificate names the user, not the request


def test_a_mapped_users_password_is_still_checked() -> None:
    auth = Authenticator(loads(MAPPED))
    carol = CertIdentity(rdns=((("CN", "carol"),),))
    assert auth.authenticate(tls_identity=carol, password="carol-pw").user == "CN=carol"
    with pytest.raises(AuthError):
        auth.authenticate(tls_identity=carol)
    alice = CertIdentity(rdns=((("CN", "alice"),), (("O", "Acme"),)))
    with pytest.raises(AuthError):
        auth.authenticate(tls_identity=alice, password="anything")  # a password sent to a password-less user fails


def test_distinguished_names() -> None:
    assert parse_dn("CN=a\\,b, O=Acme+OU=x") == [frozenset({("CN", "a,b")}), frozenset({("O", "Acme"), ("OU", "x")})]
    assert parse_dn("not a dn") is None
    peer = {"subject": ((("commonName", "alice"),), (("organizationName", "Acme"),)), "subjectAltName": (("DNS", "a.example"), ("email", "a@x"))}
    identity = CertIdentity.from_peercert(peer)
    assert identity.dns_names == ("a.example",) and identity.emails == ("a@x",) and identity.rfc4514() == "O=Acme,CN=alice"
