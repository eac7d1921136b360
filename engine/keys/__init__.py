"""Encryption at rest: the key hierarchy, sealed values, protected subjects, crypto-shredding.

See docs/encryption.md for the design. The public surface is re-exported here.
"""

from engine.keys.cipher import DataKey, OpenedBatch, associated_data, sql_decrypt, sql_encrypt, sql_key_ref
from engine.keys.errors import (
    KeyDestroyedError,
    KeyringCorruptError,
    KeyringError,
    MissingMasterKeyError,
    UnknownKeyError,
    ValueAuthenticationError,
    WrongMasterKeyError,
)
from engine.keys.keyring import Keyring, keyring_folder
from engine.keys.master import MasterKey
from engine.keys.stream_keys import StreamKeys
from engine.keys.subjects import SubjectHasher, key_prefix, key_prefix_of_filter

__all__ = [
    "DataKey",
    "KeyDestroyedError",
    "Keyring",
    "KeyringCorruptError",
    "KeyringError",
    "MasterKey",
    "MissingMasterKeyError",
    "OpenedBatch",
    "StreamKeys",
    "SubjectHasher",
    "UnknownKeyError",
    "ValueAuthenticationError",
    "WrongMasterKeyError",
    "associated_data",
    "key_prefix",
    "key_prefix_of_filter",
    "keyring_folder",
    "sql_decrypt",
    "sql_encrypt",
    "sql_key_ref",
]
