"""NATS JWTs (v2): operator, account and user claims, their signatures and what JetLake takes of them.

A JWT is `header.payload.signature`, each unpadded base64url; the header is
`{"typ":"JWT","alg":"ed25519-nkey"}` and the signature is ed25519 by the nkey in `iss` over
`header.payload`. Claims are `jti iat iss sub name exp nbf` plus `nats{type, ...}`. JetLake reads:

- operator: `signing_keys`, `system_account`;
- account: `limits` (JetStream's `mem_storage`, `disk_storage`, `streams`, `consumer`,
  `max_ack_pending`, `mem_max_stream_bytes`, `disk_max_stream_bytes`, `max_bytes_required`; the
  core limits only at their unlimited default), or `tiered_limits` with the one tier `R1`;
  `signing_keys` (plain, or scoped `{kind: "user_scope", key, template}`), `revocations`,
  `default_permissions`, `disallow_bearer`;
- user: `pub`, `sub`, `resp`, `bearer_token`, `allowed_connection_types`, `issuer_account`, `src`.

A claim JetLake cannot honour is refused with a reason (`JwtError`), never accepted and ignored:
v1 JWTs, account imports, exports and mappings (but on the system account), core limits other than
unlimited, several JetStream tiers, and a user's `times` or `locale` or a limit of its own.
Counterpart: nats-io/jwt v2 (`Decode`, `OperatorClaims`, `AccountClaims`, `UserClaims`,
`ValidateUser`) and server/jwt.go, server/accounts.go (`updateAccountClaimsWithRefresh`).
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from engine.accounts import nkeys
from engine.accounts.limits import UNLIMITED, AccountLimits
from engine.accounts.permissions import Permissions, ResponsePermission, SubjectPermission, SubjectRule

ALGORITHM = "ed25519-nkey"
NS = 1_000_000_000
_CORE_LIMITS = ("subs", "data", "payload", "imports", "exports", "conn", "leaf")
_ACCOUNT_UNSUPPORTED = ("imports", "exports", "mappings")


class JwtError(ValueError):
    """A JWT that is malformed, badly signed, expired, or asks for something JetLake does not do."""


@dataclass(frozen=True)
class Claims:
    """A verified JWT's standard claims and its `nats` section."""

    subject: str
    issuer: str
    name: str
    issued_at: int
    expires: int
    not_before: int
    nats: dict[str, Any] = field(repr=False)

    @property
    def kind(self) -> str:
        return str(self.nats.get("type", ""))


@dataclass(frozen=True)
class Operator:
    key: str
    signing_keys: frozenset[str]
    system_account: str | None

    def signs(self, key: str) -> bool:
        return key == self.key or key in self.signing_keys


@dataclass(frozen=True)
class UserScope:
    """A scoped signing key: users it signs get the template's permissions, not their own."""

    permissions: Permissions | None


@dataclass(frozen=True)
class Account:
    """An account JWT as JetLake applies it."""

    key: str
    name: str
    issuer: str
    jetstream: AccountLimits | None  # None: JetStream off (no storage in the JWT)
    signing_keys: dict[str, UserScope | None]  # None: an unscoped key
    revocations: dict[str, int]
    default_permissions: Permissions | None
    disallow_bearer: bool
    expires: int

    def revoked(self, user: str, issued_at: int) -> bool:
        """accounts.go `checkUserRevoked`: revoked if the user's JWT was issued at or before the time given."""
        for key in (user, "*"):
            at = self.revocations.get(key)
            if at is not None and issued_at <= at:
                return True
        return False


