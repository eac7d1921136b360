"""What can go wrong with keys: refused keyrings at start, and values that cannot be opened.

Two kinds, as nats-server has them:
- A keyring that cannot be used (`KeyringError`): the wrong master key, a damaged or tampered file.
  nats-server logs `Error decrypting our stream metafile: unable to recover keys` and skips the
  stream; JetLake refuses to start the account instead, with a message that says which key and which
  file, and writes nothing, so starting again with the right key finds everything as it was.
- A value that cannot be opened: its key was destroyed (`KeyDestroyedError`, crypto-shredding, which
  the doors answer as an erased message: JetStream's "no message found"), or it fails authentication
  (`ValueAuthenticationError`: corrupted or tampered bytes, reported for that message only).

The value errors are `JetStreamError`s, so the doors render them like any other; they live here until
the integration moves them beside the others in engine/errors.py.
Counterpart: the errors of server/filestore.go's `loadEncryptionForMsgBlock` and jetstream.go's `decryptMeta`.
"""

from __future__ import annotations

from engine.errors import ErrorCode, JetStreamError, NoMessageFoundError


class KeyringError(Exception):
    """A keyring that cannot be used; nothing was written."""


class WrongMasterKeyError(KeyringError):
    """The master key given does not open the account's keyring (its check value fails)."""


class KeyringCorruptError(KeyringError):
    """A keyring file fails authentication or does not parse: damaged or tampered with."""


class KeyDestroyedError(NoMessageFoundError):
    """The data key that protected a value was destroyed: the value is erased.

    Answered as JetStream answers a message that is gone ("no message found", 10037); `key_id` lets a
    caller record which key it was.
    """

    def __init__(self, key_id: int) -> None:
        super().__init__()
        self.key_id = key_id


class UnknownKeyError(JetStreamError):
    """A value names a key its stream's keyring never had: the keyring is not the one the data was
    written with (restored from elsewhere, or lost)."""

    def __init__(self, key_id: int) -> None:
        super().__init__(500, ErrorCode.GENERAL, f"encryption key {key_id} not found in the stream's keyring")
        self.key_id = key_id


class ValueAuthenticationError(JetStreamError):
    """A value's authentication tag does not hold: corrupted, tampered with, or moved from another
    message (the associated data binds it to its stream, sequence, field and subject)."""

    def __init__(self, detail: str = "message authentication failed") -> None:
        super().__init__(500, ErrorCode.GENERAL, detail)


class MissingMasterKeyError(KeyringError):
    """The account has a keyring (its streams are encrypted) and no master key was given."""
