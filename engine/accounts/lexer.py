"""The lexer of nats-server's configuration language: text in, items (keys, values, brackets) out.

A port of nats-server's state machine, state for state, so that what its lexer accepts, refuses or
reads differently is the same here: `=`, `:` or whitespace between key and value; newline, `;` or
`,` ending an entry; `#` and `//` comments (but `abc#def` is one bare value); arrays; maps; double-
quoted strings with `\\t \\n \\r \\" \\\\ \\xHH` escapes; raw single-quoted strings; bare strings; `( … )`
blocks whose `)` stands alone on a line; numbers with size suffixes; booleans; `$variables`;
Zulu datetimes; `include <path>`.

This module holds the states of the structure (the document, keys, `include`, arrays, maps,
comments); the scalar values' states are engine/accounts/scalars.py's and the position and item
bookkeeping they share is engine/accounts/scanner.py's. Counterpart: conf/lex.go.
"""

from __future__ import annotations

from engine.accounts.scalars import bare_string, block, dq_string, neg_number_start, number_or_string_start, raw_string
from engine.accounts.scanner import EOF, Item, Kind, Scanner, State, is_digit, is_nl, is_ws, show


def _space(r: str | None) -> bool:
    return r is not None and r.isspace()


def _key_sep(r: str | None) -> bool:
    return r in ("=", ":")


class Lexer:
    """`next_item()` until an item of kind EOF or ERROR."""

    def __init__(self, text: str) -> None:
        self.scanner = Scanner(text, bare_string)
        self.state: State | None = _top

    def next_item(self) -> Item:
        scanner = self.scanner
        while not scanner.items:
            if self.state is None:
                return Item(Kind.ERROR, "BUG in lexer: no state", scanner.line, 0)
            self.state = self.state(scanner)
        return scanner.items.popleft()


def _comment_follows(s: Scanner, r: str | None, then: State) -> State | None:
    """After `#`, or `/` followed by `/`: a comment, then `then`; else None (the `/` is backed up)."""
    if r == "#":
        s.stack.append(then)
        return _comment_start
    if r == "/":
        if s.next() == "/":
            s.stack.append(then)
            return _comment_start
        s.backup()
    return None


# -- top level and `{ … }` around the whole document ----------------------------------------

def _top(s: Scanner) -> State | None:
    r = s.next()
    if _space(r):
        return s.skip(_top)
    if r == "{":
        s.stack.append(_top)
        return s.skip(_block_start)
    comment = _comment_follows(s, r, _top)
    if comment is not None:
        return comment
    if r == "/" or r is EOF:
        return s.eof_or_error()
    s.backup()
    s.stack.append(_top_value_end)
    return _key_start


def _top_value_end(s: Scanner) -> State | None:
    r = s.next()
    comment = _comment_follows(s, r, _top)
    if comment is not None:
        return comment
    if r == "/" or is_ws(r):
        return _top_value_end
    if is_nl(r) or r is EOF or r in (";", ",", "}"):
        s.ignore()
        return _top
    return s.error(f"Expected a top-level value to end with a new line, comment or EOF, but got '{show(r)}' instead.")


def _block_start(s: Scanner) -> State | None:
    r = s.next()
    if _space(r):
        return s.skip(_block_start)
    if r == "{":
        s.stack.append(_block_end)
        return s.skip(_block_start)
    if r == "}":
        s.ignore()
        return s.pop()
    comment = _comment_follows(s, r, _block_start)
    if comment is not None:
        return comment
    if r == "/" or r is EOF:
        return s.eof_or_error()
    s.backup()
    s.stack.append(_block_value_end)
    return _key_start


def _block_value_end(s: Scanner) -> State | None:
    r = s.next()
    comment = _comment_follows(s, r, _block_value_end)
    if comment is not None:
        return comment
    if r == "/" or is_ws(r):
        return _block_value_end
    if is_nl(r) or r in (";", ","):
        s.ignore()
        return _block_start
    if r == "}":
        s.backup()
        return _block_end
    return s.error(f"Expected a block-level value to end with a new line, comment or EOF, but got '{show(r)}' instead.")


