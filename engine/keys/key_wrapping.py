"""How one stream's keys are made and opened: each is random, wrapped under its account's
key-encryption key and bound (as associated data) to the account, the stream and its own record, so a
wrapped key moved to another record, stream or account does not unwrap; and the keyed tag that names a
subject prefix in the stream's key file without writing the prefix down.
"""

from __future__ import annotations

import hmac
import os
from functools import lru_cache

from engine.clock import Clock
from engine.keys import crypto, keyfile
from engine.keys.cipher import DATA_KEY_SIZE
from engine.keys.errors import KeyringCorruptError
from engine.keys.keyfile import KeyRecord
from engine.keys.master import AccountKeys


class KeyWrapping:
    """The account's keys as one stream (by stream id) uses them; `path` names its key file in errors."""

    def __init__(self, account: str, stream_id: str, keys: AccountKeys, clock: Clock, path: str) -> None:
        self.account = account
        self.stream_id = stream_id
        self._keys = keys
        self._clock = clock
        self._path = path
        self.tag = lru_cache(maxsize=65536)(self.compute_tag)

    def unwrap(self, record: KeyRecord) -> bytes:
        try:
            return self._keys.kek.unwrap(record.wrapped, keyfile.key_aad(self.account, self.stream_id, record))
        except crypto.InvalidTag:
            raise KeyringCorruptError(f"{self._path}: key {record.key_id} does not unwrap (tampered)") from None

    def compute_tag(self, prefix: str) -> bytes:
        """The prefix's tag, uncached; `tag` is the same, cached."""
        message = self.stream_id.encode() + b"\x00" + prefix.encode()
        return hmac.digest(self._keys.tag_key, message, "sha256")[: keyfile.TAG_SIZE]

    def new_record(self, key_id: int, epoch: int, purpose: int, tag: bytes) -> KeyRecord:
        """A new random key, wrapped for its record."""
        draft = KeyRecord(key_id, epoch, purpose, tag, self._clock.now_ns(), b"")
        wrapped = self._keys.kek.wrap(os.urandom(DATA_KEY_SIZE), keyfile.key_aad(self.account, self.stream_id, draft))
        return KeyRecord(key_id, epoch, purpose, tag, draft.created_ns, wrapped)
