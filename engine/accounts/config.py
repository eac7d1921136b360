"""The server configuration JetLake reads from a nats-server config file: accounts, users, TLS, JetStream.

`load(path)` parses the file (engine/accounts/syntax.py) and processes the keys nats-server's option
processing knows, with its aliases and rules, into a `ServerConfig`:

- `accounts { NAME { users: [...], default_permissions, jetstream: {...} } }` (or a list of names);
  an account without `jetstream` has JetStream off (10039), as in nats-server;
- `authorization { users | user+password | token, default_permissions }`: users of the global
  account, which JetLake keeps under `warehouse/default` (nats-server's `$G`); the global account
  has JetStream (unlimited) when no other account is configured, as in nats-server;
- `no_auth_user`, `system_account` (`system`), `tls {...}` (engine/accounts/tls_options.py),
  `jetstream {...}` (the server block, and an account's, engine/accounts/jetstream_options.py:
  `store_dir` is the warehouse; `key`, `prev_key` and `cipher` are kept for encryption at rest);
- a user entry's `token` (JetLake's extension: a bearer token for HTTP clients); user entries and
  permission blocks are read by engine/accounts/users.py;
- operator mode (decentralized JWT auth): `operator` (a JWT or a file holding one; a list too) or
  `trusted_keys`, `resolver: MEMORY` and `resolver_preload { <account key>: <account JWT> }`, read by
  engine/accounts/operator_mode.py with engine/accounts/jwt.py; each preloaded account is an account
  named by its public key (its folder too, as nats-server's store), with the JetStream limits of its
  JWT. Other resolvers (URL, full, cache) are refused, and so are `accounts`, `authorization` and
  `no_auth_user` beside an operator, as nats-server refuses them.

Keys are case-insensitive; an unknown key is an error naming `file:line:col`; a key of nats-server's
that JetLake has no use for (`port`, `cluster`, account `limits`, `exports`, …) is accepted with a
warning, so a nats-server config carries over unchanged. Counterpart: server/opts.go
(processConfigFileLine, parseAuthorization, parseUsers, parseAccounts, parseJetStream,
parseJetStreamForAccount, parseUserPermissions, parseTLS).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from engine.accounts import jwt
from engine.accounts.jetstream_options import JetStreamConfig, account_jetstream, server_jetstream
from engine.accounts.limits import UNLIMITED_LIMITS, AccountLimits
from engine.accounts.operator_mode import OPERATOR_KEYS, OperatorOptions
from engine.accounts.permissions import Permissions
from engine.accounts.syntax import ConfigError, Token, parse_file, parse_text
from engine.accounts.tls_options import TlsConfig, read_tls
from engine.accounts.users import User, UserReader, is_bcrypt
from engine.accounts.values import Reader

GLOBAL_ACCOUNT = "default"  # nats-server's `$G`, the account of users outside `accounts`
WIRE_GLOBAL_ACCOUNT = "$G"  # the global account's name wherever nats-server names it (advisories, $SYS subjects)
SYSTEM_ACCOUNT = "$SYS"
_ACCOUNT_NAME = re.compile(r"^[^/\\\x00-\x1f\x7f]{1,200}$")

# nats-server settings with no meaning for JetLake: accepted, with a warning.
_IGNORED_TOP = frozenset(
    "server_name listen host net port client_advertise http http_port monitor_port https https_port "
    "http_base_path max_payload max_connections max_conn max_control_line max_pending max_subscriptions "
    "max_subs ping_interval ping_max write_deadline lame_duck_duration lame_duck_grace_period debug trace "
    "trace_verbose logtime logtime_utc log_file log_size_limit log_max_num syslog remote_syslog pid_file "
    "ports_file prof_port cluster gateway leafnodes leaf websocket ws mqtt no_header_support "
    "disable_sublist_cache no_sublist_cache connect_error_reports reconnect_error_reports max_traced_msg_len "
    "server_tags default_js_domain no_system_account allow_non_tls mappings maps jetstream_max_memory "
    "jetstream_max_store store_dir proxies".split()
)
_UNSUPPORTED_TOP = frozenset("resolver_tls default_sentinel".split())
_IGNORED_ACCOUNT = frozenset("nkey imports exports mappings maps limits msg_trace trace_dest".split())


def wire_account(name: str) -> str:
    """An account's name as nats-server writes it: `$G` for the global account (kept as "default" in the warehouse)."""
    return WIRE_GLOBAL_ACCOUNT if name == GLOBAL_ACCOUNT else name