def _block_end(s: Scanner) -> State | None:
    r = s.next()
    comment = _comment_follows(s, r, _block_start)
    if comment is not None:
        return comment
    if r == "/" or is_nl(r) or is_ws(r):
        return _block_end
    if r in (";", ","):
        s.ignore()
        return _block_start
    if r == "}":
        s.ignore()
        return s.pop()
    return s.error(f"Expected a block-level to end with a '}}', but got '{show(r)}' instead.")


# -- keys -----------------------------------------------------------------------------------

def _key_start(s: Scanner) -> State | None:
    r = s.peek()
    if _key_sep(r):
        return s.error(f"Unexpected key separator '{show(r)}'")
    if _space(r):
        s.next()
        return s.skip(_key_start)
    if r == '"':
        s.next()
        return s.skip(_quoted_key('"', _key_end, top=True))
    if r == "'":
        s.next()
        return s.skip(_quoted_key("'", _key_end, top=True))
    s.ignore()
    s.next()
    return _key


def _quoted_key(quote: str, then: State, top: bool) -> State:
    def quoted_key(s: Scanner) -> State | None:
        r = s.peek()
        if r == quote:
            s.emit(Kind.KEY)
            s.next()
            return s.skip(then)
        if r is EOF:
            if top:
                return s.eof_or_error()
            return s.error("Unexpected EOF processing quoted map key.")
        s.next()
        return quoted_key

    return quoted_key


def _key(s: Scanner) -> State | None:
    r = s.peek()
    if _space(r):
        return _keyword_or_key(s, _key_end, None)
    if _key_sep(r) or r is EOF:
        s.emit(Kind.KEY)
        return _key_end
    s.next()
    return _key


def _keyword_or_key(s: Scanner, fall_through: State, push: State | None) -> State:
    """A key followed by whitespace may be the `include` keyword."""
    if s.input[s.start : s.pos].lower() == "include":
        s.ignore()
        if push is not None:
            s.stack.append(push)
        return _include_start
    s.emit(Kind.KEY)
    return fall_through


def _key_end(s: Scanner) -> State | None:
    r = s.next()
    if _space(r):
        return s.skip(_key_end)
    if _key_sep(r):
        return s.skip(_value)
    if r is EOF:
        s.emit(Kind.EOF)
        return None
    s.backup()
    return _value


# -- include --------------------------------------------------------------------------------

def _include_start(s: Scanner) -> State | None:
    r = s.next()
    if is_ws(r):
        return s.skip(_include_start)
    s.backup()
    return _include


def _include(s: Scanner) -> State | None:
    r = s.next()
    if r in ("'", '"'):
        s.ignore()
        return _include_quoted(r)
    refused = {"[": "start of an array", "{": "start of a map", "(": "start of a block", "\\": "escape sequence"}
    if r in refused:
        return s.error(f"Expected include value but found {refused[r]}")
    if is_digit(r) or r == "-":
        return s.error("Expected include value but found start of a number")
    if is_nl(r):
        return s.error("Expected include value but found new line")
    s.backup()
    return _include_bare


def _include_quoted(quote: str) -> State:
    def include_quoted(s: Scanner) -> State | None:
        r = s.next()
        if r == quote:
            s.backup()
            s.emit(Kind.INCLUDE)
            s.next()
            s.ignore()
            return s.pop()
        if r is EOF:
            return s.error("Unexpected EOF in " + ("double quoted" if quote == '"' else "quoted") + " include")
        return include_quoted

    return include_quoted


def _include_bare(s: Scanner) -> State | None:
    r = s.next()
    if is_nl(r) or r is EOF or r in (";", "}") or is_ws(r):
        s.backup()
        s.emit(Kind.INCLUDE)
        return s.pop()
    if r == "'":
        s.backup()
        s.emit(Kind.INCLUDE)
        s.next()
        s.ignore()
        return s.pop()
    return _include_bare


# -- values, arrays, maps -------------------------------------------------------------------

def _value(s: Scanner) -> State | None:
    r = s.next()
    if is_ws(r):
        return s.skip(_value)
    if r == "[":
        s.ignore()
        s.emit(Kind.ARRAY_START)
        return _array_value
    if r == "{":
        s.ignore()
        s.emit(Kind.MAP_START)
        return _map_key_start
    if r == "'":
        s.ignore()
        return raw_string
    if r == '"':
        s.ignore()
        s.string_state = dq_string
        return dq_string
    if r == "-":
        return neg_number_start
    if r == "(":
        s.ignore()
        return block
    if is_digit(r):
        s.backup()
        return number_or_string_start
    if r == ".":
        return s.error("Floats must start with a digit")
    if is_nl(r):
        return s.error("Expected value but found new line")
    s.backup()
    s.string_state = bare_string
    return bare_string


