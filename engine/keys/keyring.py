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
salt included, so even the master key no longer derives anything that opens its values.
Counterpart: server/jetstream.go (`jsKeyGen`, `decryptMeta`, the `prev_encryption_key` conversion).
"""

from __future__ import annotations

import dataclasses
import datetime
import hmac
import os
import threading
from pathlib import Path

from cryptography.exceptions import InvalidTag

from engine.clock import Clock, SystemClock
from engine.keys import keyfile
from engine.keys.errors import KeyringCorruptError, WrongMasterKeyError
from engine.keys.keyfile import HEADER_NAME, NEW_SUFFIX, STREAM_SUFFIX, TMP_SUFFIX, Header
from engine.keys.master import KEY_ENV, AccountKeys, MasterKey
from engine.keys.nonces import NonceSource
from engine.keys.stream_keys import StreamKeys

SALT_SIZE = 16
CHECK = b"jetlake keyring check v1"


def keyring_folder(account_root: Path) -> Path:
    """Where an account's keyring lives: `<warehouse>/<account>/_system/keys`."""
    return account_root / "_system" / "keys"


class Keyring:
    """The keys of one account. Thread-safe; one per account per process."""

    def __init__(self, folder: Path, account: str, keys: AccountKeys, clock: Clock) -> None:
        self.folder = folder
        self.account = account
        self._keys = keys
        self._clock = clock
        self._lock = threading.Lock()
        self._streams: dict[str, StreamKeys] = {}
        self.nonces = NonceSource(self._allocate_writer)

    @classmethod
    def open(cls, folder: Path, account: str, master: MasterKey, *, previous: MasterKey | None = None,
             clock: Clock | None = None) -> Keyring:
        """Opens the account's keyring, creating it on the first start with a key.

        Raises:
            WrongMasterKeyError: neither `master` nor `previous` opens it; nothing was written.
            KeyringCorruptError: a keyring file is damaged or tampered with; nothing was written.
        """
        clock = clock or SystemClock()
        path = folder / HEADER_NAME
        if not path.exists():
            return cls(folder, account, _create(folder, account, master, clock), clock)
        header, mac = keyfile.decode_header(path)
        if header.account != account:
            raise KeyringCorruptError(f"{path} is the keyring of account {header.account!r}, not {account!r}")
        keys = _unlock(header, mac, master, path)
        if keys is None and previous is not None and _unlock(header, mac, previous, path) is not None:
            keys = _rekey(folder, previous, master)
        elif keys is not None and keys.kek.cipher != master.cipher:
            keys = _rekey(folder, master, master)
        if keys is None:
            raise WrongMasterKeyError(_wrong_key_message(path, header))
        with keyfile.locked(folder):
            _finish_or_discard(folder, keys)
        return cls(folder, account, keys, clock)

    @staticmethod
    def exists(folder: Path) -> bool:
        """Whether the account has a keyring: then it must not start without its key."""
        return (folder / HEADER_NAME).exists()

    def stream(self, stream_id: str, key_tokens: int = 0) -> StreamKeys:
        """The keys of a stream (by its id), created on first use; `key_tokens` as the stream declares."""
        with self._lock:
            keys = self._streams.get(stream_id)
            if keys is None:
                keys = StreamKeys(self.account, self.folder, self._keys, self.nonces, self._clock, stream_id)
                self._streams[stream_id] = keys
            keys.key_tokens = key_tokens
            return keys

    def destroy_stream(self, stream_id: str) -> None:
        """The stream is deleted: its key file goes, and every value it protected is erased."""
        if not keyfile.is_stream_id(stream_id):
            raise ValueError(f"not a stream id: {stream_id!r}")
        with self._lock, keyfile.locked(self.folder):
            path = self.folder / f"{stream_id}{STREAM_SUFFIX}"
            for leftover in (path, _sibling(path, TMP_SUFFIX), _sibling(path, NEW_SUFFIX)):
                keyfile.scrub(leftover)
            keys = self._streams.pop(stream_id, None)
            if keys is not None:
                keys.mark_destroyed()

    def destroy(self) -> None:
        """The account is deleted: every file of its keyring is zeroed and removed."""
        with self._lock:
            destroy_keyring(self.folder)
            for keys in self._streams.values():
                keys.mark_destroyed()
            self._streams.clear()

    def _allocate_writer(self) -> int:
        """A nonce writer id no process ever had: counted in the header, durable before its use."""
        path = self.folder / HEADER_NAME
        with keyfile.locked(self.folder):
            header, mac = keyfile.decode_header(path)
            if not hmac.compare_digest(keyfile.header_mac(self._keys.mac_key, header), mac):
                raise KeyringCorruptError(f"{path} is damaged or was tampered with")
            keyfile.write_header(path, dataclasses.replace(header, writers=header.writers + 1), self._keys.mac_key)
            return header.writers


def destroy_keyring(folder: Path) -> KeyringDestroyed:
    """Zeroes and removes every file of an account's keyring, header and salt included, without its
    master key (an account deleted after its key left the config): from then on no key derives
    anything that opens the account's values. Nothing when there is no keyring.

    Returns what went: the files and their bytes (wrapped keys and the header).
    """
    if not folder.is_dir():
        return KeyringDestroyed(0, 0)
    files = size = 0
    with keyfile.locked(folder):
        for path in sorted(folder.iterdir()):
            if path.name != keyfile.LOCK_NAME and path.is_file():
                files += 1
                size += path.stat().st_size
                keyfile.scrub(path)
    (folder / keyfile.LOCK_NAME).unlink(missing_ok=True)
    folder.rmdir()
    keyfile.fsync_folder(folder.parent)
    return KeyringDestroyed(files, size)