def account_from_wire(name: str) -> str:
    """The account a nats-server name means: `$G` is the global account."""
    return GLOBAL_ACCOUNT if name == WIRE_GLOBAL_ACCOUNT else name


@dataclass(frozen=True)
class AccountConfig:
    name: str
    jetstream: AccountLimits | None = None  # None: JetStream is off for the account
    default_permissions: Permissions | None = None
    key: str | None = field(default=None, repr=False)  # the account's own `jetstream { key, cipher }`
    prev_key: str | None = field(default=None, repr=False)
    cipher: str | None = None


@dataclass(frozen=True)
class ServerConfig:
    """Everything of a config file the gateway uses; `ServerConfig.open()` is the no-config server."""

    accounts: dict[str, AccountConfig]
    users: tuple[User, ...] = ()
    token: str | None = field(default=None, repr=False)
    no_auth_user: str | None = None
    system_account: str | None = None
    tls: TlsConfig | None = None
    jetstream: JetStreamConfig = JetStreamConfig()
    source: Path | None = None
    warnings: tuple[str, ...] = ()
    configured: bool = True  # False: the gateway runs without a config file
    operators: tuple[jwt.Operator, ...] = ()
    trusted_keys: frozenset[str] = frozenset()
    jwt_accounts: dict[str, jwt.Account] = field(default_factory=dict)  # by account public key

    @property
    def operator_mode(self) -> bool:
        """Decentralized auth: users log in with JWTs issued by the preloaded accounts."""
        return bool(self.operators or self.trusted_keys)

    @classmethod
    def open(cls) -> ServerConfig:
        """No configuration: one account, `default`, with JetStream and no authentication."""
        return cls(accounts={GLOBAL_ACCOUNT: AccountConfig(GLOBAL_ACCOUNT, UNLIMITED_LIMITS)}, configured=False)

    @property
    def auth_required(self) -> bool:
        """Whether a client must authenticate (nats-server: users, nkeys or a token configured)."""
        return bool(self.users) or self.token is not None or self.operator_mode

    def user(self, name: str) -> User | None:
        return next((u for u in self.users if u.name == name), None)

    def jetstream_accounts(self) -> list[str]:
        return sorted(name for name, account in self.accounts.items() if account.jetstream is not None)


def load(path: str | Path, env: dict[str, str] | None = None) -> ServerConfig:
    """Reads a nats-server config file; `ConfigError` names the file, line and column of each mistake."""
    parsed = parse_file(path, env)
    return _Processor(parsed.root, parsed.warnings).process(Path(path).resolve())


def loads(text: str, env: dict[str, str] | None = None) -> ServerConfig:
    parsed = parse_text(text, "<config>", env)
    return _Processor(parsed.root, parsed.warnings).process(None)


