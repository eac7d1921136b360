"""The config-file lexer's states for scalar values: strings (raw, double-quoted with escapes, bare),
`( … )` blocks, numbers with size suffixes, floats, IP addresses and Zulu datetimes.

Each state reads one value to its end and returns to the state on the scanner's stack; the structure
around values (keys, maps, arrays) is engine/accounts/lexer.py's. Counterpart: conf/lex.go
(lexString, lexDubQuotedString, lexQuotedString, lexBlock, lexNumberOrDateStart, lexDateAfterYear, …).
"""

from __future__ import annotations

from engine.accounts.scanner import EOF, Kind, Scanner, State, is_digit, is_nl, is_ws, show

_NUMBER_SUFFIXES = ("k", "K", "m", "M", "g", "G", "t", "T", "p", "P", "e", "E")
_DATETIME = "00-00T00:00:00Z"  # after "YYYY-": 0 = a digit, anything else itself
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", '"': '"', "\\": "\\"}


# -- strings --------------------------------------------------------------------------------

def raw_string(s: Scanner) -> State | None:
    r = s.next()
    if r == "'":
        s.backup()
        s.emit(Kind.STRING)
        s.next()
        s.ignore()
        return s.pop()
    if r is EOF:
        return s.eof_or_error()
    return raw_string


def dq_string(s: Scanner) -> State | None:
    r = s.next()
    if r == "\\":
        s.add_current_part(1)
        return _escape
    if r == '"':
        s.backup()
        s.emit_string()
        s.next()
        s.ignore()
        return s.pop()
    if r is EOF:
        return s.eof_or_error()
    return dq_string


def bare_string(s: Scanner) -> State | None:
    r = s.next()
    if r == "\\":
        s.add_current_part(1)
        return _escape
    if is_nl(r) or r is EOF or r in (";", ",", "]", "}") or is_ws(r):
        s.backup()
        text = s.input[s.start : s.pos]
        if s.parts:
            s.emit_string()
        elif text.lower() in ("true", "false", "on", "off", "yes", "no"):
            s.emit(Kind.BOOL)
        elif text.startswith("$"):
            s.start += 1
            s.emit(Kind.VARIABLE)
        else:
            s.emit_string()
        return s.pop()
    if r == "'":
        s.backup()
        s.emit_string()
        s.next()
        s.ignore()
        return s.pop()
    return bare_string


def block(s: Scanner) -> State | None:
    """`( … )` up to a `)` alone on its line; the text between is kept as it is."""
    r = s.next()
    if r == ")":
        s.backup()
        s.backup()
        if s.next() != "\n":
            s.next()
            return block
        s.next()
        if s.next() in ("\n", EOF):
            s.backup()
            s.backup()
            s.emit(Kind.STRING)
            s.next()
            s.ignore()
            return s.pop()
        s.backup()
    elif r is EOF:
        return s.error("Unexpected EOF processing block.")
    return block


def _escape(s: Scanner) -> State | None:
    r = s.next()
    if r == "x":
        return _hex_byte
    if r in _ESCAPES:
        return s.add_part(_ESCAPES[r])
    return s.error(
        f"Invalid escape character '{show(r)}'. Only the following escape characters are allowed: "
        "\\xXX, \\t, \\n, \\r, \\\", \\\\."
    )


def _hex_byte(s: Scanner) -> State | None:
    for _ in range(2):
        if is_nl(s.next()):
            return s.error("Expected two hexadecimal digits after '\\x', but hit end of line")
    digits = s.input[s.pos - 2 : s.pos]
    try:
        value = bytes.fromhex(digits)
    except ValueError:
        return s.error(f"Expected two hexadecimal digits after '\\x', but got '{digits}'")
    s.parts.append(value.decode("latin-1"))
    s.start = s.pos
    return s.string_state


# -- numbers, dates, addresses ---------------------------------------------------------------

def number_or_string_start(s: Scanner) -> State | None:
    r = s.next()
    if not is_digit(r):
        if r == ".":
            return s.error("Floats must start with a digit, not '.'.")
        return s.error(f"Expected a digit but got '{show(r)}'.")
    return _number_or_string


def _number_or_string(s: Scanner) -> State | None:
    r = s.next()
    if r == "-":
        if s.pos - s.start != 5:
            return s.error("All ISO8601 dates must be in full Zulu form.")
        return _datetime
    if is_digit(r):
        return _number_or_string
    if r == ".":
        return _float_start
    if r in _NUMBER_SUFFIXES:
        return _convenient_number
    if not (is_nl(r) or r is EOF or r in ("}", ";", ",") or is_ws(r)):
        s.string_state = bare_string
        return bare_string
    s.backup()
    s.emit(Kind.INTEGER)
    return s.pop()


def _convenient_number(s: Scanner) -> State | None:
    """A size suffix: `1k`, `1Mb`, `2GiB`; anything else after it makes the value a string (`1h`,
    `1e6`: nats-server 2.15.1 reads that as a string, whatever its source's main branch does)."""
    r = s.next()
    if r in ("b", "B", "i", "I"):
        return _convenient_number
    s.backup()
    if is_nl(r) or r is EOF or r in ("}", ";", ",") or is_ws(r):
        s.emit(Kind.INTEGER)
        return s.pop()
    s.string_state = bare_string
    return bare_string


def _datetime(s: Scanner) -> State | None:
    for expected in _DATETIME:
        r = s.next()
        if expected == "0":
            if not is_digit(r):
                return s.error(f"Expected digit in ISO8601 datetime, but found '{show(r)}' instead.")
        elif r != expected:
            return s.error(f"Expected '{expected}' in ISO8601 datetime, but found '{show(r)}' instead.")
    s.emit(Kind.DATETIME)
    return s.pop()


def neg_number_start(s: Scanner) -> State | None:
    r = s.next()
    if not is_digit(r):
        if r == ".":
            return s.error("Floats must start with a digit, not '.'.")
        return s.error(f"Expected a digit but got '{show(r)}'.")
    return _neg_number


def _neg_number(s: Scanner) -> State | None:
    r = s.next()
    if is_digit(r):
        return _neg_number
    if r == ".":
        return _float_start
    if r in _NUMBER_SUFFIXES:
        return _convenient_number
    s.backup()
    s.emit(Kind.INTEGER)
    return s.pop()


def _float_start(s: Scanner) -> State | None:
    r = s.next()
    if not is_digit(r):
        return s.error(f"Floats must have a digit after the '.', but got '{show(r)}' instead.")
    return _float


def _float(s: Scanner) -> State | None:
    r = s.next()
    if is_digit(r):
        return _float
    if r == ".":
        return _ip_address
    s.backup()
    s.emit(Kind.FLOAT)
    return s.pop()


def _ip_address(s: Scanner) -> State | None:
    r = s.next()
    if is_digit(r) or r in (".", ":", "-"):
        return _ip_address
    s.backup()
    s.emit(Kind.STRING)
    return s.pop()
