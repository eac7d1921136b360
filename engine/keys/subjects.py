"""Subjects under encryption: which data key a subject selects, and protected partition values.

Key selection. A stream may declare how many leading subject tokens select a data key
(`key_tokens`): with 2, `users.42.profile` and `users.42.orders` share the key of `users.42`, and
destroying that key erases everything published under `users.42` at once. With 0 the stream has one
key per epoch (the prefix is "").

Protected subjects. A stream whose subjects are protected stores its subject column sealed and
partitions its table by a keyed hash of the partition prefix instead of the prefix itself:
`k` + the first 128 bits of HMAC-SHA256(the stream's subject key, prefix), in hex, a valid folder
name. Equal prefixes still share a partition, so a query by subject prunes files when it is given the
hash (`SubjectHasher.partition_value`); without the stream's key the folder names reveal only how
many distinct prefixes there are and how their messages are spread. Two prefixes whose hashes
collide merely share a folder: the subject column, not the partition, says what a message is.
"""

from __future__ import annotations

import hmac
from functools import lru_cache

WILDCARDS = frozenset({"*", ">"})
HASH_BYTES = 16
PARTITION_MARK = "k"


def key_prefix(subject: str, tokens: int) -> str:
    """The prefix that selects a subject's data key: its first `tokens` tokens ("" for 0)."""
    if tokens <= 0:
        return ""
    return ".".join(subject.split(".", tokens)[:tokens])


def key_prefix_of_filter(filter_subject: str, tokens: int) -> str | None:
    """The one key prefix every subject matching `filter_subject` has, or None when they may differ.

    Destroying that key erases every subject under the prefix, which may be more than the filter
    matches (`users.42.profile` leaves out `users.42.orders`, and `users.42.>` leaves out `users.42`):
    the caller destroys it only when the subjects stored under the prefix all match its request.
    """
    if tokens <= 0:
        return None
    head = filter_subject.split(".")[:tokens]
    if len(head) < tokens or WILDCARDS & set(head):
        return None
    return ".".join(head)


class SubjectHasher:
    """Keyed hashes of subject prefixes with one stream's subject key."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.partition_value = lru_cache(maxsize=65536)(self._partition_value)

    def digest(self, prefix: str) -> bytes:
        return hmac.digest(self._key, prefix.encode(), "sha256")[:HASH_BYTES]

    def _partition_value(self, prefix: str) -> str:
        """The partition value that stands for `prefix` in a protected stream's table."""
        return PARTITION_MARK + self.digest(prefix).hex()
