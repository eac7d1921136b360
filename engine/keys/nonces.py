"""Nonces for the values of data keys: 96 bits that never repeat under one key, handed out in batches.

AES-GCM fails badly when a nonce repeats under a key (the two plaintexts' XOR and the key's
authentication subkey leak). Random 96-bit nonces are only allowed up to 2^32 messages per key (NIST
SP 800-38D §8.3), which a busy stream's key reaches in hours. So the nonces follow the standard's
deterministic construction (§8.2.1), a fixed field and an invocation counter:

    nonce = writer id (u32, big-endian) ‖ 4 random bytes ‖ counter (u32, big-endian)

- The writer id is allocated from the account's keyring, made durable before its first use, so no two
  processes (nor two lives of one) ever share it; one id serves every key the writer uses.
- The counter lives in memory; when it runs out after 2^32 nonces, a new writer id is allocated.
- The 4 random bytes cover what the keyring cannot see: a keyring restored from a backup hands out an
  id a second time; two writers then collide only if their random bytes agree too (2^-32).
- A forked child would replay its parent's counter, so a change of process id allocates anew.

A batch of n nonces is one slice of an (n, 12) array: no Python-level work per message.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np

NONCE_SIZE = 12
COUNTER_LIMIT = 1 << 32


class NonceSource:
    """Hands out nonces; `allocate_writer` returns a fresh writer id, durably recorded."""

    def __init__(self, allocate_writer: Callable[[], int], counter_limit: int = COUNTER_LIMIT) -> None:
        self._allocate_writer = allocate_writer
        self._limit = min(counter_limit, COUNTER_LIMIT)
        self._lock = threading.Lock()
        self._prefix = np.zeros(8, np.uint8)
        self._prefix_bytes = bytes(8)
        self._counter = self._limit  # nothing allocated yet
        self._pid = -1

    def take(self, n: int) -> np.ndarray:
        """`n` fresh nonces as an (n, 12) array of bytes."""
        if not 0 <= n <= self._limit:
            raise ValueError(f"cannot hand out {n} nonces at once")
        if n == 0:
            return np.empty((0, NONCE_SIZE), np.uint8)
        with self._lock:
            if self._counter + n > self._limit or self._pid != os.getpid():
                self._new_writer()
            first = self._counter
            self._counter += n
            prefix = self._prefix
        nonces = np.empty((n, NONCE_SIZE), np.uint8)
        nonces[:, :8] = prefix
        nonces[:, 8:] = np.arange(first, first + n, dtype=">u4").view(np.uint8).reshape(n, 4)
        return nonces

    def take_bytes(self, n: int) -> bytes:
        """`n` fresh nonces joined (a few, for a single publish: no array)."""
        if not 0 <= n <= self._limit:
            raise ValueError(f"cannot hand out {n} nonces at once")
        with self._lock:
            if self._counter + n > self._limit or self._pid != os.getpid():
                self._new_writer()
            first = self._counter
            self._counter += n
            prefix = self._prefix_bytes
        return b"".join([prefix + counter.to_bytes(4, "big") for counter in range(first, first + n)])

    def one(self) -> bytes:
        return self.take_bytes(1)

    def _new_writer(self) -> None:
        writer = self._allocate_writer()
        if not 0 <= writer < COUNTER_LIMIT:
            raise ValueError(f"writer id {writer} does not fit in 32 bits")
        prefix = np.empty(8, np.uint8)
        prefix[:4] = np.frombuffer(writer.to_bytes(4, "big"), np.uint8)
        prefix[4:] = np.frombuffer(os.urandom(4), np.uint8)
        self._prefix = prefix
        self._prefix_bytes = prefix.tobytes()
        self._counter = 0
        self._pid = os.getpid()
