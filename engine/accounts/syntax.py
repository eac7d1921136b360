"""nats-server's configuration language: a file (or text) in, a tree of positioned values out.

Every value comes back as a `Token` holding the Python value and where it was written (file, line,
column; a map entry's position is its key's), so the processing of keys (engine/accounts/config.py)
can name the place of any mistake. Values are `str`, `bool`, `int` (sizes already multiplied out:
`1k` = 1000, `1KB`/`1Ki`/`1KiB` = 1024), `float`, `datetime`, `list[Token]` and `dict[str, Token]`
(keys as written; the config processing reads them case-insensitively).

As nats-server's parser: a bare `$NAME` is looked up among the keys already parsed in the enclosing
maps, innermost first, then in the environment, whose value is parsed again as configuration
(`42` is an int, `{a: 1}` a map); a bare `$2a$…` is a bcrypt hash and stays literal; a variable key
that is used is marked `used_variable` (nats-server then skips it; an unused one is an unknown key).
`include <path>` parses another file on its own, relative to the including file, and merges its keys.
The last of duplicate keys wins. A number with an unknown suffix (`1kbi`) is dropped with its key, as
nats-server drops it; a warning says so. Counterpart: conf/parse.go.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.accounts.lexer import Item, Kind, Lexer

_SUFFIXES = {
    "": 1,
    "k": 10**3, "kb": 2**10, "ki": 2**10, "kib": 2**10,
    "m": 10**6, "mb": 2**20, "mi": 2**20, "mib": 2**20,
    "g": 10**9, "gb": 2**30, "gi": 2**30, "gib": 2**30,
    "t": 10**12, "tb": 2**40, "ti": 2**40, "tib": 2**40,
    "p": 10**15, "pb": 2**50, "pi": 2**50, "pib": 2**50,
    "e": 10**18, "eb": 2**60, "ei": 2**60, "eib": 2**60,
}  # fmt: skip
_INT64 = (-(2**63), 2**63 - 1)
_BCRYPT_PREFIX = "2a$"
_ENV_KEY = "pk"


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file, line and column or key."""


@dataclass
class Token:
    """A parsed value and where it was written."""

    value: Any
    file: str
    line: int
    col: int
    used_variable: bool = field(default=False, compare=False)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass
class Parsed:
    """The top-level map of a configuration and the warnings its parsing gave."""

    root: dict[str, Token]
    warnings: list[str]