def _array_value(s: Scanner) -> State | None:
    r = s.next()
    if _space(r):
        return s.skip(_array_value)
    comment = _comment_follows(s, r, _array_value)
    if comment is not None:
        return comment
    if r == "/" or r == ",":
        return s.error("Unexpected array value terminator ','.")
    if r == "]":
        return _array_end
    s.backup()
    s.stack.append(_array_value_end)
    return _value


def _array_value_end(s: Scanner) -> State | None:
    r = s.next()
    if is_ws(r):
        return s.skip(_array_value_end)
    comment = _comment_follows(s, r, _array_value_end)
    if comment is not None:
        return comment
    if r == "/" or r == "," or is_nl(r):
        return s.skip(_array_value)
    if r == "]":
        return _array_end
    return s.error(f"Expected an array value terminator ',' or an array terminator ']', but got '{show(r)}' instead.")


def _array_end(s: Scanner) -> State | None:
    s.ignore()
    s.emit(Kind.ARRAY_END)
    return s.pop()


def _map_key_start(s: Scanner) -> State | None:
    r = s.peek()
    if _key_sep(r):
        return s.error(f"Unexpected key separator '{show(r)}'.")
    if r == "]":
        return s.error(f"Unexpected array end '{show(r)}' processing map.")
    if _space(r):
        s.next()
        return s.skip(_map_key_start)
    if r == "}":
        s.next()
        return s.skip(_map_end)
    if r == "#":
        s.next()
        s.stack.append(_map_key_start)
        return _comment_start
    if r == "/":
        s.next()
        if s.next() == "/":
            s.stack.append(_map_key_start)
            return _comment_start
        s.backup()
    elif r in ("'", '"'):
        s.next()
        return s.skip(_quoted_key(r, _map_key_end, top=False))
    elif r is EOF:
        return s.error("Unexpected EOF processing map.")
    s.ignore()
    s.next()
    return _map_key


def _map_key(s: Scanner) -> State | None:
    r = s.peek()
    if r is EOF:
        return s.error("Unexpected EOF processing map key.")
    if _space(r):
        return _keyword_or_key(s, _map_key_end, _map_value_end)
    if _key_sep(r):
        s.emit(Kind.KEY)
        return _map_key_end
    s.next()
    return _map_key


def _map_key_end(s: Scanner) -> State | None:
    r = s.next()
    if _space(r):
        return s.skip(_map_key_end)
    if _key_sep(r):
        return s.skip(_map_value)
    s.backup()
    return _map_value


def _map_value(s: Scanner) -> State | None:
    r = s.next()
    if _space(r):
        return s.skip(_map_value)
    if r == ",":
        return s.error("Unexpected map value terminator ','.")
    if r == "}":
        return s.skip(_map_end)
    s.backup()
    s.stack.append(_map_value_end)
    return _value


def _map_value_end(s: Scanner) -> State | None:
    r = s.next()
    if is_ws(r):
        return s.skip(_map_value_end)
    comment = _comment_follows(s, r, _map_value_end)
    if comment is not None:
        return comment
    if r == "/" or r in (";", ",") or is_nl(r):
        return s.skip(_map_key_start)
    if r == "}":
        return s.skip(_map_end)
    return s.error(f"Expected a map value terminator ',' or a map terminator '}}', but got '{show(r)}' instead.")


def _map_end(s: Scanner) -> State | None:
    s.ignore()
    s.emit(Kind.MAP_END)
    return s.pop()


# -- comments -------------------------------------------------------------------------------

def _comment_start(s: Scanner) -> State | None:
    s.ignore()
    s.emit(Kind.COMMENT_START)
    return _comment


def _comment(s: Scanner) -> State | None:
    r = s.peek()
    if is_nl(r) or r is EOF:
        s.emit(Kind.TEXT)
        return s.pop()
    s.next()
    return _comment


__all__ = ["EOF", "Item", "Kind", "Lexer"]
