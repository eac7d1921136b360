"""Who a client is and what it may do: the one authentication and permission check of both front doors.

The HTTP gateway (api/http/gate.py) and the NATS door hand this module the credentials a client presented
(user and password, a token, the subject of a verified client certificate) and get a `Principal`: the
account the client acts in and its permissions, checked as nats-server checks them
(engine/accounts/permissions.py). The order is nats-server's (auth.go
`processClientOrLeafAuthentication`): no authentication configured lets everyone into the global
account; under `verify_and_map` the user comes from the certificate (e-mail, DNS and URI SANs, then
the subject DN, its RDNs in any order) and its password, if it has one, must still match; otherwise
an empty request takes the `no_auth_user`, a user name is looked up and its password compared, and a
token finds the user carrying it (JetLake's extension for HTTP clients) or matches the single
`authorization { token }`. Stored secrets of the form `$2a$…` are bcrypt hashes (checked with
bcrypt); others are compared in constant time. A user with a token but no password cannot log in by
name alone. Nkey users (`users: [{nkey: U…}]`) and, in operator mode, users with a JWT prove who
they are by signing the nonce the NATS door sent in INFO (`sig`, ed25519 over the nonce's bytes);
a user JWT must be issued by a preloaded account (or one of its signing keys, a scoped key giving
its template's permissions), not be revoked, and its `src` must admit the client's address; a
bearer JWT needs no signature unless the account disallows bearers. Failures are logged with
nats-server's reasons and answered as `Authorization Violation`. Results are cached per credentials
(bcrypt costs a fifth of a second; signed nonces differ per connection and are not cached), per
config: a reload (`reload`) swaps the whole state, so a removed user is refused from the next request.
Counterpart: server/auth.go.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import bcrypt

from engine.accounts import jwt, nkeys
from engine.accounts.config import GLOBAL_ACCOUNT, ServerConfig, User, is_bcrypt
from engine.accounts.permissions import Permissions

log = logging.getLogger(__name__)

AUTH_VIOLATION = "Authorization Violation"
BCRYPT_MAX = 72  # bytes of a password bcrypt reads (Go's bcrypt ignores the rest too)
CACHE_LIMIT = 10_000
_MISSING = object()
_SHORT_NAMES = {
    "commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
    "streetAddress": "STREET", "organizationName": "O", "organizationalUnitName": "OU", "postalCode": "POSTALCODE",
    "serialNumber": "SERIALNUMBER", "domainComponent": "DC", "userId": "UID", "emailAddress": "EMAILADDRESS",
}  # fmt: skip


@dataclass(frozen=True)
class Principal:
    """An authenticated client: its account, its user (None: anonymous) and its permissions (None: all)."""

    account: str
    user: str | None
    permissions: Permissions | None
    system: bool = False  # may use the system account's routes
    expires: int = 0  # Unix seconds when its credentials (a user JWT's `exp`) run out; 0: never

    def can_publish(self, subject: str) -> bool:
        return self.permissions is None or self.permissions.can_publish(subject)

    def can_subscribe(self, subject: str, queue: str | None = None) -> bool:
        return self.permissions is None or self.permissions.can_subscribe(subject, queue)

    def can_receive(self, subject: str, queue: str | None = None) -> bool:
        """Delivery to a wildcard or queue subscription that overlaps a subscribe deny entry."""
        return self.permissions is None or self.permissions.can_receive(subject, queue)


class AuthError(Exception):
    """Missing or bad credentials: HTTP 401, NATS `-ERR 'Authorization Violation'`."""

    def __init__(self, detail: str = AUTH_VIOLATION) -> None:
        super().__init__(detail)


@dataclass(frozen=True)
class CertIdentity:
    """What `verify_and_map` reads of a verified client certificate: SANs and the subject's RDNs."""

    emails: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    uris: tuple[str, ...] = ()
    rdns: tuple[tuple[tuple[str, str], ...], ...] = ()  # in certificate order, each RDN's (type, value)s

    @classmethod
    def from_peercert(cls, cert: dict[str, object]) -> CertIdentity:
        """From `ssl.SSLSocket.getpeercert()` (a verified peer's decoded certificate)."""
        sans = cert.get("subjectAltName") or ()
        by_kind: dict[str, list[str]] = {"email": [], "DNS": [], "URI": []}
        for kind, value in sans:  # type: ignore[attr-defined]
            if kind in by_kind:
                by_kind[kind].append(value)
        rdns = tuple(
            tuple((_SHORT_NAMES.get(name, name), value) for name, value in rdn)
            for rdn in cert.get("subject") or ()  # type: ignore[attr-defined]
        )
        return cls(tuple(by_kind["email"]), tuple(by_kind["DNS"]), tuple(by_kind["URI"]), rdns)

    @classmethod
    def from_subject(cls, subject: str) -> CertIdentity:
        """From a subject DN string (`CN=alice,O=Acme`), for a door that has only that."""
        dn = parse_dn(subject)
        return cls(rdns=tuple(reversed(dn)) if dn else ())

    def rfc4514(self, with_dcs: bool = True) -> str:
        rdns = [r for r in self.rdns if with_dcs or all(t != "DC" for t, _ in r)]
        return ",".join("+".join(f"{t}={_escape_dn(v)}" for t, v in rdn) for rdn in reversed(rdns))

    def names(self) -> Iterable[str]:
        """Literal user names to try, in nats-server's order (after SANs: the DN match, then these)."""
        yield from self.emails
        yield from self.dns_names
        yield from self.uris