def decode(token: str, now: float | None = None) -> Claims:
    """A JWT's claims once its signature by `iss` and its validity times are checked."""
    parts = token.strip().split(".")
    if len(parts) != 3:
        raise JwtError("expected 3 chunks")
    header = _json(parts[0])
    if header.get("typ", "").upper() != "JWT":
        raise JwtError("not a JWT")
    if header.get("alg") != ALGORITHM:
        raise JwtError(f"JWT algorithm {header.get('alg')!r} is not supported (v1 JWTs are not: reissue them as v2)")
    payload = _json(parts[1])
    issuer = payload.get("iss")
    try:
        signature = _b64(parts[2])
    except JwtError:
        raise JwtError("JWT signature is not base64url") from None
    if not isinstance(issuer, str) or not nkeys.verify(issuer, f"{parts[0]}.{parts[1]}".encode(), signature):
        raise JwtError("JWT signature does not verify")
    nats = payload.get("nats")
    if not isinstance(nats, dict):
        raise JwtError("JWT has no nats claims")
    claims = Claims(
        subject=str(payload.get("sub", "")), issuer=issuer, name=str(payload.get("name", "")),
        issued_at=_int(payload, "iat"), expires=_int(payload, "exp"), not_before=_int(payload, "nbf"), nats=nats,
    )
    now = time.time() if now is None else now
    if claims.expires and claims.expires < now:
        raise JwtError("JWT has expired")
    if claims.not_before and claims.not_before > now:
        raise JwtError("JWT is not valid yet")
    return claims


