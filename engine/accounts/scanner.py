"""The scanner under the config-file lexer (engine/accounts/lexer.py): the input, its position, the
items found so far and the stack of states to return to.

The lexer's states are plain functions of a `Scanner`, each returning the next state (None: stop);
this module is what they share: reading a character and backing it up with nats-server's line and
column bookkeeping (so that every item and every error names the position nats-server names), and
emitting items. Counterpart: the `lexer` struct of conf/lex.go and its `next`, `backup`, `emit`,
`errorf`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

EOF: None = None

State = Callable[["Scanner"], "State | None"]


class Kind(Enum):
    ERROR = "error"
    EOF = "eof"
    KEY = "key"
    TEXT = "text"
    STRING = "string"
    BOOL = "bool"
    INTEGER = "integer"
    FLOAT = "float"
    DATETIME = "datetime"
    ARRAY_START = "array_start"
    ARRAY_END = "array_end"
    MAP_START = "map_start"
    MAP_END = "map_end"
    COMMENT_START = "comment_start"
    VARIABLE = "variable"
    INCLUDE = "include"


@dataclass(frozen=True)
class Item:
    kind: Kind
    value: str
    line: int
    col: int


def is_ws(r: str | None) -> bool:
    return r in ("\t", " ")


def is_nl(r: str | None) -> bool:
    return r in ("\n", "\r")


def is_digit(r: str | None) -> bool:
    return r is not None and r.isdecimal()


def show(r: str | None) -> str:
    """A character as an error message quotes it."""
    if r is EOF:
        return "EOF"
    return "\\n" if r == "\n" else r


class Scanner:
    """The lexer's position in its input; `string_state` is the string state an escape returns to."""

    def __init__(self, text: str, string_state: State) -> None:
        self.input = text
        self.start = 0
        self.pos = 0
        self.width = 0
        self.line = 1
        self.stack: list[State] = []
        self.parts: list[str] = []
        self.string_state = string_state
        self.lstart = 0
        self.ilstart = 0
        self.items: deque[Item] = deque()

    def next(self) -> str | None:
        if self.pos >= len(self.input):
            self.width = 0
            return EOF
        r = self.input[self.pos]
        if r == "\n":
            self.line += 1
            self.lstart = self.pos
        self.width = 1
        self.pos += 1
        return r

    def backup(self) -> None:
        self.pos -= self.width
        if self.pos < len(self.input) and self.input[self.pos] == "\n":
            self.line -= 1

    def peek(self) -> str | None:
        r = self.next()
        self.backup()
        return r

    def ignore(self) -> None:
        self.start = self.pos
        self.ilstart = self.lstart

    def emit(self, kind: Kind) -> None:
        value = "".join(self.parts) + self.input[self.start : self.pos]
        self._push_item(kind, value)

    def emit_string(self) -> None:
        value = "".join(self.parts) + self.input[self.start : self.pos]
        self.parts = []
        self._push_item(Kind.STRING, value)

    def _push_item(self, kind: Kind, value: str) -> None:
        line_start = self.ilstart + 1 if self.input[self.ilstart : self.ilstart + 1] == "\n" else self.ilstart
        col = self.pos - len(value) - line_start + 1
        self.items.append(Item(kind, value, self.line, max(col, 1)))
        self.start = self.pos
        self.ilstart = self.lstart

    def add_current_part(self, offset: int) -> None:
        self.parts.append(self.input[self.start : self.pos - offset])
        self.start = self.pos

    def add_part(self, s: str) -> State:
        self.parts.append(s)
        self.start = self.pos
        return self.string_state

    def error(self, message: str) -> None:
        line_start = self.lstart + 1 if self.input[self.lstart : self.lstart + 1] == "\n" else self.lstart
        self.items.append(Item(Kind.ERROR, message, self.line, self.pos - line_start))
        return None

    def pop(self) -> State | None:
        if not self.stack:
            return self.error("BUG in lexer: no states to pop")
        return self.stack.pop()

    def skip(self, then: State) -> State:
        def skipping(scanner: Scanner) -> State:
            scanner.ignore()
            return then

        return skipping

    def eof_or_error(self) -> None:
        if self.pos > self.start:
            return self.error("Unexpected EOF.")
        self.emit(Kind.EOF)
        return None
