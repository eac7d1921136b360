"""Encryption at rest as one account's engine uses it: the keyring at start, and which streams are sealed.

With a master key (`jetstream { key, cipher }` of the server or the account, or $JETLAKE_KEY), the
account's keyring (engine/keys/; in the warehouse under `<account>/_system/keys/`, a local folder or
objects of an s3:// warehouse's store) is opened before any stream is recovered: the wrong key refuses the
start with a message that says so, and nothing is written. An account whose keyring exists refuses
to start without a key. Every file stream made while a key is given is encrypted (engine/store/sealed.py);
its record says so (`encryption: {key_tokens}`), so it is opened sealed on every later start. A
stream made before the account had a key stays plain (its table keeps its layout). A stream may
declare in its metadata how many leading subject tokens select a data key (`jetlake.key_tokens`):
destroying such a key erases every message under that prefix at once (crypto-shredding).
A stream may also protect its subjects (`jetlake.protected_subjects: "true"`): its subject column is
sealed too and its partition values are keyed hashes (engine/store/sealed.py); only an encrypted stream
can, and neither setting changes after the stream is made (the table keeps its layout).
Deleting an encrypted stream destroys its keys.
Counterpart: server/jetstream.go (`jsKeyGen`, the `cipher` option) and server/stream.go's encrypted store setup.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from engine import errors
from engine.accounts.config import AccountConfig, JetStreamConfig
from engine.clock import Clock
from engine.config import StreamConfig
from engine.keys import (
    Keyring,
    KeyringCorruptError,
    MasterKey,
    MissingMasterKeyError,
    key_prefix_of_filter,
    keyfile,
    keyring_folder,
)
from engine.keys.storage import KeyringFiles, LocalKeyringFiles, ObjectKeyringFiles
from engine.keys.master import KEY_ENV
from engine.store.layout import Layout
from engine.store.sealed import Sealer

if TYPE_CHECKING:
    from engine.stream import Stream

log = logging.getLogger(__name__)

KEY_TOKENS_KEY = "jetlake.key_tokens"  # stream metadata: leading subject tokens that select a data key
PROTECTED_SUBJECTS_KEY = "jetlake.protected_subjects"  # stream metadata: "true" seals subjects too
MAX_KEY_TOKENS = 16
_BOOLEANS = {"true": True, "false": False}
RECORD_FIELD = "encryption"


def master_keys(server: JetStreamConfig, account: AccountConfig,
                environ: Mapping[str, str] = os.environ) -> tuple[MasterKey | None, MasterKey | None]:
    """An account's master key and previous key: its own `jetstream { key }`, else the server's, else
    $JETLAKE_KEY (with $JETLAKE_CIPHER); (None, None) when none is given.

    Raises:
        ValueError: an empty key or an unknown cipher.
    """
    if account.key is not None:
        key, prev_key, cipher = account.key, account.prev_key, account.cipher or server.cipher
    elif server.key is not None:
        key, prev_key, cipher = server.key, server.prev_key, server.cipher
    else:
        return MasterKey.from_environment(environ), None
    previous = MasterKey.from_config(prev_key, cipher) if prev_key else None
    return MasterKey.from_config(key, cipher), previous


def keyring_files(layout: Layout) -> KeyringFiles:
    """Where the account's keyring lives: `<account>/_system/keys/` of the warehouse, a local folder (its
    files fsynced and zeroed when replaced) or objects of an s3:// warehouse's store (every gateway and
    job on the bucket finds it)."""
    if layout.location.root is not None:
        return LocalKeyringFiles(keyring_folder(layout.location.root / layout.account))
    return ObjectKeyringFiles(layout.objects, layout.key("_system", "keys"))


def legacy_keyring(layout: Layout) -> LocalKeyringFiles | None:
    """Where an s3:// warehouse's keyring was kept before it moved into the bucket: the gateway's local
    `--wal-dir` folder. None for a local warehouse."""
    return None if layout.location.root is not None else LocalKeyringFiles(keyring_folder(layout.wal_dir_root))


def open_keyring(layout: Layout, master: MasterKey | None, previous: MasterKey | None, clock: Clock) -> Keyring | None:
    """The account's keyring, or None when it has no key and no keyring.

    Raises:
        MissingMasterKeyError: the account has a keyring and no key was given; nothing was written.
        WrongMasterKeyError, KeyringCorruptError: from `Keyring.open`; nothing was written.
    """
    files = keyring_files(layout)
    _move_legacy_keyring(layout, files)
    if master is None:
        if Keyring.exists(files):
            raise MissingMasterKeyError(
                f"account {layout.account!r} is encrypted ({files.where}) and no key was given: "
                f"set `jetstream {{ key }}` in the config or ${KEY_ENV}; nothing was changed")
        return None
    keyring = Keyring.open(files, layout.account, master, previous=previous, clock=clock)
    log.info("account %s: encryption at rest on (keyring %s, key wrapping %s)", layout.account, files.where,
             master.cipher)
    return keyring


def _move_legacy_keyring(layout: Layout, files: KeyringFiles) -> None:
    """An s3:// warehouse's keyring left on the gateway's disk by an earlier version moves into the
    bucket (stream key files first, the header last: it is what makes the keyring exist), then its
    local files are zeroed and removed. Nothing is changed when the bucket already has a keyring."""
    legacy = legacy_keyring(layout)
    if legacy is None or not legacy.exists(keyfile.HEADER_NAME):
        return
    with legacy.locked(), files.locked():
        if files.exists(keyfile.HEADER_NAME):
            raise KeyringCorruptError(
                f"account {layout.account!r} has a keyring in the warehouse ({files.where}) and another on this "
                f"gateway's disk ({legacy.where}): remove the one that is not in use; nothing was changed")
        names = legacy.names()
        for name in sorted(names, key=lambda n: n == keyfile.HEADER_NAME):
            files.replace(name, legacy.read(name))
    moved = legacy.destroy()
    log.info("account %s: keyring moved from %s into the warehouse (%d files)", layout.account, legacy.where,
             moved.files)


def key_tokens(config: StreamConfig) -> int:
    """The stream's `jetlake.key_tokens` (0: one data key per epoch for the whole stream)."""
    text = (config.metadata or {}).get(KEY_TOKENS_KEY)
    if text is None:
        return 0
    try:
        tokens = int(text)
    except ValueError:
        tokens = -1
    if not 0 <= tokens <= MAX_KEY_TOKENS:
        raise errors.invalid_config(f"metadata {KEY_TOKENS_KEY} must be an integer from 0 to {MAX_KEY_TOKENS}")
    return tokens


