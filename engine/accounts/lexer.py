"""The lexer of nats-server's configuration language: text in, items (keys, values, brackets) out.

A port of nats-server's state machine, state for state, so that what its lexer accepts, refuses or
reads differently is the same here: `=`, `:` or whitespace between key and value; newline, `;` or
`,` ending an entry; `#` and `//` comments (but `abc#def` is one bare value); arrays; maps; double-
quoted strings with `\\t \\n \\r \\" \\\\ \\xHH` escapes; raw single-quoted strings; bare strings; `( … )`
blocks whose `)` stands alone on a line; numbers with size suffixes; booleans; `$variables`;
Zulu datetimes; `include <path>`. Counterpart: conf/lex.go.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

EOF: None = None
_NUMBER_SUFFIXES = ("k", "K", "m", "M", "g", "G", "t", "T", "p", "P", "e", "E")
_DATETIME = "00-00T00:00:00Z"  # after "YYYY-": 0 = a digit, anything else itself
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", '"': '"', "\\": "\\"}

State = Callable[[], "State | None"]


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


def _ws(r: str | None) -> bool:
    return r in ("\t", " ")


def _nl(r: str | None) -> bool:
    return r in ("\n", "\r")


def _space(r: str | None) -> bool:
    return r is not None and r.isspace()


def _digit(r: str | None) -> bool:
    return r is not None and r.isdecimal()


def _key_sep(r: str | None) -> bool:
    return r in ("=", ":")


class Lexer:
    """`next_item()` until an item of kind EOF or ERROR."""

    def __init__(self, text: str) -> None:
        self.input = text
        self.start = 0
        self.pos = 0
        self.width = 0
        self.line = 1
        self.stack: list[State] = []
        self.parts: list[str] = []
        self.string_state: State = self._string
        self.lstart = 0
        self.ilstart = 0
        self.items: deque[Item] = deque()
        self.state: State | None = self._top

    def next_item(self) -> Item:
        while not self.items:
            if self.state is None:
                return Item(Kind.ERROR, "BUG in lexer: no state", self.line, 0)
            self.state = self.state()
        return self.items.popleft()

    # -- primitives ------------------------------------------------------------------------------

    def _next(self) -> str | None:
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

    def _backup(self) -> None:
        self.pos -= self.width
        if self.pos < len(self.input) and self.input[self.pos] == "\n":
            self.line -= 1

    def _peek(self) -> str | None:
        r = self._next()
        self._backup()
        return r

    def _ignore(self) -> None:
        self.start = self.pos
        self.ilstart = self.lstart

    def _emit(self, kind: Kind) -> None:
        value = "".join(self.parts) + self.input[self.start : self.pos]
        self._push_item(kind, value)

    def _emit_string(self) -> None:
        value = "".join(self.parts) + self.input[self.start : self.pos]
        self.parts = []
        self._push_item(Kind.STRING, value)

    def _push_item(self, kind: Kind, value: str) -> None:
        line_start = self.ilstart + 1 if self.input[self.ilstart : self.ilstart + 1] == "\n" else self.ilstart
        col = self.pos - len(value) - line_start + 1
        self.items.append(Item(kind, value, self.line, max(col, 1)))
        self.start = self.pos
        self.ilstart = self.lstart

    def _add_current_part(self, offset: int) -> None:
        self.parts.append(self.input[self.start : self.pos - offset])
        self.start = self.pos

    def _add_part(self, s: str) -> State:
        self.parts.append(s)
        self.start = self.pos
        return self.string_state

    def _error(self, message: str) -> None:
        line_start = self.lstart + 1 if self.input[self.lstart : self.lstart + 1] == "\n" else self.lstart
        self.items.append(Item(Kind.ERROR, message, self.line, self.pos - line_start))
        return None

    def _pop(self) -> State | None:
        if not self.stack:
            return self._error("BUG in lexer: no states to pop")
        return self.stack.pop()

    def _skip(self, then: State) -> State:
        def skipping() -> State:
            self._ignore()
            return then

        return skipping

    def _eof_or_error(self) -> None:
        if self.pos > self.start:
            return self._error("Unexpected EOF.")
        self._emit(Kind.EOF)
        return None

    def _comment_follows(self, r: str | None, then: State) -> State | None:
        """After `#`, or `/` followed by `/`: a comment, then `then`; else None (the `/` is backed up)."""
        if r == "#":
            self.stack.append(then)
            return self._comment_start
        if r == "/":
            if self._next() == "/":
                self.stack.append(then)
                return self._comment_start
            self._backup()
        return None

    # -- top level and `{ … }` around the whole document ----------------------------------------

    def _top(self) -> State | None:
        r = self._next()
        if _space(r):
            return self._skip(self._top)
        if r == "{":
            self.stack.append(self._top)
            return self._skip(self._block_start)
        comment = self._comment_follows(r, self._top)
        if comment is not None:
            return comment
        if r == "/" or r is EOF:
            return self._eof_or_error()
        self._backup()
        self.stack.append(self._top_value_end)
        return self._key_start

    def _top_value_end(self) -> State | None:
        r = self._next()
        comment = self._comment_follows(r, self._top)
        if comment is not None:
            return comment
        if r == "/" or _ws(r):
            return self._top_value_end
        if _nl(r) or r is EOF or r in (";", ",", "}"):
            self._ignore()
            return self._top
        return self._error(f"Expected a top-level value to end with a new line, comment or EOF, but got '{_show(r)}' instead.")

    def _block_start(self) -> State | None:
        r = self._next()
        if _space(r):
            return self._skip(self._block_start)
        if r == "{":
            self.stack.append(self._block_end)
            return self._skip(self._block_start)
        if r == "}":
            self._ignore()
            return self._pop()
        comment = self._comment_follows(r, self._block_start)
        if comment is not None:
            return comment
        if r == "/" or r is EOF:
            return self._eof_or_error()
        self._backup()
        self.stack.append(self._block_value_end)
        return self._key_start

    def _block_value_end(self) -> State | None:
        r = self._next()
        comment = self._comment_follows(r, self._block_value_end)
        if comment is not None:
            return comment
        if r == "/" or _ws(r):
            return self._block_value_end
        if _nl(r) or r in (";", ","):
            self._ignore()
            return self._block_start
        if r == "}":
            self._backup()
            return self._block_end
        return self._error(f"Expected a block-level value to end with a new line, comment or EOF, but got '{_show(r)}' instead.")

    def _block_end(self) -> State | None:
        r = self._next()
        comment = self._comment_follows(r, self._block_start)
        if comment is not None:
            return comment
        if r == "/" or _nl(r) or _ws(r):
            return self._block_end
        if r in (";", ","):
            self._ignore()
            return self._block_start
        if r == "}":
            self._ignore()
            return self._pop()
        return self._error(f"Expected a block-level to end with a '}}', but got '{_show(r)}' instead.")

    # -- keys -----------------------------------------------------------------------------------

    def _key_start(self) -> State | None:
        r = self._peek()
        if _key_sep(r):
            return self._error(f"Unexpected key separator '{_show(r)}'")
        if _space(r):
            self._next()
            return self._skip(self._key_start)
        if r == '"':
            self._next()
            return self._skip(self._quoted_key('"', self._key_end, top=True))
        if r == "'":
            self._next()
            return self._skip(self._quoted_key("'", self._key_end, top=True))
        self._ignore()
        self._next()
        return self._key

    def _quoted_key(self, quote: str, then: State, top: bool) -> State:
        def quoted_key() -> State | None:
            r = self._peek()
            if r == quote:
                self._emit(Kind.KEY)
                self._next()
                return self._skip(then)
            if r is EOF:
                if top:
                    return self._eof_or_error()
                return self._error("Unexpected EOF processing quoted map key.")
            self._next()
            return quoted_key

        return quoted_key

    def _key(self) -> State | None:
        r = self._peek()
        if _space(r):
            return self._keyword_or_key(self._key_end, None)
        if _key_sep(r) or r is EOF:
            self._emit(Kind.KEY)
            return self._key_end
        self._next()
        return self._key

    def _keyword_or_key(self, fall_through: State, push: State | None) -> State:
        """A key followed by whitespace may be the `include` keyword."""
        if self.input[self.start : self.pos].lower() == "include":
            self._ignore()
            if push is not None:
                self.stack.append(push)
            return self._include_start
        self._emit(Kind.KEY)
        return fall_through

    def _key_end(self) -> State | None:
        r = self._next()
        if _space(r):
            return self._skip(self._key_end)
        if _key_sep(r):
            return self._skip(self._value)
        if r is EOF:
            self._emit(Kind.EOF)
            return None
        self._backup()
        return self._value

    # -- include --------------------------------------------------------------------------------

    def _include_start(self) -> State | None:
        r = self._next()
        if _ws(r):
            return self._skip(self._include_start)
        self._backup()
        return self._include

    def _include(self) -> State | None:
        r = self._next()
        if r in ("'", '"'):
            self._ignore()
            return self._include_quoted(r)
        refused = {"[": "start of an array", "{": "start of a map", "(": "start of a block", "\\": "escape sequence"}
        if r in refused:
            return self._error(f"Expected include value but found {refused[r]}")
        if _digit(r) or r == "-":
            return self._error("Expected include value but found start of a number")
        if _nl(r):
            return self._error("Expected include value but found new line")
        self._backup()
        return self._include_bare

    def _include_quoted(self, quote: str) -> State:
        def include_quoted() -> State | None:
            r = self._next()
            if r == quote:
                self._backup()
                self._emit(Kind.INCLUDE)
                self._next()
                self._ignore()
                return self._pop()
            if r is EOF:
                return self._error("Unexpected EOF in " + ("double quoted" if quote == '"' else "quoted") + " include")
            return include_quoted

        return include_quoted

    def _include_bare(self) -> State | None:
        r = self._next()
        if _nl(r) or r is EOF or r in (";", "}") or _ws(r):
            self._backup()
            self._emit(Kind.INCLUDE)
            return self._pop()
        if r == "'":
            self._backup()
            self._emit(Kind.INCLUDE)
            self._next()
            self._ignore()
            return self._pop()
        return self._include_bare

    # -- values ---------------------------------------------------------------------------------

    def _value(self) -> State | None:
        r = self._next()
        if _ws(r):
            return self._skip(self._value)
        if r == "[":
            self._ignore()
            self._emit(Kind.ARRAY_START)
            return self._array_value
        if r == "{":
            self._ignore()
            self._emit(Kind.MAP_START)
            return self._map_key_start
        if r == "'":
            self._ignore()
            return self._raw_string
        if r == '"':
            self._ignore()
            self.string_state = self._dq_string
            return self._dq_string
        if r == "-":
            return self._neg_number_start
        if r == "(":
            self._ignore()
            return self._block
        if _digit(r):
            self._backup()
            return self._number_or_string_start
        if r == ".":
            return self._error("Floats must start with a digit")
        if _nl(r):
            return self._error("Expected value but found new line")
        self._backup()
        self.string_state = self._string
        return self._string

    def _array_value(self) -> State | None:
        r = self._next()
        if _space(r):
            return self._skip(self._array_value)
        comment = self._comment_follows(r, self._array_value)
        if comment is not None:
            return comment
        if r == "/" or r == ",":
            return self._error("Unexpected array value terminator ','.")
        if r == "]":
            return self._array_end
        self._backup()
        self.stack.append(self._array_value_end)
        return self._value

    def _array_value_end(self) -> State | None:
        r = self._next()
        if _ws(r):
            return self._skip(self._array_value_end)
        comment = self._comment_follows(r, self._array_value_end)
        if comment is not None:
            return comment
        if r == "/" or r == "," or _nl(r):
            return self._skip(self._array_value)
        if r == "]":
            return self._array_end
        return self._error(f"Expected an array value terminator ',' or an array terminator ']', but got '{_show(r)}' instead.")

    def _array_end(self) -> State | None:
        self._ignore()
        self._emit(Kind.ARRAY_END)
        return self._pop()

    def _map_key_start(self) -> State | None:
        r = self._peek()
        if _key_sep(r):
            return self._error(f"Unexpected key separator '{_show(r)}'.")
        if r == "]":
            return self._error(f"Unexpected array end '{_show(r)}' processing map.")
        if _space(r):
            self._next()
            return self._skip(self._map_key_start)
        if r == "}":
            self._next()
            return self._skip(self._map_end)
        if r == "#":
            self._next()
            self.stack.append(self._map_key_start)
            return self._comment_start
        if r == "/":
            self._next()
            if self._next() == "/":
                self.stack.append(self._map_key_start)
                return self._comment_start
            self._backup()
        elif r in ("'", '"'):
            self._next()
            return self._skip(self._quoted_key(r, self._map_key_end, top=False))
        elif r is EOF:
            return self._error("Unexpected EOF processing map.")
        self._ignore()
        self._next()
        return self._map_key

    def _map_key(self) -> State | None:
        r = self._peek()
        if r is EOF:
            return self._error("Unexpected EOF processing map key.")
        if _space(r):
            return self._keyword_or_key(self._map_key_end, self._map_value_end)
        if _key_sep(r):
            self._emit(Kind.KEY)
            return self._map_key_end
        self._next()
        return self._map_key

    def _map_key_end(self) -> State | None:
        r = self._next()
        if _space(r):
            return self._skip(self._map_key_end)
        if _key_sep(r):
            return self._skip(self._map_value)
        self._backup()
        return self._map_value

    def _map_value(self) -> State | None:
        r = self._next()
        if _space(r):
            return self._skip(self._map_value)
        if r == ",":
            return self._error("Unexpected map value terminator ','.")
        if r == "}":
            return self._skip(self._map_end)
        self._backup()
        self.stack.append(self._map_value_end)
        return self._value

    def _map_value_end(self) -> State | None:
        r = self._next()
        if _ws(r):
            return self._skip(self._map_value_end)
        comment = self._comment_follows(r, self._map_value_end)
        if comment is not None:
            return comment
        if r == "/" or r in (";", ",") or _nl(r):
            return self._skip(self._map_key_start)
        if r == "}":
            return self._skip(self._map_end)
        return self._error(f"Expected a map value terminator ',' or a map terminator '}}', but got '{_show(r)}' instead.")

    def _map_end(self) -> State | None:
        self._ignore()
        self._emit(Kind.MAP_END)
        return self._pop()

    # -- strings --------------------------------------------------------------------------------

    def _raw_string(self) -> State | None:
        r = self._next()
        if r == "'":
            self._backup()
            self._emit(Kind.STRING)
            self._next()
            self._ignore()
            return self._pop()
        if r is EOF:
            return self._eof_or_error()
        return self._raw_string

    def _dq_string(self) -> State | None:
        r = self._next()
        if r == "\\":
            self._add_current_part(1)
            return self._escape
        if r == '"':
            self._backup()
            self._emit_string()
            self._next()
            self._ignore()
            return self._pop()
        if r is EOF:
            return self._eof_or_error()
        return self._dq_string

    def _string(self) -> State | None:
        r = self._next()
        if r == "\\":
            self._add_current_part(1)
            return self._escape
        if _nl(r) or r is EOF or r in (";", ",", "]", "}") or _ws(r):
            self._backup()
            text = self.input[self.start : self.pos]
            if self.parts:
                self._emit_string()
            elif text.lower() in ("true", "false", "on", "off", "yes", "no"):
                self._emit(Kind.BOOL)
            elif text.startswith("$"):
                self.start += 1
                self._emit(Kind.VARIABLE)
            else:
                self._emit_string()
            return self._pop()
        if r == "'":
            self._backup()
            self._emit_string()
            self._next()
            self._ignore()
            return self._pop()
        return self._string

    def _block(self) -> State | None:
        """`( … )` up to a `)` alone on its line; the text between is kept as it is."""
        r = self._next()
        if r == ")":
            self._backup()
            self._backup()
            if self._next() != "\n":
                self._next()
                return self._block
            self._next()
            if self._next() in ("\n", EOF):
                self._backup()
                self._backup()
                self._emit(Kind.STRING)
                self._next()
                self._ignore()
                return self._pop()
            self._backup()
        elif r is EOF:
            return self._error("Unexpected EOF processing block.")
        return self._block

    def _escape(self) -> State | None:
        r = self._next()
        if r == "x":
            return self._hex_byte
        if r in _ESCAPES:
            return self._add_part(_ESCAPES[r])
        return self._error(
            f"Invalid escape character '{_show(r)}'. Only the following escape characters are allowed: "
            "\\xXX, \\t, \\n, \\r, \\\", \\\\."
        )

    def _hex_byte(self) -> State | None:
        for _ in range(2):
            if _nl(self._next()):
                return self._error("Expected two hexadecimal digits after '\\x', but hit end of line")
        digits = self.input[self.pos - 2 : self.pos]
        try:
            value = bytes.fromhex(digits)
        except ValueError:
            return self._error(f"Expected two hexadecimal digits after '\\x', but got '{digits}'")
        self.parts.append(value.decode("latin-1"))
        self.start = self.pos
        return self.string_state

    # -- numbers, dates, addresses ---------------------------------------------------------------

    def _number_or_string_start(self) -> State | None:
        r = self._next()
        if not _digit(r):
            if r == ".":
                return self._error("Floats must start with a digit, not '.'.")
            return self._error(f"Expected a digit but got '{_show(r)}'.")
        return self._number_or_string

    def _number_or_string(self) -> State | None:
        r = self._next()
        if r == "-":
            if self.pos - self.start != 5:
                return self._error("All ISO8601 dates must be in full Zulu form.")
            return self._datetime
        if _digit(r):
            return self._number_or_string
        if r == ".":
            return self._float_start
        if r in _NUMBER_SUFFIXES:
            return self._convenient_number
        if not (_nl(r) or r is EOF or r in ("}", ";", ",") or _ws(r)):
            self.string_state = self._string
            return self._string
        self._backup()
        self._emit(Kind.INTEGER)
        return self._pop()

    def _convenient_number(self) -> State | None:
        """A size suffix: `1k`, `1Mb`, `2GiB`; anything else after it makes the value a string (`1h`,
        `1e6`: nats-server 2.15.1 reads that as a string, whatever its source's main branch does)."""
        r = self._next()
        if r in ("b", "B", "i", "I"):
            return self._convenient_number
        self._backup()
        if _nl(r) or r is EOF or r in ("}", ";", ",") or _ws(r):
            self._emit(Kind.INTEGER)
            return self._pop()
        self.string_state = self._string
        return self._string

    def _datetime(self) -> State | None:
        for expected in _DATETIME:
            r = self._next()
            if expected == "0":
                if not _digit(r):
                    return self._error(f"Expected digit in ISO8601 datetime, but found '{_show(r)}' instead.")
            elif r != expected:
                return self._error(f"Expected '{expected}' in ISO8601 datetime, but found '{_show(r)}' instead.")
        self._emit(Kind.DATETIME)
        return self._pop()

    def _neg_number_start(self) -> State | None:
        r = self._next()
        if not _digit(r):
            if r == ".":
                return self._error("Floats must start with a digit, not '.'.")
            return self._error(f"Expected a digit but got '{_show(r)}'.")
        return self._neg_number

    def _neg_number(self) -> State | None:
        r = self._next()
        if _digit(r):
            return self._neg_number
        if r == ".":
            return self._float_start
        if r in _NUMBER_SUFFIXES:
            return self._convenient_number
        self._backup()
        self._emit(Kind.INTEGER)
        return self._pop()

    def _float_start(self) -> State | None:
        r = self._next()
        if not _digit(r):
            return self._error(f"Floats must have a digit after the '.', but got '{_show(r)}' instead.")
        return self._float

    def _float(self) -> State | None:
        r = self._next()
        if _digit(r):
            return self._float
        if r == ".":
            return self._ip_address
        self._backup()
        self._emit(Kind.FLOAT)
        return self._pop()

    def _ip_address(self) -> State | None:
        r = self._next()
        if _digit(r) or r in (".", ":", "-"):
            return self._ip_address
        self._backup()
        self._emit(Kind.STRING)
        return self._pop()

    # -- comments -------------------------------------------------------------------------------

    def _comment_start(self) -> State | None:
        self._ignore()
        self._emit(Kind.COMMENT_START)
        return self._comment

    def _comment(self) -> State | None:
        r = self._peek()
        if _nl(r) or r is EOF:
            self._emit(Kind.TEXT)
            return self._pop()
        self._next()
        return self._comment


def _show(r: str | None) -> str:
    if r is EOF:
        return "EOF"
    return "\\n" if r == "\n" else r