def parse_file(path: str | Path, env: dict[str, str] | None = None) -> Parsed:
    """Parses a configuration file (and the files it includes)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"error opening config file {path}: {exc}") from None
    return parse_text(text, str(path), env)


def parse_text(text: str, file: str = "<config>", env: dict[str, str] | None = None) -> Parsed:
    """Parses configuration text; `env` replaces `os.environ` for `$VARIABLE` lookups (tests)."""
    parser = _Parser(text, file, os.environ if env is None else env, set())
    parser.run()
    return Parsed(parser.root, parser.warnings)


class _Parser:
    def __init__(self, text: str, file: str, env: Any, env_refs: set[str]) -> None:
        self.lexer = Lexer(text)
        self.file = file
        self.folder = Path(file).parent if file and not file.startswith("<") else Path.cwd()
        self.env = env
        self.env_refs = env_refs
        self.root: dict[str, Token] = {}
        self.contexts: list[dict[str, Token] | list[Token]] = [self.root]
        self.keys: list[Item] = []
        self.warnings: list[str] = []

    def run(self) -> None:
        previous: Item | None = None
        while True:
            item = self.lexer.next_item()
            if item.kind is Kind.EOF:
                if previous is not None and previous.kind is Kind.KEY and previous.value != "}":
                    raise ConfigError(f"{self.file}:{item.line}:{item.col}: config is invalid: key {previous.value!r} has no value")
                return
            previous = item
            self._process(item)

    def _token(self, item: Item, value: Any) -> Token:
        return Token(value, self.file, item.line, item.col)

    def _process(self, item: Item) -> None:
        kind = item.kind
        if kind is Kind.ERROR:
            raise ConfigError(f"{self.file}:{item.line}:{item.col}: parse error: {item.value}")
        if kind is Kind.KEY:
            self.keys.append(item)
        elif kind is Kind.MAP_START:
            self.contexts.append({})
        elif kind is Kind.MAP_END:
            self._set(self._token(item, self._pop_context()))
        elif kind is Kind.ARRAY_START:
            self.contexts.append([])
        elif kind is Kind.ARRAY_END:
            self._set(self._token(item, self._pop_context()))
        elif kind is Kind.STRING:
            self._set(self._token(item, item.value))
        elif kind is Kind.INTEGER:
            self._integer(item)
        elif kind is Kind.FLOAT:
            self._set(self._token(item, float(item.value)))
        elif kind is Kind.BOOL:
            self._set(self._token(item, item.value.lower() in ("true", "yes", "on")))
        elif kind is Kind.DATETIME:
            self._set(self._token(item, datetime.strptime(item.value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)))
        elif kind is Kind.VARIABLE:
            self._set(self._token(item, self._variable(item)))
        elif kind is Kind.INCLUDE:
            self._include(item)

    def _pop_context(self) -> Any:
        if len(self.contexts) < 2:
            raise ConfigError(f"{self.file}: unbalanced brackets")
        return self.contexts.pop()

    def _set(self, token: Token) -> None:
        ctx = self.contexts[-1]
        if isinstance(ctx, list):
            ctx.append(token)
            return
        if not self.keys:
            raise ConfigError(f"{token.where}: a value without a key")
        key = self.keys.pop()
        token.line, token.col = key.line, key.col  # errors name the key's place, as nats-server's
        ctx[key.value] = token

    def _integer(self, item: Item) -> None:
        text = item.value
        digits = len(text) - len(text.lstrip("-0123456789"))
        number, suffix = text[:digits], text[digits:].strip().lower()
        try:
            value = int(number)
        except ValueError:
            raise ConfigError(f"{self.file}:{item.line}:{item.col}: expected integer, but got '{text}'") from None
        if not _INT64[0] <= value <= _INT64[1]:
            raise ConfigError(f"{self.file}:{item.line}:{item.col}: integer '{text}' is out of the range")
        if suffix not in _SUFFIXES:
            dropped = self.keys.pop().value if self.keys and isinstance(self.contexts[-1], dict) else "an array item"
            self.warnings.append(f"{self.file}:{item.line}:{item.col}: '{text}' has an unknown size suffix: "
                                 f"{dropped!r} is dropped, as nats-server drops it")
            return
        self._set(self._token(item, value * _SUFFIXES[suffix]))

    def _variable(self, item: Item) -> Any:
        name = item.value
        if name.startswith(_BCRYPT_PREFIX):
            return "$" + name
        for ctx in reversed(self.contexts):
            if isinstance(ctx, dict) and name in ctx:
                found = ctx[name]
                found.used_variable = True
                return found.value
        where = f"{self.file}:{item.line}:{item.col}"
        if name in self.env_refs:
            raise ConfigError(f"{where}: variable reference for '{name}' could not be parsed: variable reference cycle")
        if name not in self.env:
            raise ConfigError(f"{where}: variable reference for '{name}' can not be found")
        self.env_refs.add(name)
        try:
            sub = _Parser(f"{_ENV_KEY}={self.env[name]}", f"<environment variable {name}>", self.env, self.env_refs)
            sub.run()
        except ConfigError as exc:
            raise ConfigError(f"{where}: variable reference for '{name}' could not be parsed: {exc}") from None
        finally:
            self.env_refs.discard(name)
        if _ENV_KEY not in sub.root:
            raise ConfigError(f"{where}: variable reference for '{name}' can not be found")
        return sub.root[_ENV_KEY].value

    def _include(self, item: Item) -> None:
        path = self.folder / item.value
        try:
            included = parse_file(path, self.env)
        except ConfigError as exc:
            raise ConfigError(f"{self.file}:{item.line}:{item.col}: error parsing include file '{item.value}', {exc}") from None
        self.warnings += included.warnings
        ctx = self.contexts[-1]
        if not isinstance(ctx, dict):
            raise ConfigError(f"{self.file}:{item.line}:{item.col}: include inside an array")
        ctx.update(included.root)


def plain(value: Any) -> Any:
    """A parsed value without its tokens: nested maps and lists of plain Python values."""
    if isinstance(value, Token):
        return plain(value.value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value
