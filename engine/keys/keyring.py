"""An account's keyring: the key hierarchy under one master key, opened once per process.

```
master key (config or $JETLAKE_KEY; never in the warehouse)
  └─ HKDF-SHA256(salt of the account's header) ─ KEK, MAC key, tag key     (master.py)
       └─ data keys per stream × epoch [× subject prefix], stored only wrapped by the KEK
          a subject key per stream (keyed hashes of protected subjects)    (stream_keys.py)
```
`Keyring.open` refuses the wrong master key before writing anything (the header's check value), and
a damaged or tampered header or stream file (their MACs). Given nats-server's `prev_key` as
`previous`, it re-wraps every key under the new master key (or a new `cipher`), crash-safely: the
new stream files are written beside the old (`.keys.new`), the new header is the commit point, and a
start after a crash finishes or discards the switch by whether the `.new` files open under the header.

Deleting a stream destroys its key file; deleting an account destroys the whole keyring, header and
salt included, so even the master key no longer derives anything that opens its values. The files
are a local folder or objects of the warehouse's store (storage.py: a keyring on S3 is shared by every
gateway and job on the bucket); a `Path` given to `open` is a local folder.
Counterpart: server/jetstream.go (`jsKeyGen`, `decryptMeta`, the `prev_encryption_key` conversion).
"""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import os
import threading
from pathlib import Path

from engine.clock import Clock, SystemClock
from engine.keys import crypto, keyfile
from engine.keys.errors import KeyDestroyedError, KeyringCorruptError, WrongMasterKeyError
from engine.keys.keyfile import HEADER_NAME, NEW_SUFFIX, STREAM_SUFFIX, TMP_SUFFIX, Header
from engine.keys.master import KEY_ENV, AccountKeys, MasterKey
from engine.keys.nonces import NonceSource
from engine.keys.storage import KeyringDestroyed, KeyringFiles, LocalKeyringFiles
from engine.keys.stream_keys import StreamKeys

SALT_SIZE = 16
CHECK = b"jetlake keyring check v1"


def keyring_folder(account_root: Path) -> Path:
    """Where a local account's keyring lives: `<warehouse>/<account>/_system/keys`."""
    return account_root / "_system" / "keys"


def _files(where: Path | KeyringFiles) -> KeyringFiles:
    return LocalKeyringFiles(where) if isinstance(where, Path) else where