def protected_subjects(config: StreamConfig) -> bool:
    """The stream's `jetlake.protected_subjects` ("true" or "false"; absent: false)."""
    text = (config.metadata or {}).get(PROTECTED_SUBJECTS_KEY)
    if text is None:
        return False
    found = _BOOLEANS.get(text.strip().lower())
    if found is None:
        raise errors.invalid_config(f"metadata {PROTECTED_SUBJECTS_KEY} must be true or false")
    return found


def check_create(config: StreamConfig, keyring: Keyring | None) -> None:
    """Refuses protected subjects where nothing is encrypted: a memory stream, or an account without a key.

    Raises:
        JetStreamError: 10052, what JetStream answers for a stream config it cannot honour.
    """
    if not protected_subjects(config):
        return
    if config.storage == "memory":
        raise errors.invalid_config(f"metadata {PROTECTED_SUBJECTS_KEY} needs file storage (a memory stream "
                                    "writes nothing to protect)")
    if keyring is None:
        raise errors.invalid_config(f"metadata {PROTECTED_SUBJECTS_KEY} needs encryption at rest: the account has "
                                    f"no key (`jetstream {{ key }}` or ${KEY_ENV})")


def check_update(old: StreamConfig, new: StreamConfig, encrypted: bool) -> None:
    """The encryption settings are fixed when a stream is made (its table and keys keep their layout);
    a plain stream's `jetlake.key_tokens` means nothing and may change.

    Raises:
        JetStreamError: 10052, as for JetStream's other settings an update can not change.
    """
    if protected_subjects(new) != protected_subjects(old):
        raise errors.invalid_config(f"stream configuration update can not change metadata {PROTECTED_SUBJECTS_KEY}")
    if encrypted and key_tokens(new) != key_tokens(old):
        raise errors.invalid_config(f"stream configuration update can not change metadata {KEY_TOKENS_KEY}")