def decorated(text: str) -> str:
    """The JWT of a `.creds`-style decorated block (`-----BEGIN NATS ... JWT-----`), or the text itself."""
    lines = [line.strip() for line in text.strip().splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("-----BEGIN") and "JWT" in line and i + 1 < len(lines):
            return lines[i + 1]
    return text.strip()


def operator(token: str) -> Operator:
    claims = decode(token)
    if claims.kind != "operator" or not nkeys.is_public(claims.subject, "O"):
        raise JwtError("not an operator JWT")
    keys = claims.nats.get("signing_keys") or []
    if not all(nkeys.is_public(k, "O") for k in keys):
        raise JwtError("operator signing keys must be operator nkeys")
    if claims.issuer != claims.subject and claims.issuer not in keys:
        raise JwtError("operator JWT is not self-signed")
    system = claims.nats.get("system_account") or None
    return Operator(claims.subject, frozenset(keys), system)


def account(token: str, trusted: list[Operator] | None, trusted_keys: frozenset[str], system: bool = False) -> Account:
    """An account JWT signed by a trusted operator (or trusted key), as JetLake applies it."""
    claims = decode(token)
    if claims.kind != "account" or not nkeys.is_public(claims.subject, "A"):
        raise JwtError("not an account JWT")
    if not any(o.signs(claims.issuer) for o in trusted or ()) and claims.issuer not in trusted_keys:
        raise JwtError(f"account {claims.subject} is not signed by a trusted operator")
    nats = claims.nats
    for key in _ACCOUNT_UNSUPPORTED:
        if nats.get(key) and not system:
            raise JwtError(f"account {claims.name or claims.subject}: {key} are not supported by JetLake")
    return Account(
        key=claims.subject,
        name=claims.name or claims.subject,
        issuer=claims.issuer,
        jetstream=_jetstream_limits(nats, claims.subject),
        signing_keys=_signing_keys(nats.get("signing_keys") or []),
        revocations={str(k): int(v) for k, v in (nats.get("revocations") or {}).items()},
        default_permissions=permissions(nats.get("default_permissions") or {}),
        disallow_bearer=bool((nats.get("limits") or {}).get("disallow_bearer", False)),
        expires=claims.expires,
    )


def user(token: str) -> Claims:
    """A user JWT's verified claims (which account and key may sign it is the authenticator's check)."""
    claims = decode(token)
    if claims.kind != "user" or not nkeys.is_public(claims.subject, "U"):
        raise JwtError("not a user JWT")
    for key in ("times", "times_location", "locale"):
        if claims.nats.get(key):
            raise JwtError(f"user JWT claim {key!r} is not supported by JetLake")
    return claims


def check_user_limits(nats: dict[str, Any]) -> None:
    """A user's own `subs`, `data`, `payload`: JetLake enforces none, so only unlimited (-1) is accepted."""
    for key in ("subs", "data", "payload"):
        if nats.get(key, UNLIMITED) != UNLIMITED:
            raise JwtError(f"user JWT limit {key!r} is not supported by JetLake (only -1, unlimited)")


def permissions(nats: dict[str, Any]) -> Permissions | None:
    """`pub`/`sub` `{allow, deny}` and `resp {max, ttl ns}`; None when the JWT sets none of them."""
    pub, sub, resp = nats.get("pub") or {}, nats.get("sub") or {}, nats.get("resp")
    if not pub and not sub and not resp:
        return None
    response = None
    if resp:
        ttl = int(resp.get("ttl", 0))
        response = ResponsePermission(int(resp.get("max", 0)) or ResponsePermission.max_msgs, ttl / NS if ttl else ResponsePermission.expires)
    return Permissions(_subject_permission(pub, False), _subject_permission(sub, True), response)


def has_empty_permissions(nats: dict[str, Any]) -> bool:
    """jwt's `HasEmptyPermissions`: a user signed by a scoped key carries no permissions, limits or
    flags of its own (the zero value: limits absent or 0, not -1)."""
    keys = ("pub", "sub", "resp", "src", "times", "bearer_token", "allowed_connection_types", "subs", "data", "payload")
    return not any(nats.get(key) for key in keys)


def _subject_permission(raw: dict[str, Any], queue: bool) -> SubjectPermission | None:
    allow, deny = raw.get("allow"), raw.get("deny")
    if not allow and not deny:
        return None
    try:
        return SubjectPermission(
            tuple(SubjectRule.parse(s, queue) for s in allow) if allow else None,
            tuple(SubjectRule.parse(s, queue) for s in deny) if deny else None,
        )
    except ValueError as exc:
        raise JwtError(str(exc)) from None


def _jetstream_limits(nats: dict[str, Any], key: str) -> AccountLimits | None:
    limits = nats.get("limits") or {}
    tiers = nats.get("tiered_limits") or {}
    for name in _CORE_LIMITS:
        if limits.get(name, UNLIMITED) != UNLIMITED:
            raise JwtError(f"account {key}: limit {name!r} is not supported by JetLake (only -1, unlimited)")
    if tiers:
        if set(tiers) != {"R1"}:
            raise JwtError(f"account {key}: JetStream tiers {sorted(tiers)} are not supported (only R1)")
        limits = tiers["R1"]
    memory, disk = int(limits.get("mem_storage", 0)), int(limits.get("disk_storage", 0))
    if memory == 0 and disk == 0:
        return None  # accounts.go: JetStream is on iff one of the storages is not 0

    def count(name: str) -> int:
        value = int(limits.get(name, 0))
        return UNLIMITED if value == 0 else value  # 0 is unlimited for counts in a JWT

    return AccountLimits(
        max_memory=memory,
        max_storage=disk,
        max_streams=count("streams"),
        max_consumers=count("consumer"),
        max_ack_pending=count("max_ack_pending"),
        memory_max_stream_bytes=count("mem_max_stream_bytes"),
        storage_max_stream_bytes=count("disk_max_stream_bytes"),
        max_bytes_required=bool(limits.get("max_bytes_required", False)),
    )


def _signing_keys(raw: list[Any]) -> dict[str, UserScope | None]:
    keys: dict[str, UserScope | None] = {}
    for entry in raw:
        if isinstance(entry, str):
            keys[entry] = None
        elif isinstance(entry, dict) and entry.get("kind") == "user_scope":
            template = entry.get("template") or {}
            for unsupported in ("times", "times_location", "locale", "src"):
                if template.get(unsupported):
                    raise JwtError(f"scoped signing key template {unsupported!r} is not supported by JetLake")
            keys[str(entry.get("key"))] = UserScope(permissions(template))
        else:
            raise JwtError(f"unknown signing key entry {entry!r}")
    if not all(nkeys.is_public(k, "A") for k in keys):
        raise JwtError("account signing keys must be account nkeys")
    return keys


def _json(part: str) -> dict[str, Any]:
    try:
        value = orjson.loads(_b64(part))
    except orjson.JSONDecodeError:
        raise JwtError("JWT part is not JSON") from None
    if not isinstance(value, dict):
        raise JwtError("JWT part is not a JSON object")
    return value


def _b64(part: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise JwtError("JWT part is not base64url") from None


def _int(payload: dict[str, Any], key: str) -> int:
    value = payload.get(key, 0)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
