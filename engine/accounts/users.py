"""User entries and their permissions, as nats-server reads them from `users: [...]` and `permissions {...}`.

`User` is a user entry (its secrets kept as written, never printed); `UserReader` reads entries and
permission blocks with nats-server's keys and aliases: `publish|pub|import` and `subscribe|sub|export`
as a subject, a list (the allow list) or `{allow, deny}`, an empty list being no list; subscribe
entries may carry a queue (`"subject queue"`); `allow_responses` as true or `{max, expires}`.
Counterpart: server/opts.go (parseUsers, parseUserPermissions, parseVariablePermissions,
parseAllowResponses).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from engine.accounts.permissions import Permissions, ResponsePermission, SubjectPermission, SubjectRule
from engine.accounts.syntax import Token
from engine.accounts.values import Reader

CONNECTION_TYPES = frozenset({"STANDARD", "WEBSOCKET", "LEAFNODE", "LEAFNODE_WS", "MQTT", "MQTT_WS", "IN_PROCESS", "HTTP"})
_BCRYPT = re.compile(r"^\$2[abxy]\$\d{2}\$")


def is_bcrypt(secret: str) -> bool:
    """A stored secret nats-server checks with bcrypt rather than comparing."""
    return bool(_BCRYPT.match(secret))


@dataclass(frozen=True)
class User:
    """A user entry. Secrets are kept as written (plain or bcrypt) and never printed."""

    name: str
    account: str
    password: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    nkey: str | None = None
    permissions: Permissions | None = None
    connection_types: frozenset[str] = frozenset()

    def allows(self, connection_type: str) -> bool:
        return not self.connection_types or connection_type in self.connection_types


class UserReader:
    """Reads user entries and permissions into `User` and `Permissions`, reporting mistakes to `reader`."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader

    def users(self, token: Token, account: str) -> list[tuple[User, Token]]:
        found = []
        for entry in self.reader.items(token, "users"):
            user = self._user(entry, account)
            if user is not None:
                found.append((user, entry))
        return found

    def _user(self, token: Token, account: str) -> User | None:
        name = password = secret = nkey = None
        permissions: Permissions | None = None
        types: frozenset[str] = frozenset()
        for key, value in self.reader.entries(token, "a user entry"):
            if key in ("user", "username"):
                name = self.reader.string(value, key)
            elif key in ("pass", "password"):
                password = self.reader.string(value, key)
            elif key == "token":
                secret = self.token(value)
            elif key == "nkey":
                nkey = self.reader.string(value, key)
            elif key in ("permission", "permissions", "authorization"):
                permissions = self.permissions(value)
            elif key in ("allowed_connection_types", "connection_types", "clients"):
                types = self._connection_types(value, key)
            elif key == "proxy_required":
                self.reader.ignored(value, key)
            else:
                self.reader.unknown(value, key, "parsing a user entry")
        if nkey is not None:
            if name is not None or password is not None:
                self.reader.error(token, "Nkey users do not take usernames or passwords")
            elif not (nkey.startswith("U") and len(nkey) == 56):
                self.reader.error(token, "Not a valid public nkey for a user")
            return User(nkey, account, token=secret, nkey=nkey, permissions=permissions, connection_types=types)
        if not name:
            self.reader.error(token, "User entry requires a user")
            return None
        return User(name, account, password, secret, None, permissions, types)

    def token(self, token: Token) -> str | None:
        """A bearer token; an empty one (an unset variable's) would let nobody in, silently: refused."""
        secret = self.reader.string(token, "token")
        if secret is not None and not secret.strip():
            self.reader.error(token, "'token' is empty")
        return secret

    def _connection_types(self, token: Token, key: str) -> frozenset[str]:
        names = set()
        for item in self.reader.items(token, key):
            name = self.reader.string(item, key)
            if name is None:
                continue
            if name.upper() not in CONNECTION_TYPES:
                self.reader.error(item, f"unknown connection type {name!r}")
            names.add(name.upper())
        return frozenset(names)

    # -- permissions ----------------------------------------------------------------------------

    def permissions(self, token: Token) -> Permissions | None:
        publish = subscribe = None
        response: ResponsePermission | None = None
        for key, value in self.reader.entries(token, "permissions"):
            if key in ("pub", "publish", "import"):
                publish = self._subject_permission(value, allow_queue=False)
            elif key in ("sub", "subscribe", "export"):
                subscribe = self._subject_permission(value, allow_queue=True)
            elif key in ("publish_allow_responses", "allow_responses"):
                response = self._responses(value)
            else:
                self.reader.unknown(value, key, "parsing permissions")
        return Permissions(publish, subscribe, response)

    def _subject_permission(self, token: Token, allow_queue: bool) -> SubjectPermission | None:
        if not isinstance(token.value, dict):
            return SubjectPermission(allow=self._subjects(token, allow_queue))
        if not token.value:
            return None
        allow = deny = None
        for key, value in self.reader.entries(token, "subject permissions"):
            if key == "allow":
                allow = self._subjects(value, allow_queue)
            elif key == "deny":
                deny = self._subjects(value, allow_queue)
            else:
                self.reader.error(value, f"Unknown field name {key!r} parsing subject permissions, only 'allow' or 'deny' are permitted")
        return SubjectPermission(allow, deny)

    def _subjects(self, token: Token, allow_queue: bool) -> tuple[SubjectRule, ...] | None:
        """A subject or a list of them; an empty list is no list at all (nats-server's nil)."""
        items = [token] if isinstance(token.value, str) else self.reader.items(token, "subject permissions")
        rules = []
        for item in items:
            text = item.value
            if not isinstance(text, str):
                self.reader.error(item, "Subject in permissions array cannot be cast to string")
                continue
            try:
                rules.append(SubjectRule.parse(text, allow_queue))
            except ValueError as exc:
                self.reader.error(item, str(exc))
        return tuple(rules) or None

    def _responses(self, token: Token) -> ResponsePermission | None:
        if isinstance(token.value, bool):
            return ResponsePermission() if token.value else None
        max_msgs, expires = ResponsePermission.max_msgs, ResponsePermission.expires
        for key, value in self.reader.entries(token, "allow_responses"):
            if key in ("max", "max_msgs", "max_messages", "max_responses"):
                number = self.reader.integer(value, key)
                if number:
                    max_msgs = number
            elif key in ("expires", "expiration", "ttl"):
                seconds = self.reader.duration(value, "expires")
                if seconds:
                    expires = seconds
            else:
                self.reader.unknown(value, key, "parsing permissions")
        return ResponsePermission(max_msgs, expires)
