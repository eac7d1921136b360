"""NATS subjects: validation, wildcard matching, overlap and subset.

Subjects are `.`-separated tokens; `*` matches one token and `>` one or more trailing tokens, each only
as a whole token and only in filters, never in a publish subject. Counterpart: server/sublist.go.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

PWC = "*"
FWC = ">"
MAX_SUBJECT_LEN = 512
_BAD_CHARS = re.compile("[\x00-\x20\x7f]")  # whitespace, controls and DEL: one C scan, not a loop per character
_PUBLISH_TOKEN = r"[^.*>\x00-\x20\x7f]+"  # a literal token: no wildcard character, no bad character
_PUBLISH_SUBJECT = rf"^{_PUBLISH_TOKEN}(?:\.{_PUBLISH_TOKEN})*$"


def _has_bad_chars(subject: str) -> bool:
    return _BAD_CHARS.search(subject) is not None


@lru_cache(maxsize=65536)
def is_valid_subject(subject: str) -> bool:
    """A subject or filter: non-empty tokens, wildcards whole, `>` last, no whitespace or controls."""
    if not subject or len(subject) > MAX_SUBJECT_LEN or _has_bad_chars(subject):
        return False
    tokens = subject.split(".")
    for i, token in enumerate(tokens):
        if not token:
            return False
        if len(token) > 1 and (PWC in token or FWC in token):
            return False
        if token == FWC and i != len(tokens) - 1:
            return False
    return True


@lru_cache(maxsize=65536)
def is_valid_publish_subject(subject: str) -> bool:
    """A literal subject a message can be published to."""
    return is_valid_subject(subject) and is_literal(subject)


def is_literal(subject: str) -> bool:
    return all(token not in (PWC, FWC) for token in subject.split("."))


def match_tokens(filter_tokens: list[str] | tuple[str, ...], subject_tokens: list[str] | tuple[str, ...]) -> bool:
    for i, ft in enumerate(filter_tokens):
        if ft == FWC:
            return len(subject_tokens) > i
        if i >= len(subject_tokens):
            return False
        if ft != PWC and ft != subject_tokens[i]:
            return False
    return len(filter_tokens) == len(subject_tokens)


@lru_cache(maxsize=262144)
def subject_matches(filter_: str, subject: str) -> bool:
    """Whether the literal `subject` is matched by `filter_` (which may hold wildcards)."""
    if filter_ == subject or filter_ == FWC:
        return True
    return match_tokens(filter_.split("."), subject.split("."))


def subjects_collide(a: str, b: str) -> bool:
    """Whether some literal subject matches both patterns."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == FWC or y == FWC:
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if x != PWC and y != PWC and x != y:
            return False
    return True


def is_subset_match(sub: str, sup: str) -> bool:
    """Whether every subject matching `sub` also matches `sup`."""
    ts, tp = sub.split("."), sup.split(".")
    for i, p in enumerate(tp):
        if p == FWC:
            return len(ts) > i
        if i >= len(ts):
            return False
        s = ts[i]
        if s == FWC:
            return False
        if p == PWC:
            continue
        if s == PWC or s != p:
            return False
    return len(ts) == len(tp)


def any_match(filters: list[str] | tuple[str, ...], subject: str) -> bool:
    return any(subject_matches(f, subject) for f in filters)


def valid_publish_mask(subjects: pa.Array) -> np.ndarray:
    """`is_valid_publish_subject` of every value of an Arrow string column, in one regular-expression
    pass: a batch of a thousand new subjects does not fill the per-subject caches above (a million
    distinct subjects would keep ~150 MB of them alive)."""
    shape = pc.match_substring_regex(subjects, _PUBLISH_SUBJECT)
    short = pc.less_equal(pc.utf8_length(subjects), MAX_SUBJECT_LEN)
    return np.asarray(pc.and_(shape, short).to_numpy(zero_copy_only=False), np.bool_)


def matches_mask(filters: list[str], subjects: pa.Array) -> np.ndarray:
    """Which values of a column of valid literal subjects any of `filters` matches (`subject_matches`)."""
    mask = np.zeros(len(subjects), np.bool_)
    for filter_ in filters:
        mask |= np.asarray(pc.match_substring_regex(subjects, filter_regex(filter_)).to_numpy(zero_copy_only=False), np.bool_)
    return mask


def filter_regex(filter_: str) -> str:
    """The anchored regular expression of a subject filter over valid subjects: `*` one token, `>` one
    or more."""
    parts = []
    for token in filter_.split("."):
        if token == PWC:
            parts.append(r"[^.]+")
        elif token == FWC:
            parts.append(r".+")
        else:
            parts.append(re.escape(token))
    return "^" + r"\.".join(parts) + "$"
