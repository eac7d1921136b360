"""Where an account's keyring files live: a local folder, or objects of the warehouse's `ObjectStore`.

The keyring (keyring.py, stream_key_cache.py) reads and writes its files through `KeyringFiles` only:
- `LocalKeyringFiles`, a folder on disk (the keyring of a local warehouse, in its tree): fsynced
  appends, rewrites through a `.tmp` and a rename, and every replaced or removed file's bytes zeroed
  (keyfile.py), under a `flock`;
- `ObjectKeyringFiles`, objects under `<account>/_system/keys/` of the warehouse's store (an s3://
  warehouse): every gateway and job on the bucket finds the same keyring, so an encrypted account
  fails over to any of them. A change is a whole-object PUT (atomic: a reader sees the old or the new
  object), made under the keyring's lock, a lease object (`.lock`, engine/store/lease.py's
  `commit_lease`) taken by conditional writes, so no two gateways change the keyring at once. An
  object store cannot overwrite bytes in place: a replaced or deleted object is gone from the API at
  once, and what the provider keeps of it (a versioned bucket keeps old versions) is only wrapped keys,
  useless without the master key; turn versioning off for the prefix, or expire old versions.
Only wrapped keys, the header (salt, check value, MACs) and the lock are stored; the master key never is.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.keys import keyfile
from engine.store.lease import commit_lease
from engine.store.layout import CommitLeaseRef
from engine.store.objectstore import ObjectNotFoundError, ObjectStore

LOCK_TIMEOUT = 120.0  # seconds to wait for another process's change of the keyring


@dataclass(frozen=True)
class KeyringDestroyed:
    """What a keyring's destruction removed: its files and their bytes (wrapped keys and the header)."""

    files: int
    bytes: int


class KeyringFiles(ABC):
    """One account's keyring files, by name (`keyring.json`, `<stream id>.keys`, their siblings)."""

    where: str  # the folder or the object prefix, for messages

    def describe(self, name: str) -> str:
        """A file's full name, for messages."""
        return f"{self.where}/{name}"

    @abstractmethod
    def read(self, name: str) -> bytes:
        """The file's bytes. Raises FileNotFoundError."""

    @abstractmethod
    def identity(self, name: str) -> tuple[object, int]:
        """(an identity that changes when the file is rewritten, its size). Raises FileNotFoundError."""

    def exists(self, name: str) -> bool:
        try:
            self.identity(name)
        except FileNotFoundError:
            return False
        return True

    @abstractmethod
    def replace(self, name: str, data: bytes) -> None:
        """Replaces (or creates) the file whole and durably; a reader sees the old bytes or the new."""

    @abstractmethod
    def append(self, name: str, valid_size: int, data: bytes) -> int:
        """Appends after the first `valid_size` bytes (a torn tail is cut), durably; returns the new size.
        Called under `locked()` only."""

    @abstractmethod
    def scrub(self, name: str) -> None:
        """Removes the file (zeroing its bytes first where the storage allows); nothing if absent."""

    @abstractmethod
    def names(self) -> list[str]:
        """Every file of the keyring but the lock, sorted."""

    @abstractmethod
    def locked(self) -> AbstractContextManager[None]:
        """The keyring's lock across threads, processes and gateways: held around every change."""

    @abstractmethod
    def destroy(self) -> KeyringDestroyed:
        """Removes every file of the keyring, the lock last (nothing when there is none)."""


class LocalKeyringFiles(KeyringFiles):
    """The keyring as a folder of local files (keyfile.py's writes: fsynced, old bytes zeroed)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.where = str(folder)

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def identity(self, name: str) -> tuple[object, int]:
        return keyfile.file_identity(self.folder / name)

    def replace(self, name: str, data: bytes) -> None:
        keyfile.replace_durably(self.folder / name, data)

    def append(self, name: str, valid_size: int, data: bytes) -> int:
        return keyfile.append_durably(self.folder / name, valid_size, data)

    def scrub(self, name: str) -> None:
        keyfile.scrub(self.folder / name)

    def names(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(p.name for p in self.folder.iterdir() if p.name != keyfile.LOCK_NAME and p.is_file())

    def locked(self) -> AbstractContextManager[None]:
        return keyfile.locked(self.folder)

    def destroy(self) -> KeyringDestroyed:
        if not self.folder.is_dir():
            return KeyringDestroyed(0, 0)
        files = size = 0
        with self.locked():
            for name in self.names():
                files += 1
                size += os.stat(self.folder / name).st_size
                self.scrub(name)
        (self.folder / keyfile.LOCK_NAME).unlink(missing_ok=True)
        self.folder.rmdir()
        keyfile.fsync_folder(self.folder.parent)
        return KeyringDestroyed(files, size)


class ObjectKeyringFiles(KeyringFiles):
    """The keyring as objects under `prefix` of the warehouse's store (see the module docstring)."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store = store
        self.prefix = prefix.rstrip("/")
        self.where = f"{store.uri.rstrip('/')}/{self.prefix}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def read(self, name: str) -> bytes:
        try:
            return self.store.get(self._key(name)).data
        except ObjectNotFoundError:
            raise FileNotFoundError(self.describe(name)) from None

    def identity(self, name: str) -> tuple[object, int]:
        try:
            meta = self.store.head(self._key(name))
        except ObjectNotFoundError:
            raise FileNotFoundError(self.describe(name)) from None
        return meta.version, meta.size

    def replace(self, name: str, data: bytes) -> None:
        self.store.put(self._key(name), data)

    def append(self, name: str, valid_size: int, data: bytes) -> int:
        whole = self.read(name)[:valid_size] + data
        self.store.put(self._key(name), whole)
        return len(whole)

    def scrub(self, name: str) -> None:
        self.store.delete(self._key(name))

    def names(self) -> list[str]:
        start = len(self.prefix) + 1
        found = (meta.key[start:] for meta in self.store.list(self.prefix))
        return sorted(name for name in found if name != keyfile.LOCK_NAME and "/" not in name)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with commit_lease(CommitLeaseRef(self.store, self._key(keyfile.LOCK_NAME)), timeout=LOCK_TIMEOUT):
            yield

    def locked(self) -> AbstractContextManager[None]:
        return self._locked()

    def destroy(self) -> KeyringDestroyed:
        files = size = 0
        with self.locked():
            for meta in list(self.store.list(self.prefix)):
                if meta.key != self._key(keyfile.LOCK_NAME):
                    files += 1
                    size += meta.size
                    self.store.delete(meta.key)
        self.store.delete(self._key(keyfile.LOCK_NAME))
        return KeyringDestroyed(files, size)
