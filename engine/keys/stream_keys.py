"""One stream's data keys: per key epoch and, optionally, per subject prefix; rotation and shredding.

A data key is found by (epoch, prefix tag) for writing and by its key id (in every sealed value) for
reading. New writes use the current epoch; `rotate` starts a new epoch at once, and older epochs stay
readable until `retire_epochs_before` destroys them (after the compaction job re-encrypted their
values). `destroy_prefix` destroys every epoch's key of a subject prefix: from then on every value
sealed under it answers `KeyDestroyedError` (erased), before any file is rewritten. Key ids are never
reused, so a destroyed id stays distinguishable from one this keyring never had.

Keys are unwrapped when first used and kept in a bounded cache; the stream's file is re-read when
another process changed it (checked by its identity, inode and size or the object's version, under the
keyring lock, and when a value names a key id this process has not seen).
Counterpart: server/filestore.go's per-block keys (`genEncryptionKeys`, `loadEncryptionForMsgBlock`).
"""

from __future__ import annotations

import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import pyarrow as pa
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from engine.clock import Clock
from engine.keys import keyfile
from engine.keys.cipher import DATA_KEY_SIZE, DataKey, OpenedBatch, Payloads, associated_data, associated_data_batch
from engine.keys.cipher import key_ref, open_batch, seal, seal_batch
from engine.keys.errors import KeyDestroyedError, KeyringCorruptError, UnknownKeyError, ValueAuthenticationError
from engine.keys.keyfile import DATA, SUBJECT_HASH, KeyRecord, StreamFile
from engine.keys.master import AccountKeys
from engine.keys.nonces import NONCE_SIZE, NonceSource
from engine.keys.subjects import SubjectHasher, key_prefix
from engine.store import failpoints

if TYPE_CHECKING:
    from engine.keys.storage import KeyringFiles

FIRST_EPOCH = 1
CACHE_SIZE = 4096
SUBJECT = "subject"
CONFIG_VERSION = 1  # the layout of `seal_config`'s values
ROTATE_FAILPOINT = "keys.rotate"  # engine/store/failpoints.py: the epoch record's durable append