class Keyring:
    """The keys of one account. Thread-safe; one per account per process."""

    def __init__(self, files: KeyringFiles, account: str, keys: AccountKeys, clock: Clock) -> None:
        self.files = files
        self.account = account
        self._keys = keys
        self._clock = clock
        self._lock = threading.Lock()
        self._streams: dict[str, StreamKeys] = {}
        self._destroyed = False
        self.nonces = NonceSource(self._allocate_writer)

    @classmethod
    def open(cls, where: Path | KeyringFiles, account: str, master: MasterKey, *, previous: MasterKey | None = None,
             clock: Clock | None = None) -> Keyring:
        """Opens the account's keyring (a local folder, or `KeyringFiles`), creating it on the first start
        with a key.

        Raises:
            WrongMasterKeyError: neither `master` nor `previous` opens it; nothing was written.
            KeyringCorruptError: a keyring file is damaged or tampered with; nothing was written.
        """
        clock = clock or SystemClock()
        files = _files(where)
        try:
            header, mac = _read_header(files)
        except FileNotFoundError:
            return cls(files, account, _create(files, account, master, clock), clock)
        where_header = files.describe(HEADER_NAME)
        if header.account != account:
            raise KeyringCorruptError(f"{where_header} is the keyring of account {header.account!r}, not {account!r}")
        keys = _unlock(header, mac, master, where_header)
        if keys is None and previous is not None and _unlock(header, mac, previous, where_header) is not None:
            keys = _rekey(files, previous, master)
        elif keys is not None and keys.kek.cipher != master.cipher:
            keys = _rekey(files, master, master)
        if keys is None:
            raise WrongMasterKeyError(_wrong_key_message(where_header, header))
        with files.locked():
            _finish_or_discard(files, keys)
        return cls(files, account, keys, clock)

    @staticmethod
    def exists(where: Path | KeyringFiles) -> bool:
        """Whether the account has a keyring: then it must not start without its key."""
        return _files(where).exists(HEADER_NAME)

    def stream(self, stream_id: str, key_tokens: int = 0) -> StreamKeys:
        """The keys of a stream (by its id), created on first use; `key_tokens` as the stream declares."""
        with self._lock:
            if self._destroyed:
                raise KeyDestroyedError(0)
            keys = self._streams.get(stream_id)
            if keys is None:
                keys = StreamKeys(self.account, self.files, self._keys, self.nonces, self._clock, stream_id)
                self._streams[stream_id] = keys
            keys.key_tokens = key_tokens
            return keys

    def destroy_stream(self, stream_id: str) -> None:
        """The stream is deleted: its key file goes, and every value it protected is erased."""
        if not keyfile.is_stream_id(stream_id):
            raise ValueError(f"not a stream id: {stream_id!r}")
        with self._lock, self.files.locked():
            name = f"{stream_id}{STREAM_SUFFIX}"
            for leftover in (name, name + TMP_SUFFIX, name + NEW_SUFFIX):
                self.files.scrub(leftover)
            keys = self._streams.pop(stream_id, None)
            if keys is not None:
                keys.mark_destroyed()

    def destroy(self) -> KeyringDestroyed:
        """The account is deleted: every file of its keyring is zeroed (where the storage can) and removed."""
        with self._lock:
            destroyed = self.files.destroy()
            self._destroyed = True
            for keys in self._streams.values():
                keys.mark_destroyed()
            self._streams.clear()
            return destroyed

    def _allocate_writer(self) -> int:
        """A nonce writer id no process ever had: counted in the header, durable before its use."""
        with self.files.locked():
            header, mac = _read_header(self.files)
            if not hmac.compare_digest(keyfile.header_mac(self._keys.mac_key, header), mac):
                raise KeyringCorruptError(f"{self.files.describe(HEADER_NAME)} is damaged or was tampered with")
            _write_header(self.files, dataclasses.replace(header, writers=header.writers + 1), self._keys.mac_key)
            return header.writers


def _read_header(files: KeyringFiles) -> tuple[Header, bytes]:
    """The header and its MAC. Raises FileNotFoundError when the account has no keyring."""
    return keyfile.parse_header(files.read(HEADER_NAME), files.describe(HEADER_NAME))


def _write_header(files: KeyringFiles, header: Header, mac_key: bytes) -> None:
    files.replace(HEADER_NAME, keyfile.encode_header(header, mac_key))


def _read_stream(files: KeyringFiles, name: str, mac_key: bytes, stream_id: str) -> keyfile.StreamFile:
    return keyfile.parse_stream_file(files.read(name), files.describe(name), mac_key, stream_id)


def _create(files: KeyringFiles, account: str, master: MasterKey, clock: Clock) -> AccountKeys:
    with files.locked():
        try:
            header, mac = _read_header(files)  # another process created it meanwhile
        except FileNotFoundError:
            pass
        else:
            keys = _unlock(header, mac, master, files.describe(HEADER_NAME))
            if keys is None:
                raise WrongMasterKeyError(_wrong_key_message(files.describe(HEADER_NAME), header))
            return keys
        if any(name.endswith(STREAM_SUFFIX) for name in files.names()):
            raise KeyringCorruptError(
                f"{files.where} holds stream keys but no {HEADER_NAME}: refusing to start a new keyring over them")
        header, keys = _new_header(account, master, 0, clock.now_ns())
        _write_header(files, header, keys.mac_key)
        return keys


