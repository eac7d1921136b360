"""Operator mode (decentralized JWT auth) in a nats-server config file: `operator` (a JWT or a file
holding one; a list too) or `trusted_keys`, `resolver: MEMORY` and `resolver_preload`.

Users and accounts then come from JWTs (engine/accounts/jwt.py): each preloaded account JWT is
checked against the trusted operators. Other resolvers (URL, full, cache) are refused, and so are
`accounts`, `authorization` and `no_auth_user` beside an operator, as nats-server refuses them.
Counterpart: server/opts.go (the `operator`, `trusted_keys`, `resolver` and `resolver_preload`
options) and server/server.go (readOperatorJWT, the trusted-keys checks).
"""

from __future__ import annotations

from pathlib import Path

from engine.accounts import jwt
from engine.accounts.syntax import Token
from engine.accounts.values import Reader

OPERATOR_KEYS = frozenset("operator operators root roots root_operator root_operators".split())


class OperatorOptions:
    """What a config file says of operator mode, collected key by key, checked as a whole by `accounts`."""

    def __init__(self, r: Reader) -> None:
        self.r = r
        self.operators: list[jwt.Operator] = []
        self.trusted_keys: set[str] = set()
        self.resolver: Token | None = None
        self.preload: Token | None = None

    @property
    def active(self) -> bool:
        return bool(self.operators or self.trusted_keys)

    def read_operators(self, token: Token, source: Path | None) -> None:
        for item in [token] if isinstance(token.value, str) else self.r.items(token, "operator"):
            text = self.r.string(item, "operator")
            if text is None:
                continue
            try:
                self.operators.append(jwt.operator(_operator_jwt(text, source)))
            except (OSError, jwt.JwtError) as exc:
                self.r.error(item, f"error parsing operator JWT: {exc}")

    def read_trusted_keys(self, token: Token, raw: str) -> None:
        for item in [token] if isinstance(token.value, str) else self.r.items(token, raw):
            key_text = self.r.string(item, raw)
            if key_text is not None and not jwt.nkeys.is_public(key_text, "O"):
                self.r.error(item, f"trusted Keys {key_text!r} are not valid operator public keys")
            elif key_text is not None:
                self.trusted_keys.add(key_text)

    def accounts(self, seen: dict[str, Token], system: tuple[str, Token] | None
                 ) -> tuple[dict[str, jwt.Account], tuple[str, Token] | None]:
        """The preloaded account JWTs of a MEMORY resolver, each checked against the trusted operators,
        and the system account with where it is named (None: no system account from operator mode).

        `seen` is every top-level key with its value; `system` the config's `system_account`."""
        r = self.r
        for key in ("accounts", "authorization", "no_auth_user"):
            if key in seen:
                r.error(seen[key], f"operators do not allow {key!r}: users and accounts come from JWTs")
        resolver = self.resolver
        if resolver is None:
            r.error(seen.get("operator") or Token(None, "<config>", 0, 0), "operator mode needs a resolver: JetLake supports `resolver: MEMORY` with `resolver_preload`")
            return {}, None
        if not (isinstance(resolver.value, str) and resolver.value.upper() == "MEMORY"):
            r.error(resolver, "only the MEMORY resolver (with resolver_preload) is supported by JetLake; URL, full and cache resolvers are not")
            return {}, None
        system_name = system[0] if system else next((o.system_account for o in self.operators if o.system_account), None)
        found: dict[str, jwt.Account] = {}
        for key, item in (self.preload.value.items() if self.preload is not None and isinstance(self.preload.value, dict) else ()):
            text = r.string(item, key)
            if text is None:
                continue
            try:
                account = jwt.account(jwt.decorated(text), self.operators, frozenset(self.trusted_keys), system=key == system_name)
            except jwt.JwtError as exc:
                r.error(item, f"preloaded account {key}: {exc}")
                continue
            if account.key != key:
                r.error(item, f"preloaded account {key}: the JWT is for {account.key}")
                continue
            if key == system_name and account.jetstream is not None:
                r.error(item, f"jetstream can not be enabled on the system account {key!r}")
                continue
            found[key] = account
        if system_name is None:
            return found, None
        return found, (system_name, seen.get("system_account") or seen.get("system") or resolver)


def _operator_jwt(text: str, source: Path | None) -> str:
    """nats-server's readOperatorJWT: a JWT as is, else a file (as given, then beside the config)."""
    if text.startswith("eyJ"):
        return text
    path = Path(text)
    if not path.is_file() and source is not None and not path.is_absolute():
        path = source.parent / text
    return jwt.decorated(path.read_text())