@dataclasses.dataclass(frozen=True)
class KeyringDestroyed:
    """What `destroy_keyring` removed."""

    files: int
    bytes: int


def _create(folder: Path, account: str, master: MasterKey, clock: Clock) -> AccountKeys:
    with keyfile.locked(folder):
        path = folder / HEADER_NAME
        if path.exists():  # another process created it meanwhile
            header, mac = keyfile.decode_header(path)
            keys = _unlock(header, mac, master, path)
            if keys is None:
                raise WrongMasterKeyError(_wrong_key_message(path, header))
            return keys
        if any(folder.glob(f"*{STREAM_SUFFIX}")):
            raise KeyringCorruptError(
                f"{folder} holds stream keys but no {HEADER_NAME}: refusing to start a new keyring over them")
        header, keys = _new_header(account, master, 0, clock.now_ns())
        keyfile.write_header(path, header, keys.mac_key)
        return keys


def _new_header(account: str, master: MasterKey, writers: int, created_ns: int) -> tuple[Header, AccountKeys]:
    salt = os.urandom(SALT_SIZE)
    keys = master.account_keys(account, salt)
    check = keys.kek.wrap(CHECK, _check_aad(account))
    return Header(account, master.cipher, salt, check, writers, created_ns), keys


def _unlock(header: Header, mac: bytes, master: MasterKey, path: Path) -> AccountKeys | None:
    """The account's keys if `master` opens the header (None when it does not); checks the header's MAC."""
    keys = MasterKey(master.secret, header.cipher).account_keys(header.account, header.salt)
    try:
        if keys.kek.unwrap(header.check, _check_aad(header.account)) != CHECK:
            return None
    except InvalidTag:
        return None
    if not hmac.compare_digest(keyfile.header_mac(keys.mac_key, header), mac):
        raise KeyringCorruptError(f"{path} is damaged or was tampered with (its MAC fails under the right key)")
    return keys


def _rekey(folder: Path, previous: MasterKey, master: MasterKey) -> AccountKeys:
    """Re-wraps every key under `master` (a new key, or a new cipher); the header write commits."""
    header_path = folder / HEADER_NAME
    with keyfile.locked(folder):
        header, mac = keyfile.decode_header(header_path)  # again: another process may have switched meanwhile
        done = _unlock(header, mac, master, header_path)
        if done is not None and done.kek.cipher == master.cipher:
            return done
        old = done or _unlock(header, mac, previous, header_path)
        if old is None:
            raise WrongMasterKeyError(_wrong_key_message(header_path, header))
        _finish_or_discard(folder, old)
        new_header, new = _new_header(header.account, master, header.writers, header.created_ns)
        rewritten: dict[Path, bytes] = {}
        for path in sorted(folder.glob(f"*{STREAM_SUFFIX}")):
            stream_id = path.name[: -len(STREAM_SUFFIX)]
            state = keyfile.read_stream_file(path, old.mac_key, stream_id)
            for key_id, record in state.keys.items():
                aad = keyfile.key_aad(header.account, stream_id, record)
                try:
                    plain = old.kek.unwrap(record.wrapped, aad)
                except InvalidTag:
                    raise KeyringCorruptError(f"{path}: key {key_id} does not unwrap (tampered)") from None
                state.keys[key_id] = dataclasses.replace(record, wrapped=new.kek.wrap(plain, aad))
            rewritten[path] = keyfile.encode_stream_file(new.mac_key, stream_id, state)
            keyfile.replace_durably(_sibling(path, NEW_SUFFIX), rewritten[path])
        keyfile.write_header(header_path, new_header, new.mac_key)
        for path, data in rewritten.items():
            keyfile.replace_durably(path, data)
            keyfile.scrub(_sibling(path, NEW_SUFFIX))
        return new


def _finish_or_discard(folder: Path, keys: AccountKeys) -> None:
    """After a crash: a `.keys.new` that opens under the header's keys was committed, so it replaces
    its file; any other is an unfinished switch and goes, as do stale `.tmp` files."""
    for leftover in sorted(folder.glob(f"*{TMP_SUFFIX}")):
        keyfile.scrub(leftover)
    for new in sorted(folder.glob(f"*{STREAM_SUFFIX}{NEW_SUFFIX}")):
        path = new.with_name(new.name[: -len(NEW_SUFFIX)])
        stream_id = path.name[: -len(STREAM_SUFFIX)]
        try:
            keyfile.read_stream_file(new, keys.mac_key, stream_id)
        except KeyringCorruptError:
            keyfile.scrub(new)
            continue
        keyfile.replace_durably(path, new.read_bytes())
        keyfile.scrub(new)


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _check_aad(account: str) -> bytes:
    return b"jetlake-check\x00" + account.encode()


def _wrong_key_message(path: Path, header: Header) -> str:
    created = datetime.datetime.fromtimestamp(header.created_ns / 1e9, datetime.UTC).isoformat(timespec="seconds")
    return (f"the encryption key does not open the keyring of account {header.account!r} ({path}, created {created}, "
            f"cipher {header.cipher}): check `jetstream {{ key }}` in the config or ${KEY_ENV}; nothing was changed")