def parse_dn(text: str) -> list[frozenset[tuple[str, str]]] | None:
    """An RFC 4514 DN as its RDNs (most significant last, as written); None if it is not one."""
    rdns: list[frozenset[tuple[str, str]]] = []
    for rdn_text in _split_unescaped(text, ","):
        pairs = set()
        for ava in _split_unescaped(rdn_text, "+"):
            name, sep, value = ava.partition("=")
            if not sep or not name.strip():
                return None
            pairs.add((name.strip().upper(), _unescape_dn(value.strip())))
        rdns.append(frozenset(pairs))
    return rdns or None


def _split_unescaped(text: str, sep: str) -> list[str]:
    parts, current, escaped = [], [], False
    for ch in text:
        if escaped:
            current.append("\\" + ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


def _unescape_dn(value: str) -> str:
    out, i = [], 0
    while i < len(value):
        if value[i] == "\\" and i + 1 < len(value):
            out.append(value[i + 1])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _escape_dn(value: str) -> str:
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    return out[:-1] + "\\ " if out.endswith(" ") else out


def secret_matches(stored: str, given: str) -> bool:
    """nats-server's comparePasswords: bcrypt for `$2a$`-style hashes, else constant time."""
    if is_bcrypt(stored):
        try:
            return bcrypt.checkpw(given.encode()[:BCRYPT_MAX], stored.encode())
        except ValueError:
            return False
    return hmac.compare_digest(stored.encode(), given.encode())


@dataclass
class _State:
    """One config's users, indexed; replaced whole on reload."""

    config: ServerConfig
    principals: dict[str, Principal]
    users: dict[str, User]
    nkey_users: dict[str, User]
    plain_tokens: dict[bytes, str]  # sha256(token) -> user name
    bcrypt_token_users: list[User]
    user_dns: list[tuple[frozenset[frozenset[tuple[str, str]]], list[frozenset[tuple[str, str]]], str]]
    anonymous: Principal
    required: bool
    cache: dict[tuple[object, ...], Principal | None] = field(default_factory=dict)


class Authenticator:
    """Turns presented credentials into a `Principal`, for one config at a time."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self._lock = threading.Lock()
        self._state = self._build(config or ServerConfig.open())
        self.generation = 0  # counts reloads: what callers remember of an earlier config is stale

    @property
    def config(self) -> ServerConfig:
        return self._state.config

    @property
    def required(self) -> bool:
        """False: no authentication configured (the gateway then serves loopback only)."""
        return self._state.required

    @property
    def nonce_required(self) -> bool:
        """Whether the NATS door must send a nonce in INFO: nkey and JWT users sign it."""
        return bool(self._state.nkey_users) or self._state.config.operator_mode

    @property
    def tls_map(self) -> bool:
        tls = self._state.config.tls
        return bool(tls and tls.verify_and_map)

    def reload(self, config: ServerConfig) -> None:
        self._state = self._build(config)
        self.generation += 1

    def _build(self, config: ServerConfig) -> _State:
        system = config.system_account
        open_server = not config.configured  # no config file: the loopback operator may do everything
        principals = {
            u.name: Principal(u.account, u.name, u.permissions, system=u.account == system) for u in config.users
        }
        plain_tokens = {
            hashlib.sha256(u.token.encode()).digest(): u.name for u in config.users if u.token is not None and not is_bcrypt(u.token)
        }
        user_dns = []
        for user in config.users:
            dn = parse_dn(user.name) if "=" in user.name else None
            if dn:
                user_dns.append((frozenset(dn), dn, user.name))
        return _State(
            config=config,
            principals=principals,
            users={u.name: u for u in config.users},
            nkey_users={u.nkey: u for u in config.users if u.nkey is not None},
            plain_tokens=plain_tokens,
            bcrypt_token_users=[u for u in config.users if u.token is not None and is_bcrypt(u.token)],
            user_dns=user_dns,
            anonymous=Principal(GLOBAL_ACCOUNT, None, None, system=open_server),
            required=config.auth_required,
        )

    def authenticate(
        self,
        *,
        user: str | None = None,
        password: str | None = None,
        token: str | None = None,
        tls_subject: str | None = None,
        tls_identity: CertIdentity | None = None,
        connection_type: str = "STANDARD",
        nkey: str | None = None,
        jwt: str | None = None,
        signature: str | None = None,
        nonce: str | None = None,
        client_ip: str | None = None,
    ) -> Principal:
        """The principal for these credentials; `AuthError` if they are missing or wrong.

        `tls_identity` (or `tls_subject`, a DN string) is the verified client certificate's; it names
        the user when the config maps certificates to users (`verify_and_map`). `connection_type` is
        matched against a user's `allowed_connection_types` (the HTTP door passes "HTTP"). `nkey` or
        `jwt` with `signature` are checked against the `nonce` the client was sent (the NATS door's).
        """
        state = self._state
        if not state.required:
            return state.anonymous
        if state.config.operator_mode or (nkey is not None and state.nkey_users):
            # auth.go: in operator mode only a user JWT logs in; else a CONNECT with an nkey is an nkey user
            try:
                if state.config.operator_mode:
                    return self._jwt_user(state, jwt, signature, nonce, connection_type, client_ip)
                return self._nkey_user(state, nkey or "", signature, nonce, connection_type)
            except AuthError as exc:
                log.info("authentication refused: %s", exc)
                raise AuthError() from None
        if tls_identity is None and tls_subject is not None:
            tls_identity = CertIdentity.from_subject(tls_subject)
        # Keyed by the credentials themselves: str hashes are keyed per process (SipHash), so a lookup
        # reveals nothing of a secret it does not already hold.
        key = (user, password, token, tls_identity, connection_type)
        found = state.cache.get(key, _MISSING)
        if found is not _MISSING:
            if found is None:
                raise AuthError()
            return found  # type: ignore[return-value]
        principal = self._check(state, user, password, token, tls_identity, connection_type)
        with self._lock:
            if len(state.cache) >= CACHE_LIMIT:
                state.cache.clear()
            state.cache[key] = principal
        if principal is None:
            raise AuthError()
        return principal

    def _check(
        self, state: _State, user: str | None, password: str | None, token: str | None,
        identity: CertIdentity | None, connection_type: str,
    ) -> Principal | None:
        config = state.config
        if not config.users:  # the single `authorization { token }`
            ok = token is not None and config.token is not None and secret_matches(config.token, token)
            return Principal(GLOBAL_ACCOUNT, None, None) if ok else None
        if self.tls_map:
            entry = self._user_from_cert(state, identity) if identity is not None else None
            if entry is None or not entry.allows(connection_type):
                return None
            return state.principals[entry.name] if self._secret_ok(entry, password, token) else None
        if user is None and password is None and token is None and config.no_auth_user is not None:
            entry = state.users.get(config.no_auth_user)
            # nats-server copies the stored password into the request: a bcrypt one never matches itself
            user, password = config.no_auth_user, entry.password if entry is not None else None
            if entry is not None and entry.password is None and entry.token is not None:
                return state.principals[entry.name] if entry.allows(connection_type) else None
        if user is not None:
            entry = state.users.get(user)
            if entry is None or not entry.allows(connection_type) or entry.nkey is not None:
                return None
            if entry.password is None and entry.token is not None and token is None:
                return None  # a token user logs in with its token, not by name alone
            return state.principals[entry.name] if self._secret_ok(entry, password, token) else None
        if token is not None:
            entry = self._user_from_token(state, token)
            if entry is None or not entry.allows(connection_type):
                return None
            return state.principals[entry.name]
        return None

    @staticmethod
    def _nkey_user(state: _State, nkey: str, signature: str | None, nonce: str | None, connection_type: str) -> Principal:
        entry = state.nkey_users.get(nkey)
        if entry is None or not entry.allows(connection_type):
            raise AuthError(f"nkey {nkey[:8]}…: no such user")
        _check_signature(nkey, signature, nonce)
        return state.principals[entry.name]

    def _jwt_user(
        self, state: _State, token: str | None, signature: str | None, nonce: str | None, connection_type: str,
        client_ip: str | None,
    ) -> Principal:
        """auth.go's user JWT path, in its order: claims, account, issuer, expiry, bearer, type, signature, revocation, src."""
        if not token:
            raise AuthError("operator mode: a user JWT is required")
        try:
            claims = jwt.user(token)
        except jwt.JwtError as exc:
            raise AuthError(f"user JWT not valid: {exc}") from None
        account_key = str(claims.nats.get("issuer_account") or claims.issuer)
        account = state.config.jwt_accounts.get(account_key)
        if account is None:
            raise AuthError(f"account {account_key} not found (not preloaded)")
        if claims.issuer != account.key and claims.issuer not in account.signing_keys:
            raise AuthError("user JWT issuer is not known")
        if claims.nats.get("issuer_account") and claims.issuer == account.key:
            raise AuthError("user JWT names an issuer account but is signed by the account itself")
        if account.expires and account.expires < time.time():
            raise AuthError(f"account {account.key} has expired")
        bearer = bool(claims.nats.get("bearer_token"))
        if bearer and account.disallow_bearer:
            raise AuthError("user JWT is a bearer token but the account disallows bearer tokens")
        types = {str(t).upper() for t in claims.nats.get("allowed_connection_types") or ()}
        if types and connection_type not in types:
            raise AuthError(f"connection type {connection_type} not allowed")
        if not bearer:
            _check_signature(claims.subject, signature, nonce)
        if account.revoked(claims.subject, claims.issued_at):
            raise AuthError("user authentication revoked")
        if not _source_allowed(claims.nats.get("src"), client_ip):
            raise AuthError("bad src IP")
        scope = account.signing_keys.get(claims.issuer)
        if scope is not None:
            if not jwt.has_empty_permissions(claims.nats):
                raise AuthError("scoped users require no permissions or limits set")
            permissions = scope.permissions
        else:
            try:
                jwt.check_user_limits(claims.nats)
            except jwt.JwtError as exc:
                raise AuthError(str(exc)) from None
            permissions = jwt.permissions(claims.nats)
            if permissions is None:
                permissions = account.default_permissions
        system = account.key == state.config.system_account
        return Principal(account.key, claims.subject, permissions, system=system, expires=claims.expires)

    @staticmethod
    def _secret_ok(entry: User, password: str | None, token: str | None) -> bool:
        if token is not None and entry.token is not None:
            return secret_matches(entry.token, token)
        return secret_matches(entry.password or "", password or "")

    @staticmethod
    def _user_from_token(state: _State, token: str) -> User | None:
        name = state.plain_tokens.get(hashlib.sha256(token.encode()).digest())
        if name is not None:
            entry = state.users[name]
            return entry if secret_matches(entry.token or "", token) else None
        return next((u for u in state.bcrypt_token_users if secret_matches(u.token or "", token)), None)

    @staticmethod
    def _user_from_cert(state: _State, identity: CertIdentity) -> User | None:
        """auth.go `checkClientTLSCertSubject`: SANs, then the DN (RDNs in any order), then its string."""
        for name in identity.names():
            if name in state.users:
                return state.users[name]
        if identity.rdns:
            cert_dn = [frozenset((t.upper(), v) for t, v in rdn) for rdn in reversed(identity.rdns)]
            for _, dn, name in state.user_dns:
                if dn == cert_dn:
                    return state.users[name]
            as_set = frozenset(cert_dn)
            for rdn_set, dn, name in state.user_dns:
                if rdn_set == as_set and len(dn) == len(cert_dn):
                    return state.users[name]
        for name in (identity.rfc4514(True), identity.rfc4514(False)):
            if name and name in state.users:
                return state.users[name]
        return None


def _check_signature(public_key: str, signature: str | None, nonce: str | None) -> None:
    """auth.go: the client signed the nonce of this connection's INFO with the key's seed."""
    if not signature:
        raise AuthError("signature missing")
    if not nonce:
        raise AuthError("no nonce was sent to sign")
    try:
        raw = nkeys.decode_signature(signature)
    except ValueError:
        raise AuthError("signature not valid base64") from None
    if not nkeys.verify(public_key, nonce.encode(), raw):
        raise AuthError("signature not verified")


def _source_allowed(src: object, client_ip: str | None) -> bool:
    """A user JWT's `src`: CIDR blocks (a list, or one comma-separated string) the client must come from."""
    if not src:
        return True
    blocks = src if isinstance(src, list) else str(src).split(",")
    if client_ip is None:
        return False
    try:
        address = ipaddress.ip_address(client_ip)
        return any(address in ipaddress.ip_network(str(b).strip(), strict=False) for b in blocks if str(b).strip())
    except ValueError:
        return False
