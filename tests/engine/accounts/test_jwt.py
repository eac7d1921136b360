"""NATS JWTs as engine/accounts/jwt.py reads them: signatures, validity, limits, and what is refused."""

from __future__ import annotations

import time

import pytest

from engine.accounts import jwt, nkeys
from engine.accounts.limits import UNLIMITED
from tests.nats.jwts import JETSTREAM_LIMITS, Key, issue


def test_an_account_jwt_signed_by_the_operator_gives_its_jetstream_limits() -> None:
    op, acc = Key.new("O"), Key.new("A")
    operator = jwt.operator(issue(op.public, op, "operator", {}))
    limits = {**JETSTREAM_LIMITS, "mem_storage": 1 << 20, "disk_storage": 1 << 30, "streams": 5, "consumer": 0}
    account = jwt.account(issue(acc.public, op, "account", {"limits": limits}, "APP"), [operator], frozenset())
    assert account.name == "APP" and account.jetstream is not None
    assert (account.jetstream.max_memory, account.jetstream.max_storage, account.jetstream.max_streams) == (1 << 20, 1 << 30, 5)
    assert account.jetstream.max_consumers == UNLIMITED  # 0 is unlimited for counts in a JWT
    tiered = issue(acc.public, op, "account", {"tiered_limits": {"R1": {"disk_storage": 10, "streams": 1}}})
    assert jwt.account(tiered, [operator], frozenset()).jetstream.max_storage == 10  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("nats", "reason"),
    [
        ({"limits": {**JETSTREAM_LIMITS, "conn": 10}}, "limit 'conn' is not supported"),
        ({"tiered_limits": {"R1": {"disk_storage": 1}, "R3": {"disk_storage": 1}}}, "tiers"),
        ({"limits": JETSTREAM_LIMITS, "exports": [{"subject": "x", "type": "stream"}]}, "exports are not supported"),
    ],
)
def test_what_jetlake_cannot_honour_is_refused(nats: dict[str, object], reason: str) -> None:
    op, acc = Key.new("O"), Key.new("A")
    with pytest.raises(jwt.JwtError, match=reason):
        jwt.account(issue(acc.public, op, "account", nats), [jwt.operator(issue(op.public, op, "operator", {}))], frozenset())


def test_bad_signatures_issuers_and_times_are_refused() -> None:
    op, other, acc = Key.new("O"), Key.new("O"), Key.new("A")
    operator = jwt.operator(issue(op.public, op, "operator", {}))
    token = issue(acc.public, op, "account", {"limits": JETSTREAM_LIMITS})
    header, payload, signature = token.split(".")
    tampered = f"{header}.{payload[:-2]}AA.{signature}"
    with pytest.raises(jwt.JwtError):
        jwt.account(tampered, [operator], frozenset())
    with pytest.raises(jwt.JwtError, match="not signed by a trusted operator"):
        jwt.account(issue(acc.public, other, "account", {}), [operator], frozenset())
    with pytest.raises(jwt.JwtError, match="expired"):
        jwt.decode(issue(acc.public, op, "account", {}, exp=int(time.time()) - 10))
    v1 = token.replace(header, "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5In0")  # {"typ":"JWT","alg":"ed25519"}
    with pytest.raises(jwt.JwtError, match="v1 JWTs are not"):
        jwt.decode(v1)


def test_nkeys_verify_only_their_own_signatures() -> None:
    user = Key.new("U")
    signature = user.sign(b"nonce")
    assert nkeys.verify(user.public, b"nonce", signature)
    assert not nkeys.verify(user.public, b"other", signature)
    assert not nkeys.verify(Key.new("U").public, b"nonce", signature)
    assert not nkeys.is_public(user.public[:-1] + ("A" if user.public[-1] != "A" else "B"), "U")  # checksum