def _new_header(account: str, master: MasterKey, writers: int, created_ns: int) -> tuple[Header, AccountKeys]:
    salt = os.urandom(SALT_SIZE)
    keys = master.account_keys(account, salt)
    check = keys.kek.wrap(CHECK, _check_aad(account))
    return Header(account, master.cipher, salt, check, writers, created_ns), keys


def _unlock(header: Header, mac: bytes, master: MasterKey, where: str) -> AccountKeys | None:
    """The account's keys if `master` opens the header (None when it does not); checks the header's MAC."""
    keys = MasterKey(master.secret, header.cipher).account_keys(header.account, header.salt)
    try:
        if keys.kek.unwrap(header.check, _check_aad(header.account)) != CHECK:
            return None
    except crypto.InvalidTag:
        return None
    if not hmac.compare_digest(keyfile.header_mac(keys.mac_key, header), mac):
        raise KeyringCorruptError(f"{where} is damaged or was tampered with (its MAC fails under the right key)")
    return keys


def _rekey(files: KeyringFiles, previous: MasterKey, master: MasterKey) -> AccountKeys:
    """Re-wraps every key under `master` (a new key, or a new cipher); the header write commits."""
    where_header = files.describe(HEADER_NAME)
    with files.locked():
        header, mac = _read_header(files)  # again: another process may have switched meanwhile
        done = _unlock(header, mac, master, where_header)
        if done is not None and done.kek.cipher == master.cipher:
            return done
        old = done or _unlock(header, mac, previous, where_header)
        if old is None:
            raise WrongMasterKeyError(_wrong_key_message(where_header, header))
        _finish_or_discard(files, old)
        new_header, new = _new_header(header.account, master, header.writers, header.created_ns)
        rewritten: dict[str, bytes] = {}
        for name in [n for n in files.names() if n.endswith(STREAM_SUFFIX)]:
            stream_id = name[: -len(STREAM_SUFFIX)]
            state = _read_stream(files, name, old.mac_key, stream_id)
            for key_id, record in state.keys.items():
                aad = keyfile.key_aad(header.account, stream_id, record)
                try:
                    plain = old.kek.unwrap(record.wrapped, aad)
                except crypto.InvalidTag:
                    raise KeyringCorruptError(
                        f"{files.describe(name)}: key {key_id} does not unwrap (tampered)") from None
                state.keys[key_id] = dataclasses.replace(record, wrapped=new.kek.wrap(plain, aad))
            rewritten[name] = keyfile.encode_stream_file(new.mac_key, stream_id, state)
            files.replace(name + NEW_SUFFIX, rewritten[name])
        _write_header(files, new_header, new.mac_key)
        for name, data in rewritten.items():
            files.replace(name, data)
            files.scrub(name + NEW_SUFFIX)
        return new


def _finish_or_discard(files: KeyringFiles, keys: AccountKeys) -> None:
    """After a crash: a `.keys.new` that opens under the header's keys was committed, so it replaces
    its file; any other is an unfinished switch and goes, as do stale `.tmp` files."""
    names = files.names()
    for leftover in [n for n in names if n.endswith(TMP_SUFFIX)]:
        files.scrub(leftover)
    for new in [n for n in names if n.endswith(STREAM_SUFFIX + NEW_SUFFIX)]:
        name = new[: -len(NEW_SUFFIX)]
        stream_id = name[: -len(STREAM_SUFFIX)]
        try:
            _read_stream(files, new, keys.mac_key, stream_id)
        except KeyringCorruptError:
            files.scrub(new)
            continue
        files.replace(name, files.read(new))
        files.scrub(new)


def _check_aad(account: str) -> bytes:
    return b"jetlake-check\x00" + account.encode()


def _wrong_key_message(where: str, header: Header) -> str:
    created = datetime.datetime.fromtimestamp(header.created_ns / 1e9, datetime.UTC).isoformat(timespec="seconds")
    return (f"the encryption key does not open the keyring of account {header.account!r} ({where}, created {created}, "
            f"cipher {header.cipher}): check `jetstream {{ key }}` in the config or ${KEY_ENV}; nothing was changed")