class StreamKeys:
    """The keys of one stream (by stream id), opened or created through its account's `Keyring`."""

    def __init__(self, account: str, files: KeyringFiles, keys: AccountKeys, nonces: NonceSource, clock: Clock,
                 stream_id: str, key_tokens: int = 0) -> None:
        if not keyfile.is_stream_id(stream_id):
            raise ValueError(f"not a stream id: {stream_id!r}")
        self.account = account
        self.stream_id = stream_id
        self.key_tokens = key_tokens
        self._files = files
        self._name = f"{stream_id}{keyfile.STREAM_SUFFIX}"
        self._path = files.describe(self._name)  # for messages
        self._keys = keys
        self._nonces = nonces
        self._clock = clock
        self._lock = threading.RLock()
        self._cache: OrderedDict[int, DataKey] = OrderedDict()
        self._by_tag: dict[tuple[int, bytes], int] = {}
        self._current: dict[str, DataKey] = {}  # the current epoch's keys by prefix, until the keyring changes
        self._hasher: SubjectHasher | None = None
        self._config_cipher: AESGCM | None = None
        self._destroyed_all = False
        self._tag = lru_cache(maxsize=65536)(self._compute_tag)
        with files.locked():
            if not files.exists(self._name):
                self._create_locked()
            self._state = self._read()
            self._identity = files.identity(self._name)
        self._index()

    @property
    def epoch(self) -> int:
        """The key epoch new writes use."""
        return self._state.epoch

    def data_key(self, prefix: str = "") -> DataKey:
        """The current epoch's key of a subject prefix, created (durably) when missing."""
        return self.data_keys([prefix])[prefix]

    def data_keys(self, prefixes: Iterable[str]) -> dict[str, DataKey]:
        """The current epoch's keys of many prefixes; the missing ones are created with one fsync."""
        with self._lock:
            wanted = set(prefixes)
            if not wanted <= self._current.keys():
                missing = [p for p in wanted if (self.epoch, self._tag(p)) not in self._by_tag]
                if missing:
                    self._create_keys(missing)  # re-indexes: self._current starts empty again
                if len(self._current) + len(wanted) > CACHE_SIZE:
                    self._current = {}
                self._current.update((p, self.key(self._by_tag[(self.epoch, self._tag(p))])) for p in wanted)
            current = self._current
            return {p: current[p] for p in wanted}

    def key(self, key_id: int) -> DataKey:
        """The data key a value names.

        Raises:
            KeyDestroyedError: the key was destroyed (its values are erased).
            UnknownKeyError: this keyring never had it.
        """
        with self._lock:
            cached = self._cache.get(key_id)
            if cached is not None:
                self._cache.move_to_end(key_id)
                return cached
            record = self._record(key_id)
            key = DataKey(key_id, self._unwrap(record))
            self._cache[key_id] = key
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return key

    def epoch_of(self, key_id: int) -> int:
        with self._lock:
            return self._record(key_id).epoch

    def rotate(self) -> int:
        """Starts a new epoch for new writes, at once; returns it. Older epochs stay readable."""
        with self._lock, self._files.locked():
            self._sync_locked()
            fault = failpoints.hit(ROTATE_FAILPOINT)
            self._append_locked([keyfile.epoch_record(self.epoch + 1)])
            failpoints.after(ROTATE_FAILPOINT, fault)
            return self.epoch

    def destroy_prefix(self, prefix: str) -> list[int]:
        """Crypto-shredding: destroys every epoch's key of a subject prefix; returns their ids."""
        tag = self._tag(prefix)
        return self._destroy(lambda r: r.purpose == DATA and r.tag == tag)

    def retire_epochs_before(self, epoch: int) -> list[int]:
        """Destroys the data keys of epochs older than `epoch`, once their values were re-encrypted."""
        if epoch > self.epoch:
            raise ValueError(f"epoch {epoch} is newer than the current epoch {self.epoch}")
        return self._destroy(lambda r: r.purpose == DATA and r.epoch < epoch)

    def rotation_keys(self) -> list[tuple[bytes, bytes, bytes, bytes]]:
        """(old key_ref, old key, new key_ref, new key) for every live data key of an epoch older than the
        current one, the new key being the current epoch's key of the same subject prefix (created when
        missing): what the compaction job re-encrypts with before `retire_epochs_before`."""
        with self._lock:
            self.refresh()
            old = [r for r in self._state.keys.values() if r.purpose == DATA and r.epoch < self.epoch]
            missing = sorted({r.tag for r in old if (self.epoch, r.tag) not in self._by_tag})
            if missing:
                self._create_tagged(missing)
            out = []
            for record in old:
                new = self.key(self._by_tag[(self.epoch, record.tag)])
                out.append((key_ref(record.key_id), self._unwrap(record), new.ref, self._unwrap(self._record(new.key_id))))
            return out

    def subject_hasher(self) -> SubjectHasher:
        """Keyed hashes with this stream's subject key (partition values of protected subjects)."""
        with self._lock:
            if self._hasher is None:
                self._hasher = SubjectHasher(self._subject_key())
            return self._hasher

    def seal_config(self, name: str, payload: bytes) -> bytes:
        """Seals a record of the stream's own (a consumer's config, whose filters name subjects) with the
        config key: HKDF of the subject key, so, like the partition values, it outlives rotations (a
        config is rewritten only when it changes, and must open after older epochs are destroyed).
        Layout: version ‖ 12-byte nonce ‖ ciphertext ‖ tag; bound to the stream and `name`."""
        nonce = self._nonces.one()
        return bytes([CONFIG_VERSION]) + nonce + self._config_aead().encrypt(nonce, payload, self._config_aad(name))

    def open_config(self, name: str, value: bytes) -> bytes:
        """Raises ValueAuthenticationError for a value that is not `name`'s, KeyDestroyedError when the
        stream's keys are gone."""
        if len(value) < 1 + NONCE_SIZE + 16 or value[0] != CONFIG_VERSION:
            raise ValueAuthenticationError("not a sealed config of a known layout")
        try:
            nonce, sealed = value[1 : 1 + NONCE_SIZE], value[1 + NONCE_SIZE :]
            return self._config_aead().decrypt(nonce, sealed, self._config_aad(name))
        except InvalidTag:
            raise ValueAuthenticationError("a sealed config failed authentication") from None

    def _config_aad(self, name: str) -> bytes:
        return f"{self.stream_id}:config:{name}".encode()

    def _config_aead(self) -> AESGCM:
        with self._lock:
            if self._config_cipher is None:
                info = b"jetlake stream configs " + self.stream_id.encode()
                key = HKDF(hashes.SHA256(), DATA_KEY_SIZE, None, info).derive(self._subject_key())
                self._config_cipher = AESGCM(key)
            return self._config_cipher

    def _subject_key(self) -> bytes:
        if self._destroyed_all:
            raise KeyDestroyedError(0)
        record = next((r for r in self._state.keys.values() if r.purpose == SUBJECT_HASH), None)
        if record is None:
            raise KeyringCorruptError(f"{self._path} has no subject key")
        return self._unwrap(record)

    def sql_keys(self) -> list[tuple[bytes, bytes]]:
        """(key_ref, key) of every live data key, for a key holder's SQL session (never written down)."""
        with self._lock:
            self.refresh()
            return [(key_ref(r.key_id), self._unwrap(r)) for r in self._state.keys.values() if r.purpose == DATA]

    def refresh(self) -> None:
        """Picks up what another process changed (new keys, rotation, destruction)."""
        with self._lock, self._files.locked():
            self._sync_locked()

    def seal_batch(self, field: str, seqs: Sequence[int], subjects: Sequence[str],
                   payloads: Payloads) -> pa.BinaryArray:
        """Seals one field of many messages, each with its subject's key (see cipher.py)."""
        prefixes = [key_prefix(s, self.key_tokens) for s in subjects] if self.key_tokens else None
        keys = self.data_keys(set(prefixes) if prefixes is not None else [""])
        per_row = keys[""] if prefixes is None else [keys[p] for p in prefixes]
        aads = associated_data_batch(self.stream_id, seqs, field, None if field == SUBJECT else subjects)
        return seal_batch(per_row, self._nonces.take(len(payloads)), payloads, aads)

    def seal_rows(self, first_seq: int, subjects: Sequence[str],
                  fields: dict[str, Sequence[bytes | None]]) -> dict[str, list[bytes | None]]:
        """Seals the fields of a few consecutive messages value by value, for a small group that builds
        no Arrow array (a single publish): the layout of `seal_batch`, a None payload stays None.

        One key lookup per row and one nonce hand-out serve every field: per value, what is left is
        its associated data and one `encrypt` (a single publish paid a key lookup and a nonce lock per field).
        """
        keys = self._row_keys(subjects)
        nonces = self._nonces.take_bytes(sum(len(values) - values.count(None) for values in fields.values()))
        at = 0
        out: dict[str, list[bytes | None]] = {}
        for field, payloads in fields.items():
            sealed: list[bytes | None] = []
            for i, payload in enumerate(payloads):
                if payload is None:
                    sealed.append(None)
                    continue
                nonce = nonces[at : at + NONCE_SIZE]
                at += NONCE_SIZE
                aad = associated_data(self.stream_id, first_seq + i, field, "" if field == SUBJECT else subjects[i])
                sealed.append(seal(keys[i], nonce, payload, aad))
            out[field] = sealed
        return out

    def _row_keys(self, subjects: Sequence[str]) -> list[DataKey]:
        """The current key of each subject; the current epoch's keys are read without the lock (a
        rotation or a destruction replaces `_current` whole, as `data_keys` would see it too)."""
        if not self.key_tokens:
            key = self._current.get("")
            return [key if key is not None else self.data_key("")] * len(subjects)
        prefixes = [key_prefix(s, self.key_tokens) for s in subjects]
        keys = self.data_keys(set(prefixes))
        return [keys[p] for p in prefixes]

    def open_batch(self, field: str, seqs: Sequence[int], subjects: Sequence[str] | None,
                   values: Payloads) -> OpenedBatch:
        """Opens one field of many messages; failures are reported per message."""
        aads = associated_data_batch(self.stream_id, seqs, field, None if field == SUBJECT else subjects)
        return open_batch(values, aads, self.key)

    def seal_one(self, field: str, seq: int, subject: str, payload: bytes) -> bytes:
        key = self.data_key(key_prefix(subject, self.key_tokens))
        aad = associated_data(self.stream_id, seq, field, "" if field == SUBJECT else subject)
        return seal(key, self._nonces.one(), payload, aad)

    def open_one(self, field: str, seq: int, subject: str | None, value: bytes) -> bytes:
        """Raises KeyDestroyedError, UnknownKeyError or ValueAuthenticationError."""
        batch = self.open_batch(field, [seq], None if subject is None else [subject], [value])
        if 0 in batch.errors:
            raise batch.errors[0]
        return batch.values[0] or b""

    def mark_destroyed(self) -> None:
        """The whole stream's keys are gone (stream or account deleted)."""
        with self._lock:
            self._destroyed_all = True
            self._cache.clear()
            self._state = StreamFile(epoch=self._state.epoch)
            self._by_tag.clear()
            self._current = {}
            self._hasher = None
            self._config_cipher = None

    def _record(self, key_id: int) -> KeyRecord:
        record = self._state.keys.get(key_id)
        if record is None and not self._destroyed_all and key_id not in self._state.destroyed:
            try:
                self.refresh()  # another process may have added it
            except KeyDestroyedError:
                pass
            record = self._state.keys.get(key_id)
        if record is not None and record.purpose == DATA:
            return record
        if self._destroyed_all or key_id in self._state.destroyed:
            raise KeyDestroyedError(key_id)
        raise UnknownKeyError(key_id)

    def _unwrap(self, record: KeyRecord) -> bytes:
        try:
            return self._keys.kek.unwrap(record.wrapped, keyfile.key_aad(self.account, self.stream_id, record))
        except InvalidTag:
            raise KeyringCorruptError(f"{self._path}: key {record.key_id} does not unwrap (tampered)") from None

    def _compute_tag(self, prefix: str) -> bytes:
        message = self.stream_id.encode() + b"\x00" + prefix.encode()
        return hmac.digest(self._keys.tag_key, message, "sha256")[: keyfile.TAG_SIZE]

    def _new_record(self, key_id: int, epoch: int, purpose: int, tag: bytes) -> KeyRecord:
        draft = KeyRecord(key_id, epoch, purpose, tag, self._clock.now_ns(), b"")
        wrapped = self._keys.kek.wrap(os.urandom(DATA_KEY_SIZE), keyfile.key_aad(self.account, self.stream_id, draft))
        return KeyRecord(key_id, epoch, purpose, tag, draft.created_ns, wrapped)

    def _next_id(self) -> int:
        return max([0, *self._state.keys, *self._state.destroyed]) + 1

    def _create_locked(self) -> None:
        state = StreamFile(epoch=FIRST_EPOCH)
        state.keys[1] = self._new_record(1, 0, SUBJECT_HASH, self._compute_tag(""))
        self._files.replace(self._name, keyfile.encode_stream_file(self._keys.mac_key, self.stream_id, state))

    def _create_keys(self, prefixes: list[str]) -> None:
        self._create_tagged([self._tag(p) for p in prefixes])

    def _create_tagged(self, tags: list[bytes]) -> None:
        with self._files.locked():
            self._sync_locked()
            missing = [t for t in tags if (self.epoch, t) not in self._by_tag]
            first = self._next_id()
            records = [self._new_record(first + i, self.epoch, DATA, t) for i, t in enumerate(missing)]
            self._append_locked([keyfile.key_record(r) for r in records])

    def _destroy(self, chosen: Callable[[KeyRecord], bool]) -> list[int]:
        with self._lock, self._files.locked():
            self._sync_locked()
            ids = sorted(r.key_id for r in self._state.keys.values() if chosen(r))
            if not ids:
                return []
            now = self._clock.now_ns()
            for key_id in ids:
                del self._state.keys[key_id]
                self._state.destroyed[key_id] = now
                self._cache.pop(key_id, None)
            data = keyfile.encode_stream_file(self._keys.mac_key, self.stream_id, self._state)
            self._files.replace(self._name, data)
            self._state.size = len(data)
            self._identity = self._files.identity(self._name)
            self._index()
            return ids

    def _append_locked(self, records: list[tuple[int, bytes]]) -> None:
        if not records:
            return
        data = keyfile.encode_records(self._keys.mac_key, self.stream_id, records)
        self._files.append(self._name, self._state.size, data)
        self._state = self._read(self._state)
        self._identity = self._files.identity(self._name)
        self._index()

    def _sync_locked(self) -> None:
        if self._destroyed_all:
            raise KeyDestroyedError(0)
        try:
            identity = self._files.identity(self._name)
        except FileNotFoundError:
            self.mark_destroyed()
            raise KeyDestroyedError(0) from None
        if identity == self._identity:
            return
        same_file = identity[0] == self._identity[0] and identity[1] > self._state.size
        start = self._state if same_file else None
        self._state = self._read(start)
        self._identity = identity
        self._index()
        for key_id in [k for k in self._cache if k not in self._state.keys]:
            del self._cache[key_id]

    def _read(self, start: StreamFile | None = None) -> StreamFile:
        return keyfile.parse_stream_file(self._files.read(self._name), self._path, self._keys.mac_key,
                                         self.stream_id, start)

    def _index(self) -> None:
        self._current = {}
        self._by_tag = {(r.epoch, r.tag): r.key_id for r in self._state.keys.values() if r.purpose == DATA}
