"""Reading typed values out of a parsed configuration, with errors that name the file, line and column.

The processing of nats-server's keys (engine/accounts/config.py) reads each entry through a `Reader`,
which collects every mistake instead of stopping at the first, as nats-server's option processing
collects its errors. Counterpart: the `unwrapValue`/`configErr` helpers of server/opts.go.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from engine.accounts.syntax import ConfigError, Token

_DURATION = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SIZE_SUFFIXES = {"K": 10, "M": 20, "G": 30, "T": 40}


class Reader:
    """Collects configuration errors and warnings while the keys are processed."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def error(self, token: Token, reason: str) -> None:
        self.errors.append(f"{token.where}: {reason}")

    def unknown(self, token: Token, key: str, where: str = "") -> None:
        if not token.used_variable:
            self.errors.append(f"{token.where}: unknown field {key!r}" + (f" {where}" if where else ""))

    def ignored(self, token: Token, key: str) -> None:
        self.warnings.append(f"{token.where}: {key!r} is a nats-server setting JetLake does not use; ignored")

    def raise_if_failed(self) -> None:
        if self.errors:
            more = f" (and {len(self.errors) - 10} more)" if len(self.errors) > 10 else ""
            raise ConfigError("; ".join(self.errors[:10]) + more)

    # -- typed values ---------------------------------------------------------------------------

    def entries(self, token: Token, what: str) -> Iterator[tuple[str, Token]]:
        """A map's (lower-cased key, value token) pairs; an error if the value is not a map."""
        if not isinstance(token.value, dict):
            self.error(token, f"expected {what} to be a map, got {_kind(token.value)}")
            return
        for key, value in token.value.items():
            yield key.lower(), value

    def string(self, token: Token, key: str) -> str | None:
        if isinstance(token.value, str):
            return token.value
        self.error(token, f"{key!r} must be a string, got {_kind(token.value)}")
        return None

    def boolean(self, token: Token, key: str) -> bool | None:
        if isinstance(token.value, bool):
            return token.value
        self.error(token, f"{key!r} must be true or false, got {_kind(token.value)}")
        return None

    def integer(self, token: Token, key: str) -> int | None:
        if isinstance(token.value, int) and not isinstance(token.value, bool):
            return token.value
        self.error(token, f"expected a parseable size for {key!r}, got {_kind(token.value)}")
        return None

    def items(self, token: Token, key: str) -> list[Token]:
        if isinstance(token.value, list):
            return token.value
        self.error(token, f"expected {key!r} to be an array, got {_kind(token.value)}")
        return []

    def storage_size(self, token: Token, key: str) -> int | None:
        """nats-server's getStorageSize: an int, or a string of digits and one of K, M, G, T (binary)."""
        value = token.value
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            if value == "":
                return 0
            number, suffix = value[:-1], value[-1:]
            if suffix in _SIZE_SUFFIXES and number.lstrip("-").isdigit() and number.isascii():
                return int(number) << _SIZE_SUFFIXES[suffix]
            self.error(token, f"{key} sizes defined as strings must be digits ending in K, M, G, T, got {value!r}")
            return None
        self.error(token, f"{key} must be int64 or string, got {_kind(value)}")
        return None

    def duration(self, token: Token, key: str) -> float | None:
        """Seconds from a Go duration string (`"2m"`, `"1h30m"`, `"250ms"`)."""
        if isinstance(token.value, str):
            seconds = parse_go_duration(token.value)
            if seconds is not None:
                return seconds
            self.error(token, f"error parsing {key}: invalid duration {token.value!r}")
            return None
        self.error(token, f"error parsing {key}, not a duration string")
        return None


def parse_go_duration(text: str) -> float | None:
    """Go's time.ParseDuration, in seconds; None if it is not one."""
    s = text.strip()
    sign = -1.0 if s.startswith("-") else 1.0
    s = s.lstrip("+-")
    if s == "0":
        return 0.0
    total, pos = 0.0, 0
    while pos < len(s):
        found = _DURATION.match(s, pos)
        if found is None or found.group(1) in ("", "."):
            return None
        total += float(found.group(1)) * _DURATION_UNITS[found.group(2)]
        pos = found.end()
    return sign * total if s else None


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array", dict: "a map"}
    return names.get(type(value), type(value).__name__)
