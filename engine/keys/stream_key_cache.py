"""One stream's key file as this process holds it: its records indexed by (epoch, prefix tag), the
keys unwrapped from them in a bounded cache, the current epoch's keys by subject prefix, and what is
derived from the subject key.

The file is re-read when another process changed it (checked by its identity, inode and size or the
object's version, under the keyring lock, and when a value names a key id this process has not seen);
whatever it no longer holds leaves the cache, and when the file is gone (stream or account deleted)
everything held is dropped at once, so that a destroyed key is not kept in memory.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from engine.keys import crypto, keyfile
from engine.keys.cipher import DATA_KEY_SIZE, DataKey
from engine.keys.errors import KeyDestroyedError, KeyringCorruptError, UnknownKeyError
from engine.keys.key_wrapping import KeyWrapping
from engine.keys.keyfile import DATA, SUBJECT_HASH, KeyRecord, StreamFile
from engine.keys.subjects import SubjectHasher

if TYPE_CHECKING:
    from engine.clock import Clock
    from engine.keys.storage import KeyringFiles

FIRST_EPOCH = 1
CACHE_SIZE = 4096


class StreamKeyCache:
    """The stream's key file `name` in `files`, created when missing; `lock` guards what is held."""

    def __init__(self, files: KeyringFiles, name: str, path: str, stream_id: str, wrapping: KeyWrapping,
                 mac_key: bytes, clock: Clock) -> None:
        self.stream_id = stream_id
        self._files = files
        self._name = name
        self._path = path
        self._wrapping = wrapping
        self._mac_key = mac_key
        self._clock = clock
        self.lock = threading.RLock()
        self._cache: OrderedDict[int, DataKey] = OrderedDict()
        self.by_tag: dict[tuple[int, bytes], int] = {}
        self.current: dict[str, DataKey] = {}  # the current epoch's keys by prefix, until the keyring changes
        self._hasher: SubjectHasher | None = None
        self._config_cipher: crypto.AESGCM | None = None
        self.destroyed_all = False
        with files.locked():
            if not files.exists(name):
                self._create_locked()
            self.state = self._read()
            self._identity = files.identity(name)
        self._index()

    @property
    def epoch(self) -> int:
        return self.state.epoch

    def current_keys(self, prefixes: Iterable[str]) -> dict[str, DataKey]:
        """The current epoch's keys of many prefixes; the missing ones are created with one fsync."""
        with self.lock:
            wanted = set(prefixes)
            if not wanted <= self.current.keys():
                missing = [p for p in wanted if (self.epoch, self._wrapping.tag(p)) not in self.by_tag]
                if missing:
                    # re-indexes: self.current starts empty again
                    self.create_tagged([self._wrapping.tag(p) for p in missing])
                if len(self.current) + len(wanted) > CACHE_SIZE:
                    self.current = {}
                self.current.update((p, self.key(self.by_tag[(self.epoch, self._wrapping.tag(p))])) for p in wanted)
            current = self.current
            return {p: current[p] for p in wanted}

    def key(self, key_id: int) -> DataKey:
        with self.lock:
            cached = self._cache.get(key_id)
            if cached is not None:
                self._cache.move_to_end(key_id)
                return cached
            record = self.record(key_id)
            key = DataKey(key_id, self._wrapping.unwrap(record))
            self._cache[key_id] = key
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return key

    def record(self, key_id: int) -> KeyRecord:
        """A data key's record, the file re-read first when it names an id not seen yet."""
        record = self.state.keys.get(key_id)
        if record is None and not self.destroyed_all and key_id not in self.state.destroyed:
            try:
                self.refresh()  # another process may have added it
            except KeyDestroyedError:
                pass
            record = self.state.keys.get(key_id)
        if record is not None and record.purpose == DATA:
            return record
        if self.destroyed_all or key_id in self.state.destroyed:
            raise KeyDestroyedError(key_id)
        raise UnknownKeyError(key_id)

    def subject_hasher(self) -> SubjectHasher:
        with self.lock:
            if self._hasher is None:
                self._hasher = SubjectHasher(self._subject_key())
            return self._hasher

    def config_aead(self) -> crypto.AESGCM:
        """The config key: HKDF of the subject key, so it outlives rotations as the subject key does."""
        with self.lock:
            if self._config_cipher is None:
                info = b"jetlake stream configs " + self.stream_id.encode()
                key = crypto.HKDF(crypto.hashes.SHA256(), DATA_KEY_SIZE, None, info).derive(self._subject_key())
                self._config_cipher = crypto.AESGCM(key)
            return self._config_cipher

    def _subject_key(self) -> bytes:
        if self.destroyed_all:
            raise KeyDestroyedError(0)
        record = next((r for r in self.state.keys.values() if r.purpose == SUBJECT_HASH), None)
        if record is None:
            raise KeyringCorruptError(f"{self._path} has no subject key")
        return self._wrapping.unwrap(record)

    def refresh(self) -> None:
        with self.lock, self._files.locked():
            self.sync_locked()

    def mark_destroyed(self) -> None:
        with self.lock:
            self.destroyed_all = True
            self._cache.clear()
            self.state = StreamFile(epoch=self.state.epoch)
            self.by_tag.clear()
            self.current = {}
            self._hasher = None
            self._config_cipher = None

    def _next_id(self) -> int:
        return max([0, *self.state.keys, *self.state.destroyed]) + 1

    def _create_locked(self) -> None:
        state = StreamFile(epoch=FIRST_EPOCH)
        state.keys[1] = self._wrapping.new_record(1, 0, SUBJECT_HASH, self._wrapping.compute_tag(""))
        self._files.replace(self._name, keyfile.encode_stream_file(self._mac_key, self.stream_id, state))

    def create_tagged(self, tags: list[bytes]) -> None:
        """The current epoch's data keys of these prefix tags, those still missing, appended durably."""
        with self._files.locked():
            self.sync_locked()
            missing = [t for t in tags if (self.epoch, t) not in self.by_tag]
            first = self._next_id()
            records = [self._wrapping.new_record(first + i, self.epoch, DATA, t) for i, t in enumerate(missing)]
            self.append_locked([keyfile.key_record(r) for r in records])

    def destroy(self, chosen: Callable[[KeyRecord], bool]) -> list[int]:
        """Destroys the chosen keys (the file rewritten without them); returns their ids."""
        with self.lock, self._files.locked():
            self.sync_locked()
            ids = sorted(r.key_id for r in self.state.keys.values() if chosen(r))
            if not ids:
                return []
            now = self._clock.now_ns()
            for key_id in ids:
                del self.state.keys[key_id]
                self.state.destroyed[key_id] = now
                self._cache.pop(key_id, None)
            data = keyfile.encode_stream_file(self._mac_key, self.stream_id, self.state)
            self._files.replace(self._name, data)
            self.state.size = len(data)
            self._identity = self._files.identity(self._name)
            self._index()
            return ids

    def append_locked(self, records: list[tuple[int, bytes]]) -> None:
        if not records:
            return
        data = keyfile.encode_records(self._mac_key, self.stream_id, records)
        self._files.append(self._name, self.state.size, data)
        self.state = self._read(self.state)
        self._identity = self._files.identity(self._name)
        self._index()

    def sync_locked(self) -> None:
        """Re-reads the file if another process changed it; the keyring lock is held."""
        if self.destroyed_all:
            raise KeyDestroyedError(0)
        try:
            identity = self._files.identity(self._name)
        except FileNotFoundError:
            self.mark_destroyed()
            raise KeyDestroyedError(0) from None
        if identity == self._identity:
            return
        same_file = identity[0] == self._identity[0] and identity[1] > self.state.size
        start = self.state if same_file else None
        self.state = self._read(start)
        self._identity = identity
        self._index()
        for key_id in [k for k in self._cache if k not in self.state.keys]:
            del self._cache[key_id]

    def _read(self, start: StreamFile | None = None) -> StreamFile:
        return keyfile.parse_stream_file(self._files.read(self._name), self._path, self._mac_key,
                                         self.stream_id, start)

    def _index(self) -> None:
        self.current = {}
        self.by_tag = {(r.epoch, r.tag): r.key_id for r in self.state.keys.values() if r.purpose == DATA}