class _Processor:
    def __init__(self, root: dict[str, Token], warnings: list[str]) -> None:
        self.root = root
        self.r = Reader()
        self.r.warnings += warnings
        self.user_reader = UserReader(self.r)
        self.accounts: dict[str, AccountConfig] = {}
        self.users: list[tuple[User, Token]] = []
        self.auth_user: User | None = None
        self.auth_where: Token | None = None
        self.token: str | None = None
        self.no_auth_user: tuple[str, Token] | None = None
        self.system: tuple[str, Token] | None = None
        self.tls: TlsConfig | None = None
        self.jetstream = JetStreamConfig()
        self.global_default: Permissions | None = None
        self.global_jetstream: AccountLimits | None = None
        self.source: Path | None = None
        self.operator = OperatorOptions(self.r)
        self.seen: dict[str, Token] = {}

    def process(self, source: Path | None) -> ServerConfig:
        self.source = source
        for key, token in self.root.items():
            self._top(key.lower(), key, token)
        self.r.raise_if_failed()
        config = self._assemble(source)
        self.r.raise_if_failed()
        return config

    def _top(self, key: str, raw: str, token: Token) -> None:
        self.seen[key] = token
        if key == "authorization":
            self._authorization(token)
        elif key == "accounts":
            self._accounts(token)
        elif key == "no_auth_user":
            name = self.r.string(token, raw)
            if name is not None:
                self.no_auth_user = (name, token)
        elif key in ("system_account", "system"):
            name = self.r.string(token, raw)
            if name is not None:
                self.system = (name, token)
        elif key == "jetstream":
            jetstream = server_jetstream(self.r, token)
            if jetstream is not None:
                self.jetstream = jetstream
        elif key == "tls":
            self.tls = read_tls(self.r, token)
        elif key in OPERATOR_KEYS:
            self.operator.read_operators(token, self.source)
        elif key in ("trusted", "trusted_keys"):
            self.operator.read_trusted_keys(token, raw)
        elif key == "resolver":
            self.operator.resolver = token
        elif key == "resolver_preload":
            self.operator.preload = token
        elif key in _UNSUPPORTED_TOP:
            self.r.error(token, f"{raw!r} is not supported by JetLake")
        elif key in _IGNORED_TOP:
            self.r.ignored(token, raw)
        else:
            self.r.unknown(token, raw)

    # -- operator mode ---------------------------------------------------------------------------

    def _operator_accounts(self) -> dict[str, jwt.Account]:
        """The preloaded accounts join the configured ones, by public key; so does the system account."""
        found, system = self.operator.accounts(self.seen, self.system)
        for key, account in found.items():
            self.accounts[key] = AccountConfig(key, account.jetstream, account.default_permissions)
        if system is not None:
            self.system = system
            self.accounts.setdefault(system[0], AccountConfig(system[0]))
        return found

    # -- authorization {} and users -------------------------------------------------------------

    def _authorization(self, token: Token) -> None:
        single_user: str | None = None
        password: str | None = None
        users: list[tuple[User, Token]] = []
        for key, value in self.r.entries(token, "authorization"):
            if key in ("user", "username"):
                single_user = self.r.string(value, key)
            elif key in ("pass", "password"):
                password = self.r.string(value, key)
            elif key == "token":
                self.token = self.user_reader.token(value)
            elif key == "users":
                users = self.user_reader.users(value, GLOBAL_ACCOUNT)
            elif key in ("default_permission", "default_permissions", "permissions"):
                self.global_default = self.user_reader.permissions(value)
            elif key in ("timeout", "proxy_required"):
                self.r.ignored(value, key)
            elif key in ("auth_callout", "auth_hook"):
                self.r.error(value, f"{key!r}: auth callouts are not supported by JetLake")
            else:
                self.r.unknown(value, key, "parsing authorization")
        if single_user is not None and self.token is not None:
            self.r.error(token, "can not have a single user/pass and a token")
        if users and (single_user is not None or self.token is not None):
            self.r.error(token, "can not have a single user/pass or a token and a users array")
        if single_user is not None:
            self.auth_user = User(single_user, GLOBAL_ACCOUNT, password)
            self.auth_where = token
        self.users += users

    # -- accounts {} ----------------------------------------------------------------------------

    def _accounts(self, token: Token) -> None:
        if isinstance(token.value, list):
            for item in token.value:
                name = self.r.string(item, "accounts")
                if name is not None and self._account_name_ok(name, item):
                    self.accounts[name] = AccountConfig(name)
            return
        for raw_name, value in (token.value.items() if isinstance(token.value, dict) else ()):
            if value.used_variable:
                continue
            if self._account_name_ok(raw_name, value):
                self._account(raw_name, value)
        if not isinstance(token.value, (dict, list)):
            self.r.error(token, "expected accounts to be a map or a list of names")

    def _account_name_ok(self, name: str, token: Token) -> bool:
        if name == "$G":
            self.r.error(token, '"$G" is a Reserved Account')
        elif name in self.accounts:
            self.r.error(token, f"Duplicate Account Entry: {name}")
        elif not _ACCOUNT_NAME.match(name) or name in (".", ".."):
            self.r.error(token, f"account name {name!r} cannot name a warehouse folder (no '/', '\\' or control characters)")
        elif any(other.lower() == name.lower() for other in self.accounts):
            self.r.error(token, f"account names {name!r} and another differ only in case: their folders would collide")
        else:
            return True
        return False

    def _account(self, name: str, token: Token) -> None:
        limits: AccountLimits | None = None
        defaults: Permissions | None = None
        users: list[tuple[User, Token]] = []
        encryption: dict[str, str | None] = {}
        for key, value in self.r.entries(token, f"account {name}"):
            if key == "users":
                users = self.user_reader.users(value, name)
            elif key == "default_permissions":
                defaults = self.user_reader.permissions(value)
            elif key == "jetstream":
                limits = account_jetstream(self.r, value, encryption)
            elif key in _IGNORED_ACCOUNT:
                self.r.ignored(value, key)
            else:
                self.r.unknown(value, key, f"parsing account {name}")
        self.accounts[name] = AccountConfig(name, limits, defaults, **encryption)  # type: ignore[arg-type]
        self.users += users

    # -- the whole ------------------------------------------------------------------------------

    def _assemble(self, source: Path | None) -> ServerConfig:
        operator_mode = self.operator.active
        jwt_accounts = self._operator_accounts() if operator_mode else {}
        if not operator_mode and (self.operator.resolver is not None or self.operator.preload is not None):
            self.r.error(self.operator.resolver or self.operator.preload, "resolver without an operator (or trusted_keys)")  # type: ignore[arg-type]
        users = self._final_users()
        self._global_account()
        system = self._system_account()
        no_auth = None
        if self.no_auth_user is not None:
            no_auth, where = self.no_auth_user
            if not any(u.name == no_auth for u in users):
                self.r.error(where, f"no_auth_user: {no_auth!r} not present as user or nkey in authorization block or account configuration")
        return ServerConfig(
            accounts=dict(self.accounts),
            users=tuple(users),
            token=self.token,
            no_auth_user=no_auth,
            system_account=system,
            tls=self.tls,
            jetstream=self.jetstream,
            source=source,
            warnings=tuple(self.r.warnings),
            operators=tuple(self.operator.operators),
            trusted_keys=frozenset(self.operator.trusted_keys),
            jwt_accounts=jwt_accounts,
        )

    def _final_users(self) -> list[User]:
        """Default permissions applied, names unique, tokens unique; the single user joins the list."""
        entries = list(self.users)
        if self.auth_user is not None:
            if any(u.account != GLOBAL_ACCOUNT for u, _ in entries):
                self.r.error(entries[0][1], "Can not have a single user/pass and accounts")
            entries.append((self.auth_user, self.auth_where or Token(None, "<config>", 0, 0)))
        if self.token is not None and any(u.account != GLOBAL_ACCOUNT for u, _ in entries):
            self.r.error(entries[0][1], "Can not have a token and accounts")
        users: list[User] = []
        names: set[str] = set()
        tokens: set[str] = set()
        for user, token in entries:
            if user.name in names:
                self.r.error(token, f"Duplicate user {user.name!r} detected")
                continue
            if user.token is not None and not is_bcrypt(user.token):
                if user.token in tokens:
                    self.r.error(token, f"user {user.name!r}: another user has the same token")
                tokens.add(user.token)
            names.add(user.name)
            if user.permissions is None and user is not self.auth_user:
                account = self.accounts.get(user.account)
                default = account.default_permissions if account is not None else self.global_default
                user = User(user.name, user.account, user.password, user.token, user.nkey, default, user.connection_types)
            users.append(user)
        return users

    def _global_account(self) -> None:
        """The global account: users outside `accounts`, JetStream on when it is the only account."""
        configured = self.accounts.get(GLOBAL_ACCOUNT)
        others = [n for n in self.accounts if n != GLOBAL_ACCOUNT and n != (self.system[0] if self.system else SYSTEM_ACCOUNT)]
        limits = configured.jetstream if configured is not None else (None if others or self.operator.active else UNLIMITED_LIMITS)
        defaults = configured.default_permissions if configured is not None else self.global_default
        self.accounts[GLOBAL_ACCOUNT] = AccountConfig(GLOBAL_ACCOUNT, limits, defaults)

    def _system_account(self) -> str | None:
        if self.system is None:
            return None
        name, where = self.system
        account = self.accounts.get(name)
        if account is None:
            if name != SYSTEM_ACCOUNT:
                self.r.error(where, f"system account {name!r} is not defined in accounts")
                return None
            self.accounts[name] = AccountConfig(name)
        elif account.jetstream is not None:
            self.r.error(where, f"jetstream can not be enabled on the system account {name!r}")
        if name == GLOBAL_ACCOUNT:
            self.r.error(where, "the global account cannot be the system account")
        return name


__all__ = ["AccountConfig", "ConfigError", "JetStreamConfig", "ServerConfig", "TlsConfig", "User", "is_bcrypt", "load", "loads"]