def record_field(key_tokens: int | None, protected: bool = False) -> dict[str, Any]:
    """What a stream's record says of its encryption (nothing for a plain stream)."""
    if key_tokens is None:
        return {}
    field: dict[str, Any] = {"key_tokens": key_tokens}
    if protected:
        field["protected_subjects"] = True
    return {RECORD_FIELD: field}


def record_key_tokens(record: dict[str, Any]) -> int | None:
    """The key tokens of an encrypted stream's record; None for a plain stream."""
    found = record.get(RECORD_FIELD)
    return None if found is None else int(found.get("key_tokens", 0))


def record_protected(record: dict[str, Any]) -> bool:
    """Whether an encrypted stream's record protects its subjects."""
    return bool((record.get(RECORD_FIELD) or {}).get("protected_subjects", False))


def sealer(keyring: Keyring | None, stream: str, stream_id: str, key_tokens: int | None,
           protected: bool = False) -> Sealer | None:
    """The sealer of an encrypted stream (None for a plain one).

    Raises:
        MissingMasterKeyError: the stream is encrypted and the account has no key.
    """
    if key_tokens is None:
        return None
    if keyring is None:
        raise MissingMasterKeyError(f"stream {stream} is encrypted and no key was given")
    return Sealer(keyring.stream(stream_id, key_tokens), protected)


def existing_keyring(layout: Layout, master: MasterKey | None) -> Keyring | None:
    """The account's keyring for a job or `jetlake sql`: opened when it exists and a key is given, never
    created or re-keyed (that is the gateway's start).

    Raises:
        WrongMasterKeyError, KeyringCorruptError: from `Keyring.open`; nothing was written.
    """
    files = keyring_files(layout)
    if master is None or not Keyring.exists(files):
        return None
    return Keyring.open(files, layout.account, master)


def shred(stream: Stream, filter_: str) -> dict[str, Any] | None:
    """Crypto-shredding after an erasure by filter (the caller holds the stream's lock and has removed
    the matching messages): destroys every epoch's data key of the one subject prefix the filter
    selects (`key_prefix_of_filter`), when no live message under that prefix is left, so none that the
    request did not name becomes unreadable. The bytes the key protected, in the log, the table and
    any copy, are unreadable from then on; the erase job removes them later as for any erasure.

    Returns what the request records of it (`key_destroyed`, the time in ns, and how many keys), or
    None when the stream has no key per prefix or the filter selects none alone.
    """
    sealer = getattr(stream.store, "sealer", None)
    if sealer is None or not sealer.keys.key_tokens:
        return None
    prefix = key_prefix_of_filter(filter_, sealer.keys.key_tokens)
    if prefix is None or len(stream.index.live_seqs([prefix, f"{prefix}.>"])):
        return None
    destroyed = sealer.keys.destroy_prefix(prefix)
    stream.store.mark_table_changed()  # no plaintext of the prefix stays in the decoded row groups
    log.info("stream %s: crypto-shredding destroyed %d data key(s) of one subject prefix", stream.name, len(destroyed))
    return {"key_destroyed": stream.clock.now_ns(), "keys_destroyed": len(destroyed)}
