"""The sublist: literal and wildcard interest, queue groups, and a cache that never answers stale."""

from __future__ import annotations

from typing import Any

from api.nats.subscriptions import FORGET_WHOLE, Sublist, Subscription


def _sub(subject: str, queue: str | None = None, sid: bytes = b"1") -> Subscription:
    return Subscription(None, subject, queue, sid)  # type: ignore[arg-type]


def _subjects(match: Any) -> list[str]:
    return sorted([s.subject for s in match.plain] + [s.subject + "@" + (s.queue or "") for g in match.groups for s in g])


def test_literal_and_wildcard_matches() -> None:
    sl = Sublist()
    for subject in ("a.b", "a.*", "a.>", ">", "*.b", "a.b.c", "x"):
        sl.insert(_sub(subject))
    assert _subjects(sl.match("a.b")) == sorted(["a.b", "a.*", "a.>", ">", "*.b"])
    assert _subjects(sl.match("a.b.c")) == sorted(["a.>", ">", "a.b.c"])
    assert _subjects(sl.match("a")) == [">"]
    assert _subjects(sl.match("q.b")) == sorted([">", "*.b"])


def test_published_wildcard_tokens_are_literals_only_wildcards_match() -> None:
    sl = Sublist()
    for subject in ("a.*", "a.>", "a.b"):
        sl.insert(_sub(subject))
    assert _subjects(sl.match("a.*")) == ["a.*", "a.>"]
    assert _subjects(sl.match("a.>")) == ["a.*", "a.>"]


def test_queue_groups_are_grouped() -> None:
    sl = Sublist()
    sl.insert(_sub("q", "g1", b"1"))
    sl.insert(_sub("q", "g1", b"2"))
    sl.insert(_sub("q", "g2", b"3"))
    sl.insert(_sub("q", None, b"4"))
    match = sl.match("q")
    assert [s.sid for s in match.plain] == [b"4"]
    assert sorted(len(g) for g in match.groups) == [1, 2]


def test_cache_follows_inserts_and_removals() -> None:
    sl = Sublist()
    assert not sl.match("a.b")
    wild = _sub("a.*")
    sl.insert(wild)
    assert _subjects(sl.match("a.b")) == ["a.*"]
    literal = _sub("a.b", sid=b"2")
    sl.insert(literal)
    assert _subjects(sl.match("a.b")) == ["a.*", "a.b"]
    sl.remove(wild)
    assert _subjects(sl.match("a.b")) == ["a.b"]
    sl.remove(literal)
    assert not sl.match("a.b") and sl.count == 0
    sl.remove(literal)  # twice: nothing happens
    assert sl.count == 0


def test_a_wildcard_interest_reaches_subjects_of_a_full_cache() -> None:
    """Past FORGET_WHOLE cached subjects a wildcard SUB drops the cache whole instead of testing each."""
    sl = Sublist()
    sl.insert(_sub("k.1", sid=b"1"))
    subjects = [f"k.{i}" for i in range(FORGET_WHOLE * 2)]
    for subject in subjects:
        sl.match(subject)
    wild = _sub("k.*", sid=b"2")
    sl.insert(wild)
    assert all("k.*" in _subjects(sl.match(subject)) for subject in subjects)
    sl.remove(wild)
    assert _subjects(sl.match("k.1")) == ["k.1"] and not sl.match("k.2")


def test_reply_inboxes_match_by_prefix_as_the_trie_matches_them() -> None:
    """`<literal>.*` subscriptions alone are matched through their prefix; any other wildcard brings the trie back."""
    sl = Sublist()
    inbox, other_inbox = _sub("_INBOX.a.*", sid=b"1"), _sub("_INBOX.b.*", sid=b"2")
    sl.insert(inbox)
    sl.insert(other_inbox)
    sl.insert(_sub("_INBOX.a.7", sid=b"3"))
    assert _subjects(sl.match("_INBOX.a.1")) == ["_INBOX.a.*"]
    assert _subjects(sl.match("_INBOX.a.7")) == ["_INBOX.a.*", "_INBOX.a.7"]
    assert _subjects(sl.match("_INBOX.a.*")) == ["_INBOX.a.*"]  # a published `*` is a literal token
    assert not sl.match("_INBOX.a") and not sl.match("_INBOX.a.1.2") and not sl.match("_INBOX.c.1")
    everything = _sub(">", sid=b"4")
    sl.insert(everything)
    assert _subjects(sl.match("_INBOX.a.2")) == [">", "_INBOX.a.*"]
    sl.remove(everything)
    sl.remove(inbox)
    assert not sl.match("_INBOX.a.3") and _subjects(sl.match("_INBOX.b.3")) == ["_INBOX.b.*"]
